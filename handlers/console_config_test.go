package handlers_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/html"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/apitest"
)

// opsOfKind counts the node's operations of a kind through the API.
func opsOfKind(t *testing.T, s *apitest.Server, nodeID, kind string) int {
	t.Helper()
	var ops struct {
		Operations []struct {
			OperationID string `json:"operation_id"`
		} `json:"operations"`
	}
	s.Admin(t, "GET", "/api/v1/node-operations?kind="+kind+"&target_id="+url.QueryEscape(nodeID), nil, http.StatusOK, &ops)
	return len(ops.Operations)
}

// redirected posts a form that must be answered 303 and answers where to.
func (u *consoleUser) redirected(path string, form url.Values) string {
	u.t.Helper()
	res := u.send(http.MethodPost, path, form)
	if res.StatusCode != http.StatusSeeOther {
		u.t.Fatalf("POST %s: status %d:\n%s", path, res.StatusCode, u.read(res).raw)
	}
	res.Body.Close()
	return res.Header.Get("Location")
}

// noMarkupFrom asserts that the page holds none of the hostile markup as
// elements.
func noMarkupFrom(t *testing.T, a answer) {
	t.Helper()
	require.Empty(t, findAll(a.doc, func(n *html.Node) bool { return n.Data == "img" && attr(n, "src") == "x" }))
	require.Empty(t, findAll(a.doc, func(n *html.Node) bool { return n.Data == "script" && attr(n, "src") == "" }))
	require.NotContains(t, a.raw, "<img src=x")
}

