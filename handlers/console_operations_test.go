package handlers_test

import (
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/html"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/handlers"
)

// liveConsole is a browser-like client of a real control plane (apitest):
// signed in as its administrator, with the session's CSRF token.
type liveConsole struct {
	t      *testing.T
	s      *apitest.Server
	hc     *http.Client
	cookie string
	csrf   string
}

func newLiveConsole(t *testing.T, s *apitest.Server) *liveConsole {
	t.Helper()
	c := &liveConsole{t: t, s: s, hc: &http.Client{
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
	res := c.send(http.MethodPost, "/console/login", url.Values{"username": {apitest.AdminUsername}, "password": {apitest.AdminPassword}}, nil)
	res.Body.Close()
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	ck := sessionCookie(res)
	require.NotNil(t, ck)
	c.cookie = ck.Value
	_, doc := c.get("/console/tokens")
	n := findAll(doc, func(n *html.Node) bool { return attr(n, "name") == "csrf_token" })
	require.NotEmpty(t, n)
	c.csrf = attr(n[0], "value")
	return c
}

func (c *liveConsole) send(method, path string, form url.Values, headers map[string]string) *http.Response {
	c.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, c.s.URL+path, body)
	require.NoError(c.t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if c.cookie != "" {
		req.AddCookie(&http.Cookie{Name: handlers.SessionCookie, Value: c.cookie})
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	res, err := c.hc.Do(req)
	require.NoError(c.t, err)
	return res
}

// get answers a page's status and parsed document.
func (c *liveConsole) get(path string) (int, *html.Node) {
	c.t.Helper()
	return c.read(c.send(http.MethodGet, path, nil, nil))
}

// raw answers a page's markup (200 required).
func (c *liveConsole) raw(path string) string {
	c.t.Helper()
	res := c.send(http.MethodGet, path, nil, nil)
	defer res.Body.Close()
	require.Equal(c.t, http.StatusOK, res.StatusCode, path)
	b, err := io.ReadAll(res.Body)
	require.NoError(c.t, err)
	return string(b)
}

// post sends a form with the session's CSRF token.
func (c *liveConsole) post(path string, form url.Values) *http.Response {
	c.t.Helper()
	if form == nil {
		form = url.Values{}
	}
	form.Set("csrf_token", c.csrf)
	return c.send(http.MethodPost, path, form, nil)
}

func (c *liveConsole) read(res *http.Response) (int, *html.Node) {
	c.t.Helper()
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	require.NoError(c.t, err)
	require.Equal(c.t, "text/html; charset=utf-8", res.Header.Get("Content-Type"), "%s", raw)
	// Hostile text never reaches a page as markup.
	require.NotContains(c.t, string(raw), "<script>alert")
	require.NotContains(c.t, string(raw), "<img src=x")
	doc, err := html.Parse(strings.NewReader(string(raw)))
	require.NoError(c.t, err)
	return res.StatusCode, doc
}

type consoleOpJSON struct {
	OperationID string `json:"operation_id"`
	RequestID   string `json:"request_id"`
	State       string `json:"state"`
	Cursor      string `json:"cursor"`
}

// submitHost creates a package host through the API's ledger operation and
// answers the operation.
func submitHost(t *testing.T, s *apitest.Server, rid, name, reason string) consoleOpJSON {
	t.Helper()
	var op consoleOpJSON
	s.JSON(t, http.MethodPost, "/api/v1/operations", map[string]any{
		"request_id": rid, "kind": "credential.issue", "reason": reason,
		"operation": map[string]any{"name": name, "families": []string{"nodes"}}, "wait_timeout_ms": 5000,
	}, s.AdminToken, http.StatusCreated, &op)
	require.Equal(t, "succeeded", op.State)
	return op
}

func rowIDs(doc *html.Node) []string {
	var ids []string
	for _, n := range byTestID(doc, "operation-link") {
		ids = append(ids, text(n))
	}
	return ids
}

const hostileText = `<script>alert(1)</script><img src=x onerror=alert(2)>`

func TestConsoleOperations(t *testing.T) {
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		c := newLiveConsole(t, s)

		// Empty state before anything happened.
		status, doc := c.get("/console/operations")
		require.Equal(t, http.StatusOK, status)
		require.Contains(t, text(one(t, doc, "no-operations")), "No operations yet")
		one(t, doc, "operation-filters")

		var ops []consoleOpJSON
		for i := range 5 {
			ops = append(ops, submitHost(t, s, "rid-"+strconv.Itoa(i), "host-"+strconv.Itoa(i), ""))
		}
		evil := submitHost(t, s, "evil-1", "<img src=x onerror=alert(2)>", hostileText)

		t.Run("NewestFirst", func(t *testing.T) {
			status, doc := c.get("/console/operations")
			require.Equal(t, http.StatusOK, status)
			ids := rowIDs(doc)
			require.Equal(t, []string{evil.OperationID, ops[4].OperationID, ops[3].OperationID, ops[2].OperationID, ops[1].OperationID, ops[0].OperationID}, ids)
			require.Empty(t, byTestID(doc, "operations-older"))
		})

		t.Run("KeysetPaging", func(t *testing.T) {
			status, doc := c.get("/console/operations?kind=credential.issue&limit=2")
			require.Equal(t, http.StatusOK, status)
			require.Equal(t, []string{evil.OperationID, ops[4].OperationID}, rowIDs(doc))
			older := attr(one(t, doc, "operations-older"), "href")
			u, err := url.Parse(older)
			require.NoError(t, err)
			require.Equal(t, "credential.issue", u.Query().Get("kind"), "the filters carry over")
			require.Equal(t, "2", u.Query().Get("limit"))
			var seen []string
			seen = append(seen, rowIDs(doc)...)
			for older != "" {
				status, doc = c.get(older)
				require.Equal(t, http.StatusOK, status)
				one(t, doc, "operations-newest")
				seen = append(seen, rowIDs(doc)...)
				older = ""
				if n := byTestID(doc, "operations-older"); len(n) == 1 {
					older = attr(n[0], "href")
				}
			}
			require.Len(t, seen, 6, "every operation once: %v", seen)
		})

		t.Run("Filters", func(t *testing.T) {
			// The form sends every field, empty ones included.
			q := url.Values{"state": {""}, "kind": {""}, "family": {""}, "request_id": {"rid-3"}, "operation_id": {""},
				"parent": {""}, "target_kind": {""}, "target_id": {""}, "package_host_id": {""}, "limit": {""}}
			status, doc := c.get("/console/operations?" + q.Encode())
			require.Equal(t, http.StatusOK, status)
			require.Equal(t, []string{ops[3].OperationID}, rowIDs(doc))
			require.Equal(t, "rid-3", attr(one(t, doc, "filter-request_id"), "value"), "the form keeps its values")

			for _, f := range []url.Values{
				{"operation_id": {ops[1].OperationID}},
				{"state": {"succeeded"}, "request_id": {"rid-1"}},
				{"family": {"credentials"}, "request_id": {"rid-1"}},
				{"target_kind": {"package_host"}, "request_id": {"rid-1"}},
			} {
				status, doc := c.get("/console/operations?" + f.Encode())
				require.Equal(t, http.StatusOK, status, f.Encode())
				require.Equal(t, []string{ops[1].OperationID}, rowIDs(doc), f.Encode())
			}
			status, doc = c.get("/console/operations?state=failed")
			require.Equal(t, http.StatusOK, status)
			require.Contains(t, text(one(t, doc, "no-operations")), "No matching operations")
			one(t, doc, "filter-clear")
		})

		t.Run("BadFilterInline", func(t *testing.T) {
			for _, q := range []string{"state=exploded", "request_id=has%20space", "limit=9999", "before=abc"} {
				status, doc := c.get("/console/operations?" + q)
				require.Equal(t, http.StatusBadRequest, status, q)
				msg := text(one(t, doc, "filter-error"))
				require.Contains(t, msg, "query parameter", q)
				one(t, doc, "operation-filters")
				require.Empty(t, byTestID(doc, "operation-row"))
			}
		})

		t.Run("DetailEscapes", func(t *testing.T) {
			status, doc := c.get("/console/operations/" + evil.OperationID)
			require.Equal(t, http.StatusOK, status)
			require.Equal(t, evil.OperationID, text(one(t, doc, "operation-id")))
			require.Equal(t, "evil-1", text(one(t, doc, "operation-request-id")))
			require.Equal(t, hostileText, text(one(t, doc, "operation-reason")))
			require.Contains(t, text(one(t, doc, "operation-body")), `"name": "<img src=x onerror=alert(2)>"`)
			require.Contains(t, text(one(t, doc, "operation-result")), `"generation": 1`)
			require.Equal(t, "succeeded", attr(one(t, doc, "state-badge"), "data-state"))
			require.Empty(t, byTestID(doc, "cancel-form"), "an ended operation cannot be cancelled")
			var types []string
			for _, n := range byTestID(doc, "event-type") {
				types = append(types, text(n))
			}
			require.Equal(t, "submitted", types[0])
			require.Equal(t, "succeeded", types[len(types)-1])
		})

		t.Run("Unknown", func(t *testing.T) {
			status, doc := c.get("/console/operations/op_nope")
			require.Equal(t, http.StatusNotFound, status)
			one(t, doc, "error-page")
		})
	})
}

func TestConsoleCancelOperation(t *testing.T) {
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		c := newLiveConsole(t, s)
		// A command for a node that has not polled stays pending.
		boot, sess := inviteAndEnroll(t, s)
		submit := func(rid string) string {
			var op consoleOpJSON
			s.Admin(t, http.MethodPost, "/api/v1/operations", map[string]any{"request_id": rid, "kind": "node.prepare_image",
				"targets": []any{map[string]any{"kind": "node", "id": boot.NodeID}}, "operation": map[string]any{"image": "busybox:1"}},
				http.StatusCreated, &op)
			require.Equal(t, "pending", op.State)
			return op.OperationID
		}
		id := submit("cancel-me")
		status, doc := c.get("/console/operations/" + id)
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, "pending", attr(one(t, doc, "state-badge"), "data-state"))
		summary := one(t, doc, "operation-summary")
		require.Equal(t, "/api/v1/operations/"+id+"/watch", attr(summary, "data-watch"), "a live page follows the API's watch")
		one(t, doc, "cancel-form")

		// The console session reads the watch stream the page follows.
		res := c.send(http.MethodGet, "/api/v1/operations/"+id+"/watch", nil, nil)
		require.Equal(t, http.StatusOK, res.StatusCode)
		require.Equal(t, "text/event-stream", res.Header.Get("Content-Type"))
		res.Body.Close()

		t.Run("ReasonTooLong", func(t *testing.T) {
			status, doc := c.read(c.post("/console/operations/"+id+"/cancel", url.Values{"reason": {strings.Repeat("x", 1025)}}))
			require.Equal(t, http.StatusUnprocessableEntity, status)
			require.Contains(t, text(one(t, doc, "cancel-error")), "1024")
			require.Equal(t, "pending", attr(one(t, doc, "state-badge"), "data-state"))
		})

		res = c.post("/console/operations/"+id+"/cancel", url.Values{"reason": {hostileText}})
		res.Body.Close()
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		status, doc = c.get(res.Header.Get("Location"))
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, "Cancellation requested.", text(one(t, doc, "flash")))
		require.Equal(t, "cancelled", attr(one(t, doc, "state-badge"), "data-state"))
		require.Contains(t, text(one(t, doc, "operation-cancel-requested")), hostileText)
		require.Empty(t, byTestID(doc, "cancel-form"))
		require.Empty(t, attr(one(t, doc, "operation-summary"), "data-watch"), "an ended operation is not followed")
		require.Equal(t, "cancelled", text(one(t, doc, "operation-error-code")))

		// The listing shows it under its state, and its parent-less row.
		require.Equal(t, []string{id}, rowIDs(func() *html.Node {
			_, d := c.get("/console/operations?state=cancelled&target_id=" + url.QueryEscape(boot.NodeID))
			return d
		}()))

		t.Run("NodeFailureEscaped", func(t *testing.T) {
			// A node's failure text is stored as the operation's error (the
			// cancelled command above is never delivered).
			id := submit("fail-me")
			var polled api.CommandsResponse
			s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=5", nil, sess.SessionToken, http.StatusOK, &polled)
			require.Len(t, polled.Commands, 1)
			s.JSON(t, http.MethodPost, "/agent/v1/results", api.ResultsRequest{Results: []api.Result{{OperationID: id, Failure: hostileText}}},
				sess.SessionToken, http.StatusOK, nil)
			status, doc := c.get("/console/operations/" + id)
			require.Equal(t, http.StatusOK, status)
			require.Equal(t, "failed", attr(one(t, doc, "state-badge"), "data-state"))
			require.Contains(t, text(one(t, doc, "operation-error-message")), hostileText)
			require.NotEmpty(t, text(one(t, doc, "operation-error-code")))
			_, doc = c.get("/console/operations?state=failed")
			require.Equal(t, []string{id}, rowIDs(doc))
		})
	})
}
