package handlers_test

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/html"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/handlers"
)

// consoleUser is a signed-in administrator driving the console of a real
// server (apitest), the way a browser would: cookie, forms, no redirects
// followed.
type consoleUser struct {
	t      *testing.T
	s      *apitest.Server
	cookie string
	client *http.Client
}

func signIn(t *testing.T, s *apitest.Server) *consoleUser {
	t.Helper()
	return signInAs(t, s, apitest.AdminUsername, apitest.AdminPassword)
}

func signInAs(t *testing.T, s *apitest.Server, username, password string) *consoleUser {
	t.Helper()
	u := &consoleUser{t: t, s: s, client: &http.Client{
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	res := u.send(http.MethodPost, "/console/login", url.Values{"username": {username}, "password": {password}})
	res.Body.Close()
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	for _, c := range res.Cookies() {
		if c.Name == handlers.SessionCookie {
			u.cookie = c.Value
		}
	}
	require.NotEmpty(t, u.cookie)
	return u
}

func (u *consoleUser) send(method, path string, form url.Values) *http.Response {
	u.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, u.s.URL+path, body)
	require.NoError(u.t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if u.cookie != "" {
		req.AddCookie(&http.Cookie{Name: handlers.SessionCookie, Value: u.cookie})
	}
	res, err := u.client.Do(req)
	require.NoError(u.t, err)
	return res
}

// answer is a page as the test reads it: status, headers, raw HTML and
// the parsed document.
type answer struct {
	status int
	header http.Header
	raw    string
	doc    *html.Node
}

func (u *consoleUser) read(res *http.Response) answer {
	u.t.Helper()
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(u.t, err)
	doc, err := html.Parse(strings.NewReader(string(b)))
	require.NoError(u.t, err)
	return answer{status: res.StatusCode, header: res.Header, raw: string(b), doc: doc}
}

func (u *consoleUser) get(path string) answer { return u.read(u.send(http.MethodGet, path, nil)) }

func (u *consoleUser) post(path string, form url.Values) answer {
	return u.read(u.send(http.MethodPost, path, form))
}

// form answers the hidden fields of the form with that data-testid
// (csrf_token, request_id) as a page rendered them.
func (a answer) form(t *testing.T, testid string) url.Values {
	t.Helper()
	forms := byTestID(a.doc, testid)
	require.Len(t, forms, 1, "form %s", testid)
	v := url.Values{}
	for _, in := range findAll(forms[0], func(n *html.Node) bool { return n.Data == "input" && attr(n, "type") == "hidden" }) {
		v.Set(attr(in, "name"), attr(in, "value"))
	}
	require.NotEmpty(t, v.Get("csrf_token"))
	return v
}

func (a answer) one(t *testing.T, testid string) *html.Node {
	t.Helper()
	ns := byTestID(a.doc, testid)
	require.Len(t, ns, 1, "data-testid=%s in:\n%s", testid, a.raw)
	return ns[0]
}

func with(v url.Values, kv ...string) url.Values {
	out := url.Values{}
	for k, vs := range v {
		out[k] = append([]string(nil), vs...)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out.Set(kv[i], kv[i+1])
	}
	return out
}

type nodeList struct {
	Nodes []struct {
		NodeID   string `json:"node_id"`
		RentalID string `json:"rental_id"`
		State    string `json:"state"`
	} `json:"nodes"`
}

func nodesOfRental(t *testing.T, s *apitest.Server, rental string) int {
	t.Helper()
	var l nodeList
	s.Admin(t, "GET", "/api/v1/nodes?limit=500", nil, http.StatusOK, &l)
	n := 0
	for _, x := range l.Nodes {
		if x.RentalID == rental {
			n++
		}
	}
	return n
}

func TestConsoleInvite(t *testing.T) {
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		u := signIn(t, s)
		page := u.get("/console/nodes/invite")
		require.Equal(t, http.StatusOK, page.status)
		hidden := page.form(t, "invite-form")
		require.True(t, strings.HasPrefix(hidden.Get("request_id"), "console:"), hidden.Get("request_id"))

		t.Run("BootstrapShownOnce", func(t *testing.T) {
			rental := apitest.RandomID("rack")
			form := with(hidden, "rental_id", rental, "generation", "1", "shadow_price_usd_per_hour", "0.25",
				"billing_interval_seconds", "3600", "eligible_classes", "batch, gpu", "available_until", "2099-01-01T00:00:00Z")
			first := u.post("/console/nodes/invite", form)
			require.Equal(t, http.StatusOK, first.status, first.raw)
			require.Equal(t, "no-store", first.header.Get("Cache-Control"))
			doc := text(first.one(t, "bootstrap-json"))
			require.Contains(t, doc, `"enrollment_token"`)
			require.Contains(t, text(first.one(t, "shown-once")), "will not be shown again")
			cmd := text(first.one(t, "agent-command"))
			require.Contains(t, cmd, "NODEWARD_AGENT_BOOTSTRAP='")
			require.Contains(t, cmd, "nodeward-agent --state-dir")
			require.Contains(t, cmd, "--allow-insecure-http", "the test server is plain http")
			var token string
			for _, f := range strings.Split(doc, `"`) {
				if strings.Count(f, ".") == 2 && len(f) > 40 {
					token = f
				}
			}
			require.NotEmpty(t, token, "an enrollment token in %s", doc)

			// The same form again (a reload re-posting it, a double
			// click): one operation, and the token is not shown again.
			again := u.post("/console/nodes/invite", form)
			require.Equal(t, http.StatusOK, again.status)
			again.one(t, "already-shown")
			require.NotContains(t, again.raw, token)
			require.Equal(t, 1, nodesOfRental(t, s, rental))
			var ops struct {
				Operations []struct {
					OperationID string `json:"operation_id"`
				} `json:"operations"`
			}
			s.Admin(t, "GET", "/api/v1/node-operations?request_id="+url.QueryEscape(hidden.Get("request_id")), nil, http.StatusOK, &ops)
			require.Len(t, ops.Operations, 1)

			// No page of the console shows the token afterwards.
			list := u.get("/console/nodes")
			require.Contains(t, list.raw, rental)
			require.NotContains(t, list.raw, token)
		})

		t.Run("ConcurrentDoubleSubmitIsOneOperation", func(t *testing.T) {
			rental := apitest.RandomID("rack")
			form := with(u.get("/console/nodes/invite").form(t, "invite-form"), "rental_id", rental, "generation", "1")
			var wg sync.WaitGroup
			shown := make([]bool, 2)
			for i := range shown {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res := u.send(http.MethodPost, "/console/nodes/invite", form)
					b, _ := io.ReadAll(res.Body)
					res.Body.Close()
					shown[i] = strings.Contains(string(b), `data-testid="bootstrap-json"`)
				}()
			}
			wg.Wait()
			require.Equal(t, 1, nodesOfRental(t, s, rental))
			require.True(t, shown[0] != shown[1], "exactly one answer shows the bootstrap: %v", shown)
		})

		t.Run("ValidationInline", func(t *testing.T) {
			bad := u.post("/console/nodes/invite", with(hidden, "rental_id", "", "generation", "x",
				"shadow_price_usd_per_hour", "cheap", "available_until", "tomorrow"))
			require.Equal(t, http.StatusUnprocessableEntity, bad.status)
			require.NotEmpty(t, text(bad.one(t, "generation-error")))
			require.NotEmpty(t, text(bad.one(t, "shadow_price_usd_per_hour-error")))
			// Echoed, escaped, into the form again.
			require.Equal(t, "cheap", attr(bad.one(t, "invite-price"), "value"))
			// Numbers ParseFloat reads but JSON cannot carry.
			for _, price := range []string{"NaN", "Inf", "-Inf"} {
				bad := u.post("/console/nodes/invite", with(hidden, "rental_id", "r", "generation", "1", "shadow_price_usd_per_hour", price))
				require.Equal(t, http.StatusUnprocessableEntity, bad.status, price)
				require.NotEmpty(t, text(bad.one(t, "shadow_price_usd_per_hour-error")), price)
			}

			// The domain's own checks, shown on the form too.
			missing := u.post("/console/nodes/invite", with(u.get("/console/nodes/invite").form(t, "invite-form"), "rental_id", "", "generation", "1"))
			require.Equal(t, http.StatusUnprocessableEntity, missing.status, missing.raw)
			require.NotEmpty(t, text(missing.one(t, "rental_id-error")))

			rental := apitest.RandomID("dup")
			s.Admin(t, "POST", "/api/v1/nodes/invitations", map[string]any{"rental_id": rental, "generation": 1}, http.StatusCreated, nil)
			dup := u.post("/console/nodes/invite", with(u.get("/console/nodes/invite").form(t, "invite-form"), "rental_id", rental, "generation", "1"))
			require.Equal(t, http.StatusConflict, dup.status)
			require.NotEmpty(t, text(dup.one(t, "invite-error")))
		})

		t.Run("CSRFRefused", func(t *testing.T) {
			rental := apitest.RandomID("csrf")
			for _, token := range []string{"", "forged"} {
				res := u.post("/console/nodes/invite", with(hidden, "csrf_token", token, "rental_id", rental, "generation", "1"))
				require.Equal(t, http.StatusForbidden, res.status)
			}
			require.Zero(t, nodesOfRental(t, s, rental))
		})
	})
}