func TestConsoleConfig(t *testing.T) {
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		u := signIn(t, s)
		boot, sess := inviteAndEnroll(t, s)
		nodePath := "/console/nodes/" + boot.NodeID
		configPath := nodePath + "/config"
		const hostile = `<img src=x onerror=alert(1)>`

		// A page link that no listing answered: a 400 page, whatever the
		// bytes (NUL and non-UTF-8 ones never reach the database).
		for _, bad := range []string{"%00", "%ff", "a%20b"} {
			require.Equal(t, http.StatusBadRequest, u.get("/console/config/lagging?before="+bad).status, bad)
		}

		page := u.get(nodePath)
		require.Equal(t, http.StatusOK, page.status)
		page.one(t, "config-none")
		require.Equal(t, "none", text(page.one(t, "config-verdict")))
		require.Empty(t, byTestID(page.doc, "config-clear-form"), "nothing to clear")
		hidden := page.form(t, "config-form")
		require.True(t, strings.HasPrefix(hidden.Get("request_id"), "console:"))

		t.Run("InvalidJSONInline", func(t *testing.T) {
			bad := u.post(configPath, with(hidden, "format", "app/v1", "document", `{"port": 80,}`))
			require.Equal(t, http.StatusUnprocessableEntity, bad.status)
			require.Contains(t, text(bad.one(t, "document-error")), "Not valid JSON")
			require.Equal(t, `{"port": 80,}`, text(bad.one(t, "config-document-input")), "the document is kept")
			require.Equal(t, "true", attr(bad.one(t, "config-document-input"), "aria-invalid"))
			// The domain's own rules, on the field they name.
			noFormat := u.post(configPath, with(hidden, "format", "", "document", `{"port": 80}`))
			require.Equal(t, http.StatusUnprocessableEntity, noFormat.status, noFormat.raw)
			require.NotEmpty(t, text(noFormat.one(t, "format-error")))
			require.Zero(t, opsOfKind(t, s, boot.NodeID, "node.configure"), "nothing recorded")
		})

		var opID string
		t.Run("SetIsOneOperation", func(t *testing.T) {
			form := with(hidden, "format", "app/v1", "document", `{"greeting": "`+strings.ReplaceAll(hostile, `"`, `\"`)+`", "port": 80}`)
			first := u.redirected(configPath, form)
			require.True(t, strings.HasPrefix(first, nodePath+"?configured="), first)
			second := u.redirected(configPath, form)
			require.Equal(t, first, second, "a double submit lands on the same operation")
			require.Equal(t, 1, opsOfKind(t, s, boot.NodeID, "node.configure"))
			opID = strings.TrimPrefix(first, nodePath+"?configured=")

			after := u.get(first)
			require.Contains(t, text(after.one(t, "flash")), opID)
			require.Equal(t, "1", text(after.one(t, "config-revision")))
			require.Equal(t, "app/v1", text(after.one(t, "config-format")))
			require.Equal(t, "/console/operations/"+opID, attr(after.one(t, "config-operation"), "href"))
			hash := after.one(t, "config-hash")
			require.Len(t, attr(hash, "title"), 64, "the full hash in the title")
			require.True(t, strings.HasPrefix(attr(hash, "title"), strings.TrimSuffix(text(hash), "…")))
			require.Contains(t, text(after.one(t, "config-document")), hostile, "agent-bound text shown as text")
			require.Equal(t, "none", text(after.one(t, "config-verdict")))
			require.Equal(t, "app/v1", attr(after.one(t, "config-format-input"), "value"), "the form starts from the current format")
			noMarkupFrom(t, after)
		})

		t.Run("VerdictAndLagging", func(t *testing.T) {
			var polled api.CommandsResponse
			s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=5", nil, sess.SessionToken, http.StatusOK, &polled)
			require.NotNil(t, polled.Config)
			postConfigReport(t, s, sess.SessionToken, "c-rep-1", 1, polled.Config.Hash, api.ConfigApplied, "")
			page := u.get(nodePath)
			require.Equal(t, "applied", text(page.one(t, "config-verdict")))
			require.Equal(t, "no", text(page.one(t, "config-lagging")))
			op := u.get("/console/operations/" + opID)
			readable := op.one(t, "readable-result")
			require.Contains(t, text(readable), "applied")
			require.Equal(t, "1", text(op.one(t, "evidence-revision")))

			// Revision 2 fails on the node, with a message it wrote.
			form := with(u.get(nodePath).form(t, "config-form"), "format", "app/v1", "document", `{"port": 81}`)
			u.redirected(configPath, form)
			s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=0", nil, sess.SessionToken, http.StatusOK, &polled)
			require.Equal(t, int64(2), polled.Config.Revision)
			postConfigReport(t, s, sess.SessionToken, "c-rep-2", 2, polled.Config.Hash, api.ConfigFailed, hostile)
			page = u.get(nodePath)
			require.Equal(t, "failed", text(page.one(t, "config-verdict")))
			require.Equal(t, hostile, text(page.one(t, "config-message")))
			require.Contains(t, text(page.one(t, "config-lagging")), "yes")
			require.Equal(t, "1", text(page.one(t, "config-applied-revision")))
			noMarkupFrom(t, page)

			overview := u.get("/console/")
			lag := overview.one(t, "config-lagging")
			require.Contains(t, text(lag), "1 nodes lagging")
			link := findAll(lag, func(n *html.Node) bool { return n.Data == "a" })[0]
			list := u.get(attr(link, "href"))
			require.Equal(t, http.StatusOK, list.status)
			row := list.one(t, "lagging-"+boot.NodeID)
			require.Equal(t, nodePath, attr(byTestID(row, "lagging-node-link")[0], "href"))
			require.Equal(t, "failed", text(byTestID(row, "config-verdict")[0]))
			require.Equal(t, "1 lagging", text(list.one(t, "lagging-count")))
		})

		t.Run("ClearBehindConfirmation", func(t *testing.T) {
			page := u.get(nodePath)
			clear := page.form(t, "config-clear-form")
			unticked := u.post(configPath+"/clear", clear)
			require.Equal(t, http.StatusUnprocessableEntity, unticked.status)
			unticked.one(t, "clear-confirm-error")
			require.Equal(t, "2", text(unticked.one(t, "config-revision")))

			loc := u.redirected(configPath+"/clear", with(clear, "confirm", "yes"))
			again := u.redirected(configPath+"/clear", with(clear, "confirm", "yes"))
			require.Equal(t, loc, again, "one operation")
			after := u.get(loc)
			require.Equal(t, "3", text(after.one(t, "config-revision")))
			after.one(t, "config-cleared")
			require.Empty(t, byTestID(after.doc, "config-clear-form"))
		})

		t.Run("ConcurrentDoubleSubmitIsOneOperation", func(t *testing.T) {
			before := opsOfKind(t, s, boot.NodeID, "node.configure")
			form := with(u.get(nodePath).form(t, "config-form"), "format", "app/v1", "document", `{"port": 82}`)
			var wg sync.WaitGroup
			locs := make([]string, 2)
			for i := range locs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res := u.send(http.MethodPost, configPath, form)
					res.Body.Close()
					if res.StatusCode == http.StatusSeeOther {
						locs[i] = res.Header.Get("Location")
					}
				}()
			}
			wg.Wait()
			require.NotEmpty(t, locs[0])
			require.Equal(t, locs[0], locs[1], "both land on the one operation")
			require.Equal(t, before+1, opsOfKind(t, s, boot.NodeID, "node.configure"))
		})

		t.Run("SealedValuesNeverShown", func(t *testing.T) {
			const secret = "db-pass-4c1f9e77"
			form := u.get(nodePath).form(t, "config-form")
			// Sealed by the same administrator for the form's request id
			// (the console's user is the API token's).
			handle := sealFor(t, s, s.AdminToken, form.Get("request_id"), boot.NodeID, "/document/password", secret)
			loc := u.redirected(configPath, with(form, "format", "app/v1", "document", `{"password": "`+handle+`", "port": 83}`))
			page := u.get(loc)
			require.Contains(t, text(page.one(t, "config-document")), `"[sealed]"`)
			require.NotContains(t, page.raw, secret)
			require.NotContains(t, page.raw, handle, "the stored document holds the value, shown masked")
			var polled api.CommandsResponse
			s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=5", nil, sess.SessionToken, http.StatusOK, &polled)
			require.Contains(t, string(polled.Config.Document), secret, "only the node receives it")
			opPage := u.get("/console/operations/" + strings.TrimPrefix(loc, nodePath+"?configured="))
			require.NotContains(t, opPage.raw, secret)
		})

		t.Run("RetiredRefused", func(t *testing.T) {
			form := with(u.get(nodePath).form(t, "config-form"), "format", "app/v1", "document", `{}`)
			s.Admin(t, http.MethodPost, "/api/v1/nodes/"+boot.NodeID+"/retire", map[string]any{}, http.StatusOK, nil)
			refused := u.post(configPath, form)
			require.Equal(t, http.StatusGone, refused.status, refused.raw)
			require.NotEmpty(t, text(refused.one(t, "flash")))
			require.Empty(t, byTestID(refused.doc, "config-form"))
		})
	})
}

