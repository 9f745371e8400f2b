package controlplane_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/apitest"
)

// poll waits, in the page, until expression is true.
func poll(ctx context.Context, t *testing.T, expression string) {
	t.Helper()
	_, err := chromedp.Run(ctx, chromedp.Poll[bool](expression, chromedp.WithPollingTimeout(20*time.Second)))
	require.NoError(t, err, "waiting for %s", expression)
}

// TestConsoleOperationsInBrowser: an administrator creates a package host
// and sees its token once, follows an operation live to its end, and
// finds the token's reveal and a seal in the secret audit.
func TestConsoleOperationsInBrowser(t *testing.T) {
	chromiumPath(t)
	s := apitest.Start(t)
	ctx := browser(t)
	base := s.URL

	do(ctx, t,
		chromedp.Navigate(base+"/console/login"),
		chromedp.WaitVisible(byTestID("login-form")),
		chromedp.SendKeys(byTestID("login-username"), apitest.AdminUsername),
		chromedp.SendKeys(byTestID("login-password"), apitest.AdminPassword),
		chromedp.Click(byTestID("login-submit")),
		chromedp.WaitVisible(byTestID("username")),
	)

	// Create a package host: its token is shown once, with a copy button.
	do(ctx, t,
		chromedp.Click(byTestID("nav-package-hosts")),
		chromedp.WaitVisible(byTestID("no-hosts")),
		chromedp.SendKeys(byTestID("host-name"), "deploy-bot"),
		chromedp.Click(byTestID("host-family-nodes")),
		chromedp.Click(byTestID("host-create")),
		chromedp.WaitVisible(byTestID("host-token")),
		chromedp.WaitVisible(chromedp.CSS(`button[data-copy="host-token"]`)),
	)
	token := get(ctx, t, chromedp.Value(byTestID("host-token")))
	require.NotEmpty(t, token)
	require.Contains(t, get(ctx, t, chromedp.Text(byTestID("host-token-once"))), "will not be shown again")
	hostID := get(ctx, t, chromedp.Text(byTestID("host-issued-id")))
	req := s.NewRequest(t, http.MethodGet, "/api/v1/node-operations", nil, token)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode, "the token works")

	// Back on the list the host is named, its token nowhere.
	do(ctx, t, chromedp.Click(byTestID("back-to-hosts")), chromedp.WaitVisible(byTestID("host-table")))
	page := get(ctx, t, chromedp.Evaluate[string](`document.documentElement.outerHTML`))
	require.Contains(t, page, "deploy-bot")
	require.Contains(t, page, hostID)
	require.NotContains(t, page, token)
	do(ctx, t, chromedp.Reload(), chromedp.WaitVisible(byTestID("host-table")))
	require.NotContains(t, get(ctx, t, chromedp.Evaluate[string](`document.documentElement.outerHTML`)), token)

	// An operation followed live: a command for an enrolled node stays
	// pending until the node polls, runs, and answers.
	var boot api.Bootstrap
	s.Admin(t, http.MethodPost, "/api/v1/nodes/invitations", map[string]any{"rental_id": "browser-1", "generation": 1}, http.StatusCreated, &boot)
	free := int64(5 << 30)
	var sess api.EnrollResponse
	s.JSON(t, http.MethodPost, "/agent/v1/enroll", api.EnrollRequest{NodeID: boot.NodeID, Generation: 1,
		EnrollmentToken: boot.EnrollmentToken, AgentVersion: "0.0.0-test",
		Facts: api.Facts{Hostname: "h", OS: "linux", Arch: "amd64", CPUs: 2, MemoryBytes: 1 << 30, DiskFreeBytes: &free,
			AgentVersion: "0.0.0-test", Runtimes: []string{"process"}, ObservedAt: time.Now().UTC().Truncate(time.Second)}},
		"", http.StatusOK, &sess)
	var op struct {
		OperationID string `json:"operation_id"`
		State       string `json:"state"`
	}
	s.Admin(t, http.MethodPost, "/api/v1/operations", map[string]any{"request_id": "browser-cmd", "kind": "node.prepare_image",
		"targets": []any{map[string]any{"kind": "node", "id": boot.NodeID}}, "operation": map[string]any{"image": "busybox:1"}},
		http.StatusCreated, &op)
	require.Equal(t, "pending", op.State)

	do(ctx, t,
		chromedp.Navigate(base+"/console/operations"),
		chromedp.WaitVisible(byTestID("operation-table")),
		chromedp.Click(chromedp.CSS(`a[href="/console/operations/`+op.OperationID+`"]`)),
		chromedp.WaitVisible(byTestID("cancel-form")),
	)
	require.Equal(t, "pending", get(ctx, t, chromedp.Text(byTestID("state-badge"))))
	// operation.js connected to the watch stream.
	poll(ctx, t, `document.querySelector('[data-testid="operation-summary"]').dataset.live === "open"`)

	var polled api.CommandsResponse
	s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=5", nil, sess.SessionToken, http.StatusOK, &polled)
	require.Len(t, polled.Commands, 1)
	poll(ctx, t, `document.querySelector('[data-testid="state-badge"]').dataset.state === "running"`)
	s.JSON(t, http.MethodPost, "/agent/v1/results", api.ResultsRequest{Results: []api.Result{{OperationID: op.OperationID, Applied: true}}},
		sess.SessionToken, http.StatusOK, nil)
	poll(ctx, t, `document.querySelector('[data-testid="state-badge"]').dataset.state === "succeeded"`)
	// The page changed in place: the script appended the events, hid the
	// cancel form and offered a reload.
	do(ctx, t, chromedp.WaitVisible(byTestID("live-reload")), chromedp.WaitNotVisible(byTestID("cancel-form")))
	events := get(ctx, t, chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll('[data-testid="event-type"]')).map(e => e.textContent)`))
	require.Equal(t, "submitted", events[0])
	require.Contains(t, events, "running")
	require.Equal(t, "succeeded", events[len(events)-1])
	do(ctx, t, chromedp.Click(byTestID("live-reload")), chromedp.WaitVisible(chromedp.CSS(`[data-testid="operation-summary"]:not([data-watch])`)))
	require.Equal(t, "succeeded", get(ctx, t, chromedp.Text(byTestID("state-badge"))))

	// The secret audit: the tokens' reveals and a seal, filtered with the
	// form; never a value.
	s.Admin(t, http.MethodPost, "/api/v1/secrets/seal", map[string]any{"request_id": "browser-seal",
		"target": map[string]any{"kind": "node", "id": boot.NodeID}, "field": "/env/A", "value": "browser-secret-value"},
		http.StatusCreated, nil)
	do(ctx, t,
		chromedp.Click(byTestID("nav-secret-audit")),
		chromedp.WaitVisible(byTestID("secret-audit-table")),
	)
	actions := get(ctx, t, chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll('[data-testid="secret-action"]')).map(e => e.textContent)`))
	// The seal, the node's enrollment token revealed to the inviting call,
	// and the host's token revealed to the console.
	require.Equal(t, []string{"seal", "reveal", "reveal"}, actions)
	page = get(ctx, t, chromedp.Evaluate[string](`document.documentElement.outerHTML`))
	require.NotContains(t, page, "browser-secret-value")
	require.NotContains(t, page, token)
	do(ctx, t,
		chromedp.SetValue(byTestID("sfilter-action"), "reveal"),
		chromedp.Click(byTestID("sfilter-apply")),
		chromedp.WaitVisible(byTestID("sfilter-clear")),
	)
	require.True(t, strings.Contains(get(ctx, t, chromedp.Location()), "action=reveal"), "a filtered page has a shareable address")
	actions = get(ctx, t, chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll('[data-testid="secret-action"]')).map(e => e.textContent)`))
	require.Equal(t, []string{"reveal", "reveal"}, actions)

	// At phone width nothing but a table scrolls sideways: the pages fit.
	do(ctx, t, chromedp.EmulateViewport(375, 800))
	for _, path := range []string{"/console/operations", "/console/operations/" + op.OperationID, "/console/package-hosts", "/console/secret-audit", "/console/tokens"} {
		do(ctx, t, chromedp.Navigate(base+path), chromedp.WaitVisible(chromedp.CSS("main h1")))
		width := get(ctx, t, chromedp.Evaluate[[]int](`[document.documentElement.scrollWidth, window.innerWidth]`))
		wide := get(ctx, t, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("body *")).filter(e => e.getBoundingClientRect().right > window.innerWidth).slice(0, 8).map(e => e.tagName + "." + e.className + "#" + (e.getAttribute("data-testid")||""))`))
		require.LessOrEqual(t, width[0], width[1], "%s is wider than the screen: %v", path, wide)
	}
}
