package handlers_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/html"

	"github.com/nodeward/nodeward/apitest"
)

// hostForm is the create form as the page rendered it.
func hostForm(t *testing.T, doc *html.Node) url.Values {
	t.Helper()
	form := one(t, doc, "host-create-form")
	rid := findAll(form, func(n *html.Node) bool { return attr(n, "name") == "request_id" })
	require.Len(t, rid, 1)
	return url.Values{"request_id": {attr(rid[0], "value")}}
}

func whoamiStatus(t *testing.T, s *apitest.Server, token string) int {
	t.Helper()
	res, err := http.DefaultClient.Do(s.NewRequest(t, http.MethodGet, "/api/v1/node-operations", nil, token))
	require.NoError(t, err)
	res.Body.Close()
	return res.StatusCode
}

func TestConsolePackageHosts(t *testing.T) {
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		c := newLiveConsole(t, s)
		status, doc := c.get("/console/package-hosts")
		require.Equal(t, http.StatusOK, status)
		one(t, doc, "no-hosts")
		for _, f := range []string{"nodes", "commands", "fleet"} {
			one(t, doc, "host-family-"+f)
		}

		// Create: the token is shown once, and it works.
		form := hostForm(t, doc)
		form.Set("name", hostileText[:40])
		form["families"] = []string{"nodes", "commands"}
		status, doc = c.read(c.post("/console/package-hosts", form))
		require.Equal(t, http.StatusOK, status)
		token := attr(one(t, doc, "host-token"), "value")
		require.NotEmpty(t, token)
		require.Contains(t, text(one(t, doc, "host-token-once")), "will not be shown again")
		require.Equal(t, hostileText[:40], text(one(t, doc, "host-issued-name")))
		require.Equal(t, "1", text(one(t, doc, "host-issued-generation")))
		id := text(one(t, doc, "host-issued-id"))
		require.Equal(t, http.StatusOK, whoamiStatus(t, s, token))

		// The same form sent again (a double click, a resubmit) replays the
		// operation: no second host, and the token is not shown again.
		res0 := c.post("/console/package-hosts", form)
		res0.Body.Close()
		require.Equal(t, http.StatusSeeOther, res0.StatusCode)
		raw := c.raw(res0.Header.Get("Location"))
		require.NotContains(t, raw, token)
		doc, err := html.Parse(strings.NewReader(raw))
		require.NoError(t, err)
		require.Contains(t, text(one(t, doc, "flash")), "not shown again")
		require.Len(t, byTestID(doc, "host-row-name"), 1)

		// The list names the host, never its token.
		raw = c.raw("/console/package-hosts")
		require.NotContains(t, raw, token)
		_, doc = c.get("/console/package-hosts")
		row := one(t, doc, "host-"+id)
		require.Equal(t, "commands, nodes", text(one(t, row, "host-row-families")))
		require.Equal(t, "active", text(one(t, row, "host-status")))

		// The create operation is the ledger's, by the administrator.
		status, doc = c.get("/console/operations?target_id=" + url.QueryEscape(id))
		require.Equal(t, http.StatusOK, status)
		require.Len(t, byTestID(doc, "operation-row"), 1)

		t.Run("RefusedForm", func(t *testing.T) {
			_, doc := c.get("/console/package-hosts")
			form := hostForm(t, doc)
			form.Set("name", "no-families")
			status, doc := c.read(c.post("/console/package-hosts", form))
			require.Equal(t, http.StatusUnprocessableEntity, status)
			require.Contains(t, text(one(t, doc, "host-families-error")), "at least one of")
			require.Equal(t, "no-families", attr(one(t, doc, "host-name"), "value"))

			form = hostForm(t, doc)
			form.Set("name", hostileText[:40])
			form["families"] = []string{"nodes"}
			status, doc = c.read(c.post("/console/package-hosts", form))
			require.Equal(t, http.StatusConflict, status)
			require.NotEmpty(t, text(one(t, doc, "host-name-error")), "a taken name is explained")
		})

		t.Run("NewToken", func(t *testing.T) {
			_, doc := c.get("/console/package-hosts")
			row := one(t, doc, "host-"+id)
			btn := one(t, row, "host-new-token")
			f := btn.Parent
			rid := findAll(f, func(n *html.Node) bool { return attr(n, "name") == "request_id" })
			require.Len(t, rid, 1)
			status, doc := c.read(c.post("/console/package-hosts/"+id+"/tokens", url.Values{"request_id": {attr(rid[0], "value")}}))
			require.Equal(t, http.StatusOK, status)
			next := attr(one(t, doc, "host-token"), "value")
			require.NotEqual(t, token, next)
			require.Equal(t, "2", text(one(t, doc, "host-issued-generation")))
			require.Equal(t, http.StatusOK, whoamiStatus(t, s, next))
			require.Equal(t, http.StatusUnauthorized, whoamiStatus(t, s, token), "the earlier token stopped working")
			token = next
		})

		t.Run("RevokeAsksFirst", func(t *testing.T) {
			status, doc := c.read(c.post("/console/package-hosts/"+id+"/revoke", nil))
			require.Equal(t, http.StatusOK, status)
			confirm := one(t, doc, "host-revoke-confirm")
			require.Equal(t, hostileText[:40], text(one(t, confirm, "host-revoke-name")))
			require.Equal(t, http.StatusOK, whoamiStatus(t, s, token), "not revoked yet")
			rid := findAll(confirm, func(n *html.Node) bool { return attr(n, "name") == "request_id" })
			require.Len(t, rid, 1)

			res := c.post("/console/package-hosts/"+id+"/revoke", url.Values{"confirm": {"yes"}, "request_id": {attr(rid[0], "value")}})
			res.Body.Close()
			require.Equal(t, http.StatusSeeOther, res.StatusCode)
			status, doc = c.get(res.Header.Get("Location"))
			require.Equal(t, http.StatusOK, status)
			require.Contains(t, text(one(t, doc, "flash")), "Revoked the package host")
			require.Equal(t, "revoked", text(one(t, one(t, doc, "host-"+id), "host-status")))
			require.Equal(t, http.StatusUnauthorized, whoamiStatus(t, s, token))
		})

		t.Run("Unknown", func(t *testing.T) {
			status, doc := c.read(c.post("/console/package-hosts/ph_nope/revoke", nil))
			require.Equal(t, http.StatusNotFound, status)
			one(t, doc, "error-page")
		})

		t.Run("CSRF", func(t *testing.T) {
			before := len(byTestID(func() *html.Node { _, d := c.get("/console/package-hosts"); return d }(), "host-row-name"))
			for name, send := range map[string]func() *http.Response{
				"Missing": func() *http.Response {
					return c.send(http.MethodPost, "/console/package-hosts", url.Values{"name": {"x1"}, "families": {"nodes"}}, nil)
				},
				"OtherOrigin": func() *http.Response {
					return c.send(http.MethodPost, "/console/package-hosts", url.Values{"name": {"x2"}, "families": {"nodes"}, "csrf_token": {c.csrf}},
						map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"})
				},
			} {
				res := send()
				res.Body.Close()
				require.Equal(t, http.StatusForbidden, res.StatusCode, name)
			}
			for _, path := range []string{"/console/package-hosts/" + id + "/tokens", "/console/package-hosts/" + id + "/revoke", "/console/operations/op_x/cancel"} {
				res := c.send(http.MethodPost, path, url.Values{"confirm": {"yes"}}, nil)
				res.Body.Close()
				require.Equal(t, http.StatusForbidden, res.StatusCode, path)
			}
			_, doc := c.get("/console/package-hosts")
			require.Len(t, byTestID(doc, "host-row-name"), before, "nothing was created")
		})
	})
}