func TestConsoleDiagnose(t *testing.T) {
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		u := signIn(t, s)
		const hostile = `<img src=x onerror=alert(1)>`

		t.Run("CapabilityMissing", func(t *testing.T) {
			legacy, _ := inviteAndEnroll(t, s) // facts without a list
			page := u.get("/console/nodes/" + legacy.NodeID)
			require.Contains(t, text(page.one(t, "capabilities")), "read as commands.v1 + config.v1")
			page.one(t, "diagnose-unsupported")
			fs := findAll(page.one(t, "diagnose-form-clock"), func(n *html.Node) bool { return n.Data == "fieldset" })
			require.Len(t, fs, 1)
			_, disabled := attrOK(fs[0], "disabled")
			require.True(t, disabled, "the forms are disabled")
			// Posted anyway: refused, said so, nothing recorded.
			refused := u.post("/console/nodes/"+legacy.NodeID+"/diagnose", page.form(t, "diagnose-form-clock"))
			require.Equal(t, http.StatusConflict, refused.status, refused.raw)
			require.Contains(t, text(refused.one(t, "diagnose-error")), "capability_missing")
			require.Contains(t, text(refused.one(t, "diagnose-error")), "diag.v1")
			require.Zero(t, opsOfKind(t, s, legacy.NodeID, "node.diagnose"))
		})

		t.Run("EnrollingNotReported", func(t *testing.T) {
			var boot api.Bootstrap
			s.Admin(t, "POST", "/api/v1/nodes/invitations", map[string]any{"rental_id": apitest.RandomID("r"), "generation": 1}, http.StatusCreated, &boot)
			page := u.get("/console/nodes/" + boot.NodeID)
			require.Contains(t, text(page.one(t, "capabilities")), "not reported yet")
			page.one(t, "diagnose-unknown")
		})

		var boot api.Bootstrap
		s.Admin(t, "POST", "/api/v1/nodes/invitations", map[string]any{"rental_id": apitest.RandomID("r"), "generation": 1}, http.StatusCreated, &boot)
		facts := agentFacts()
		facts.Capabilities = []string{api.CapCommands, api.CapConfig, api.CapDiag}
		var sess api.EnrollResponse
		s.JSON(t, "POST", "/agent/v1/enroll", api.EnrollRequest{NodeID: boot.NodeID, Generation: 1,
			EnrollmentToken: boot.EnrollmentToken, AgentVersion: "0.0.0-test", Facts: facts}, "", http.StatusOK, &sess)
		nodePath := "/console/nodes/" + boot.NodeID
		diagPath := nodePath + "/diagnose"

		t.Run("BadInputInline", func(t *testing.T) {
			page := u.get(nodePath)
			require.Equal(t, "commands.v1, config.v1, diag.v1", text(page.one(t, "capabilities")))
			require.Empty(t, byTestID(page.doc, "diagnose-unsupported"))
			connect := page.form(t, "diagnose-form-connect")
			require.Equal(t, "connect", connect.Get("action"))

			bad := u.post(diagPath, with(connect, "host", "not a host", "port", "70000", "timeout_seconds", "30"))
			require.Equal(t, http.StatusUnprocessableEntity, bad.status, bad.raw)
			require.NotEmpty(t, text(bad.one(t, "diag-connect-host-error")))
			require.Contains(t, text(bad.one(t, "diag-connect-port-error")), "65535")
			require.NotEmpty(t, text(bad.one(t, "diag-connect-timeout_seconds-error")))
			require.Equal(t, "not a host", attr(bad.one(t, "diag-connect-host"), "value"), "values kept")
			require.Equal(t, "true", attr(bad.one(t, "diag-connect-port"), "aria-invalid"))
			require.Empty(t, byTestID(bad.doc, "diag-resolve-names-error"), "only the submitted form shows errors")
			for _, timeout := range []string{"NaN", "Inf"} {
				bad := u.post(diagPath, with(connect, "host", "127.0.0.1", "port", "9", "timeout_seconds", timeout))
				require.Equal(t, http.StatusUnprocessableEntity, bad.status, timeout)
				require.NotEmpty(t, text(bad.one(t, "diag-connect-timeout_seconds-error")), timeout)
			}

			notNumber := u.post(diagPath, with(connect, "host", "db", "port", "http"))
			require.Equal(t, http.StatusUnprocessableEntity, notNumber.status)
			require.Equal(t, "A whole number.", text(notNumber.one(t, "diag-connect-port-error")))

			resolve := u.post(diagPath, with(page.form(t, "diagnose-form-resolve"), "names", "ok.example\nbad_name!"))
			require.Equal(t, http.StatusUnprocessableEntity, resolve.status)
			require.NotEmpty(t, text(resolve.one(t, "diag-resolve-names-error")))
			disk := u.post(diagPath, with(page.form(t, "diagnose-form-disk"), "paths", "relative/path"))
			require.Equal(t, http.StatusUnprocessableEntity, disk.status)
			require.NotEmpty(t, text(disk.one(t, "diag-disk-paths-error")))
			require.Zero(t, opsOfKind(t, s, boot.NodeID, "node.diagnose"), "nothing recorded")
		})

		t.Run("ConnectEvidence", func(t *testing.T) {
			connect := u.get(nodePath).form(t, "diagnose-form-connect")
			form := with(connect, "host", "127.0.0.1", "port", "9", "timeout_seconds", "2")
			loc := u.redirected(diagPath, form)
			require.True(t, strings.HasPrefix(loc, "/console/operations/"), loc)
			require.Equal(t, loc, u.redirected(diagPath, form), "a double submit is one operation")
			require.Equal(t, 1, opsOfKind(t, s, boot.NodeID, "node.diagnose"))
			opID := strings.TrimSuffix(strings.TrimPrefix(loc, "/console/operations/"), "?diagnose=1")

			pending := u.get(loc)
			require.Contains(t, text(pending.one(t, "flash")), "Diagnose submitted")
			require.Empty(t, byTestID(pending.doc, "readable-result"), "no evidence yet")

			var polled api.CommandsResponse
			s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=5", nil, sess.SessionToken, http.StatusOK, &polled)
			require.Len(t, polled.Commands, 1)
			var payload map[string]any
			require.NoError(t, json.Unmarshal(polled.Commands[0].Payload, &payload))
			require.Equal(t, map[string]any{"action": "connect", "host": "127.0.0.1", "port": float64(9), "timeout_seconds": float64(2)}, payload)
			evidence, err := json.Marshal(api.ConnectEvidence{Action: "connect", Host: "127.0.0.1", Port: 9, TimeoutSeconds: 2,
				LatencyMs: 0.4, Error: hostile})
			require.NoError(t, err)
			s.JSON(t, http.MethodPost, "/agent/v1/results", api.ResultsRequest{Results: []api.Result{{OperationID: opID, Applied: true, Evidence: evidence}}},
				sess.SessionToken, http.StatusOK, nil)

			done := u.get("/console/operations/" + opID)
			done.one(t, "readable-result")
			require.Equal(t, "127.0.0.1:9", text(done.one(t, "evidence-target")))
			require.Equal(t, "refused or unreachable", text(done.one(t, "evidence-result")))
			require.Equal(t, "0.4 ms", text(done.one(t, "evidence-latency")))
			require.Equal(t, hostile, text(done.one(t, "evidence-error")))
			noMarkupFrom(t, done)
		})
	})
}

// attrOK answers an attribute and whether it is present.
func attrOK(n *html.Node, name string) (string, bool) {
	for _, a := range n.Attr {
		if a.Key == name {
			return a.Val, true
		}
	}
	return "", false
}
