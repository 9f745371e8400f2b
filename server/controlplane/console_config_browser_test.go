package controlplane_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
)

// TestConsoleConfigInBrowser: with a real agent (in-process, simulated
// runtime) behind a node, set the node's configuration from its page and
// see its verdict turn applied (by reloading the node page: the panel is
// server-rendered, not live), then run a clock diagnose from the node page
// and read its evidence table on the operation page (reloaded until the
// node has answered).
func TestConsoleConfigInBrowser(t *testing.T) {
	app, base := startPublicServer(t)
	_, err := app.Auth.CreateAdmin(context.Background(), "ada", "correct horse battery staple")
	require.NoError(t, err)
	ctx := browser(t)
	ctx, cancel := context.WithTimeout(ctx, 120*time.Second)
	defer cancel()

	do(ctx, t,
		chromedp.Navigate(base+"/console/login"),
		chromedp.WaitVisible(byTestID("login-form")),
		chromedp.SendKeys(byTestID("login-username"), "ada"),
		chromedp.SendKeys(byTestID("login-password"), "correct horse battery staple"),
		chromedp.Click(byTestID("login-submit")),
		chromedp.WaitVisible(byTestID("overview")),
		chromedp.Navigate(base+"/console/nodes/invite"),
		chromedp.WaitVisible(byTestID("invite-form")),
		chromedp.SendKeys(byTestID("invite-rental"), "rack-9"),
		chromedp.Click(byTestID("invite-submit")),
		chromedp.WaitVisible(byTestID("bootstrap-json")),
	)
	var boot api.Bootstrap
	require.NoError(t, json.Unmarshal([]byte(get(ctx, t, chromedp.Value(byTestID("bootstrap-json")))), &boot))
	runAgent(t, boot)
	nodeURL := base + "/console/nodes/" + boot.NodeID
	// The agent's capabilities arrive with its facts (diag.v1 among them).
	pageHas(ctx, t, nodeURL, "capabilities", "diag.v1")
	require.Contains(t, get(ctx, t, chromedp.Text(byTestID("config-none"))), "No configuration is set")

	// Set a configuration: the operation waits for the node's report.
	do(ctx, t,
		chromedp.SendKeys(byTestID("config-format-input"), "app.site/v1"),
		chromedp.SendKeys(byTestID("config-document-input"), `{"listen": 8080, "note": "<b>from the browser</b>"}`),
		chromedp.Click(byTestID("config-submit")),
		chromedp.WaitVisible(byTestID("flash")),
	)
	require.Contains(t, get(ctx, t, chromedp.Text(byTestID("flash"))), "Configuration submitted as operation")
	require.Equal(t, "1", get(ctx, t, chromedp.Text(byTestID("config-revision"))))
	pageHas(ctx, t, nodeURL, "config-verdict", "applied")
	require.Equal(t, "no", get(ctx, t, chromedp.Text(byTestID("config-lagging"))))
	require.Contains(t, get(ctx, t, chromedp.Text(byTestID("config-document"))), "<b>from the browser</b>", "shown as text")
	opURL := get(ctx, t, chromedp.AttributeValue(byTestID("config-operation"), "href")).Value
	pageHas(ctx, t, base+opURL, "readable-result", "applied")

	// Invalid JSON stays on the page, on its field.
	do(ctx, t,
		chromedp.Navigate(nodeURL),
		chromedp.WaitVisible(byTestID("config-form")),
		chromedp.SetValue(byTestID("config-document-input"), `{"listen": }`),
		chromedp.Click(byTestID("config-submit")),
		chromedp.WaitVisible(byTestID("document-error")),
	)
	require.Contains(t, get(ctx, t, chromedp.Text(byTestID("document-error"))), "Not valid JSON")

	// Diagnose the clock: the evidence is a table on the operation page.
	do(ctx, t,
		chromedp.Navigate(nodeURL),
		chromedp.WaitVisible(byTestID("diagnose-form-clock")),
		chromedp.Click(byTestID("diagnose-submit-clock")),
		chromedp.WaitVisible(byTestID("operation-summary")),
	)
	loc := get(ctx, t, chromedp.Location())
	require.True(t, strings.HasPrefix(loc, base+"/console/operations/"), loc)
	require.Contains(t, get(ctx, t, chromedp.Text(byTestID("flash"))), "Diagnose submitted")
	pageHas(ctx, t, loc, "readable-result", "Skew range")
	require.Contains(t, get(ctx, t, chromedp.Text(byTestID("evidence-skew-range"))), "ms to")
	require.Equal(t, "Evidence: clock", get(ctx, t, chromedp.Text(chromedp.CSS(`#readable-title`))))

	// At phone width the node page fits the screen.
	do(ctx, t, chromedp.EmulateViewport(375, 800))
	for _, u := range []string{nodeURL, loc, base + "/console/config/lagging", base + "/console/"} {
		do(ctx, t, chromedp.Navigate(u), chromedp.WaitVisible(chromedp.CSS("main h1")))
		width := get(ctx, t, chromedp.Evaluate[[]int](`[document.documentElement.scrollWidth, window.innerWidth]`))
		wide := get(ctx, t, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("body *")).filter(e => e.getBoundingClientRect().right > window.innerWidth).slice(0, 8).map(e => e.tagName + "." + e.className + "#" + (e.getAttribute("data-testid")||""))`))
		require.LessOrEqual(t, width[0], width[1], "%s is wider than the screen: %v", u, wide)
	}
}