// enrollWith invites a node over the API and enrolls it with these facts.
func enrollWith(t *testing.T, s *apitest.Server, facts api.Facts) api.Bootstrap {
	t.Helper()
	var boot api.Bootstrap
	price := 0.5
	s.Admin(t, "POST", "/api/v1/nodes/invitations", map[string]any{"rental_id": apitest.RandomID("r"), "generation": 1,
		"shadow_price_usd_per_hour": price}, http.StatusCreated, &boot)
	var sess api.EnrollResponse
	s.JSON(t, "POST", "/agent/v1/enroll", api.EnrollRequest{NodeID: boot.NodeID, Generation: 1,
		EnrollmentToken: boot.EnrollmentToken, AgentVersion: "0.0.0-test", Facts: facts}, "", http.StatusOK, &sess)
	s.JSON(t, "POST", "/agent/v1/events", api.EventsRequest{Events: []api.Event{{ID: "hb-1", Kind: "heartbeat",
		ObservedAt: time.Now().UTC(), Facts: &facts}}}, sess.SessionToken, http.StatusOK, nil)
	return boot
}

func TestConsoleNodes(t *testing.T) {
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		u := signIn(t, s)
		empty := u.get("/console/nodes")
		require.Equal(t, http.StatusOK, empty.status)
		require.Contains(t, text(empty.one(t, "no-nodes")), "No nodes yet")

		facts := agentFacts()
		facts.Hostname = `<script>alert("host")</script>`
		facts.Labels = map[string]string{"team": `<img src=x onerror=alert(1)>`}
		ready := enrollWith(t, s, facts)
		var waiting api.Bootstrap
		s.Admin(t, "POST", "/api/v1/nodes/invitations", map[string]any{"rental_id": apitest.RandomID("w"), "generation": 1}, http.StatusCreated, &waiting)

		t.Run("AgentTextIsEscaped", func(t *testing.T) {
			for _, path := range []string{"/console/nodes", "/console/nodes/" + ready.NodeID} {
				page := u.get(path)
				require.Equal(t, http.StatusOK, page.status)
				require.NotContains(t, page.raw, "<script>alert")
				require.NotContains(t, page.raw, "<img src=x")
				require.Empty(t, findAll(page.doc, func(n *html.Node) bool { return n.Data == "img" && attr(n, "src") == "x" }))
				require.Contains(t, page.raw, "&lt;script&gt;")
			}
			detail := u.get("/console/nodes/" + ready.NodeID)
			require.Equal(t, `<script>alert("host")</script>`, text(detail.one(t, "fact-hostname")))
			require.Contains(t, text(detail.one(t, "fact-labels")), `<img src=x onerror=alert(1)>`)
		})

		t.Run("List", func(t *testing.T) {
			page := u.get("/console/nodes")
			row := page.one(t, "node-"+ready.NodeID)
			require.Equal(t, "ready", text(byTestID(row, "node-state")[0]))
			hb := findAll(byTestID(row, "node-heartbeat")[0], func(n *html.Node) bool { return n.Data == "time" })
			require.Len(t, hb, 1)
			_, err := time.Parse(time.RFC3339, attr(hb[0], "title"))
			require.NoError(t, err, "the exact time in the title")
			require.Regexp(t, `^\d+ (s|min) ago$`, text(hb[0]))
			require.Equal(t, "5.0 GiB free", text(byTestID(row, "disk")[0]))
			require.Contains(t, text(row), "$0.5/h")
			wrow := page.one(t, "node-"+waiting.NodeID)
			require.Equal(t, "not reported", text(byTestID(wrow, "disk")[0]))
			require.Contains(t, text(wrow), "unpriced")
		})

		t.Run("Filters", func(t *testing.T) {
			page := u.get("/console/nodes?state=ready")
			page.one(t, "node-"+ready.NodeID)
			require.Empty(t, byTestID(page.doc, "node-"+waiting.NodeID))
			page = u.get("/console/nodes?state=enrolling")
			page.one(t, "node-"+waiting.NodeID)
			require.Empty(t, byTestID(page.doc, "node-"+ready.NodeID))
			page = u.get("/console/nodes?state=retired")
			require.Contains(t, text(page.one(t, "no-nodes")), "No nodes match")
			// A fresh lease is not lapsing.
			page = u.get("/console/nodes?lease=lapsing")
			require.Empty(t, byTestID(page.doc, "node-"+ready.NodeID))

			bad := u.get("/console/nodes?state=%3Cb%3E")
			require.Equal(t, http.StatusBadRequest, bad.status)
			bad.one(t, "nodes-error")
			require.NotContains(t, bad.raw, "<b>")
			bad = u.get("/console/nodes?before=garbage")
			require.Equal(t, http.StatusBadRequest, bad.status)
		})

		t.Run("Paging", func(t *testing.T) {
			for i := 0; i < 50; i++ {
				s.Admin(t, "POST", "/api/v1/nodes/invitations", map[string]any{"rental_id": fmt.Sprintf("page-%02d", i), "generation": 1}, http.StatusCreated, nil)
			}
			seen := map[string]bool{}
			path := "/console/nodes?state=enrolling"
			pages := 0
			for path != "" {
				page := u.get(path)
				require.Equal(t, http.StatusOK, page.status)
				pages++
				for _, a := range byTestID(page.doc, "node-link") {
					require.False(t, seen[text(a)], "node %s on two pages", text(a))
					seen[text(a)] = true
				}
				path = ""
				if older := byTestID(page.doc, "nodes-older"); len(older) == 1 {
					path = attr(older[0], "href")
					require.Contains(t, path, "state=enrolling", "the filter is kept")
				}
			}
			require.Equal(t, 2, pages)
			require.Len(t, seen, 51)
		})

		t.Run("Detail", func(t *testing.T) {
			page := u.get("/console/nodes/" + ready.NodeID)
			require.Equal(t, http.StatusOK, page.status)
			require.Equal(t, ready.NodeID, text(page.one(t, "node-id")))
			page.one(t, "config-none")
			require.Equal(t, "none", text(page.one(t, "config-verdict")))
			page.one(t, "diagnose-unsupported")
			require.NotEmpty(t, byTestID(page.doc, "timeline-entry"), "the invitation and the enrollment are on the timeline")
			page.one(t, "operations")
			missing := u.get("/console/nodes/no-such-node")
			require.Equal(t, http.StatusNotFound, missing.status)
		})

		t.Run("IssueCommand", func(t *testing.T) {
			page := u.get("/console/nodes/" + ready.NodeID)
			hidden := page.form(t, "command-form")
			path := "/console/nodes/" + ready.NodeID + "/commands"

			bad := u.post(path, with(hidden, "kind", "launch_workload", "payload", "{not json", "operation_id", "op-bad"))
			require.Equal(t, http.StatusUnprocessableEntity, bad.status)
			require.NotEmpty(t, text(bad.one(t, "payload-error")))
			require.Equal(t, "{not json", text(bad.one(t, "command-payload")), "the payload is kept")

			opID := apitest.RandomID("op")
			payload := `{"image": "registry.example/app:1"}`
			form := with(hidden, "kind", "prepare_image", "payload", payload, "operation_id", opID)
			first := u.send(http.MethodPost, path, form)
			first.Body.Close()
			if first.StatusCode != http.StatusSeeOther {
				t.Fatalf("status %d: %s", first.StatusCode, u.read(u.send(http.MethodPost, path, form)).raw)
			}
			require.Equal(t, "/console/nodes/"+ready.NodeID+"?command="+opID, first.Header.Get("Location"))
			second := u.send(http.MethodPost, path, form)
			second.Body.Close()
			require.Equal(t, http.StatusSeeOther, second.StatusCode, "a double submit lands on the same command")
			var cmds struct {
				Commands []struct {
					OperationID string `json:"operation_id"`
				} `json:"commands"`
			}
			s.Admin(t, "GET", "/api/v1/nodes/"+ready.NodeID+"/commands", nil, http.StatusOK, &cmds)
			require.Len(t, cmds.Commands, 1)

			after := u.get(first.Header.Get("Location"))
			require.Contains(t, text(after.one(t, "flash")), opID)
			after.one(t, "command-"+opID)
		})

		t.Run("RetireNeedsConfirmation", func(t *testing.T) {
			confirm := u.get("/console/nodes/" + waiting.NodeID + "/retire")
			require.Equal(t, http.StatusOK, confirm.status)
			hidden := confirm.form(t, "retire-form")
			path := "/console/nodes/" + waiting.NodeID + "/retire"

			unticked := u.post(path, with(hidden, "reason", "done"))
			require.Equal(t, http.StatusUnprocessableEntity, unticked.status)
			unticked.one(t, "confirm-error")
			var n struct {
				State string `json:"state"`
			}
			s.Admin(t, "GET", "/api/v1/nodes/"+waiting.NodeID, nil, http.StatusOK, &n)
			require.Equal(t, "enrolling", n.State)

			res := u.send(http.MethodPost, path, with(hidden, "reason", "done", "confirm", "yes"))
			res.Body.Close()
			require.Equal(t, http.StatusSeeOther, res.StatusCode)
			s.Admin(t, "GET", "/api/v1/nodes/"+waiting.NodeID, nil, http.StatusOK, &n)
			require.Equal(t, "retired", n.State)
			page := u.get(res.Header.Get("Location"))
			require.Contains(t, text(page.one(t, "flash")), "retired")
			require.Empty(t, byTestID(page.doc, "node-actions"), "a retired node offers no actions")
			require.Empty(t, byTestID(page.doc, "command-form"))

			// A command form left open elsewhere: refused, and said so.
			hiddenCmd := u.get("/console/nodes/"+ready.NodeID).form(t, "command-form")
			refused := u.post("/console/nodes/"+waiting.NodeID+"/commands", with(hiddenCmd, "kind", "prepare_image",
				"payload", `{"image": "x"}`, "operation_id", apitest.RandomID("op")))
			require.Equal(t, http.StatusGone, refused.status, refused.raw)
			require.NotEmpty(t, text(refused.one(t, "flash")))
		})

		t.Run("ReinviteShowsBootstrapOnce", func(t *testing.T) {
			confirm := u.get("/console/nodes/" + ready.NodeID + "/reinvite")
			hidden := confirm.form(t, "reinvite-form")
			path := "/console/nodes/" + ready.NodeID + "/reinvite"
			unticked := u.post(path, hidden)
			require.Equal(t, http.StatusUnprocessableEntity, unticked.status)
			badTime := u.post(path, with(hidden, "confirm", "yes", "redeemable_through", "soon"))
			require.Equal(t, http.StatusUnprocessableEntity, badTime.status)
			badTime.one(t, "redeemable_through-error")

			first := u.post(path, with(hidden, "confirm", "yes"))
			require.Equal(t, http.StatusOK, first.status, first.raw)
			require.Equal(t, "no-store", first.header.Get("Cache-Control"))
			require.Contains(t, text(first.one(t, "bootstrap-json")), ready.NodeID)
			again := u.post(path, with(hidden, "confirm", "yes"))
			again.one(t, "already-shown")
			require.Empty(t, byTestID(again.doc, "bootstrap-json"))
		})

		t.Run("Overview", func(t *testing.T) {
			page := u.get("/console/")
			require.Equal(t, http.StatusOK, page.status)
			require.Equal(t, "1 ready", text(page.one(t, "state-ready")))
			require.Contains(t, text(page.one(t, "lapsing")), "0")
			require.Equal(t, "/console/nodes?state=ready&lease=lapsing",
				attr(findAll(page.one(t, "lapsing"), func(n *html.Node) bool { return n.Data == "a" })[0], "href"))
			// The invitations, the retirement, the command and the
			// reinvite of this test, all ended in the last hour (the ended
			// states count what ended in it, the open ones what was
			// submitted in it, and the page says so).
			ops := page.one(t, "ops-last-hour")
			require.NotContains(t, text(byTestID(ops, "ops-succeeded")[0]), "0 succeeded")
			require.Contains(t, text(page.one(t, "ops-last-hour-note")), "Succeeded, failed and cancelled: ended in the hour.")
			require.Contains(t, text(page.one(t, "pending-commands")), "1")
			require.Equal(t, "0 nodes lagging their desired configuration", text(page.one(t, "config-lagging")))
		})
	})
}
