package controlplane_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/agent/core"
	"github.com/nodeward/nodeward/agent/runtime"
	"github.com/nodeward/nodeward/agent/state"
	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/internal/testwait"
	"github.com/nodeward/nodeward/server/controlplane"
)

// startPublicServer is startServer with the public URL bootstraps carry
// set to the address it serves on, so an agent can follow a bootstrap.
func startPublicServer(t *testing.T) (*controlplane.App, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	base := "http://" + ln.Addr().String()
	logs := &apitest.LogBuffer{}
	cfg := controlplane.Config{
		Listen: ln.Addr().String(), PublicURL: base, DataDir: t.TempDir(), ShutdownGrace: 5 * time.Second,
		LogLevel: "info", LogFormat: "text",
	}
	app, err := controlplane.Open(context.Background(), cfg, slog.New(slog.NewTextHandler(logs, nil)))
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Serve(ctx, ln) }()
	t.Cleanup(func() {
		stop()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("server did not stop")
		}
		require.NoError(t, app.Close())
		if t.Failed() {
			t.Logf("server log:\n%s", logs.String())
		}
	})
	return app, base
}

// runAgent runs a real agent in-process with the simulated runtime until
// the test ends; the channel answers how Run returned.
func runAgent(t *testing.T, b api.Bootstrap) <-chan error {
	t.Helper()
	store, err := state.Open(filepath.Join(t.TempDir(), "state"), state.Options{})
	require.NoError(t, err)
	logs := &apitest.LogBuffer{}
	agent, err := core.New(core.Config{
		Store: store, Runtime: runtime.NewSimulated(), Bootstrap: &b, AllowInsecureHTTP: true,
		Labels:  map[string]string{"console": `<b>browser</b>`},
		Version: "0.0.0-test", Logger: slog.New(slog.NewTextHandler(logs, nil)), PollWait: 5 * time.Second,
		RetireGrace: time.Second,
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done, finished := make(chan error, 1), make(chan struct{})
	go func() {
		done <- agent.Run(ctx)
		close(finished)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-finished:
		case <-time.After(30 * time.Second):
			t.Error("agent did not stop")
		}
		_ = store.Close()
		if t.Failed() {
			t.Logf("agent log:\n%s", logs.String())
		}
	})
	return done
}

// pageHas reloads path until the element's text holds want.
func pageHas(ctx context.Context, t *testing.T, url, testid, want string) {
	t.Helper()
	var last string
	testwait.For(t, testid+" shows "+want, 30*time.Second, func() bool {
		do(ctx, t, chromedp.Navigate(url), chromedp.WaitVisible(byTestID("brand")))
		got, err := chromedp.Run(ctx, chromedp.Evaluate[string](
			`(function(){var e=document.querySelector('[data-testid="`+testid+`"]');return e?e.textContent:""})()`))
		require.NoError(t, err)
		last = got
		return strings.Contains(got, want)
	}, func() string { return "last: " + last })
}

func TestConsoleNodesInBrowser(t *testing.T) {
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
	)

	// Invite a node: the bootstrap is shown once, with its copy button.
	do(ctx, t,
		chromedp.Click(byTestID("overview-invite")),
		chromedp.WaitVisible(byTestID("invite-form")),
		chromedp.SendKeys(byTestID("invite-rental"), "rack-4-slot-2"),
		chromedp.SendKeys(byTestID("invite-price"), "0.25"),
		chromedp.Click(byTestID("invite-submit")),
		chromedp.WaitVisible(byTestID("bootstrap-json")),
		chromedp.WaitVisible(chromedp.CSS(`button[data-copy="bootstrap-json"]`)),
	)
	raw := get(ctx, t, chromedp.Value(byTestID("bootstrap-json")))
	var boot api.Bootstrap
	require.NoError(t, json.Unmarshal([]byte(raw), &boot))
	require.NotEmpty(t, boot.EnrollmentToken)
	require.Equal(t, base, boot.ControlPlaneURL)
	require.Contains(t, get(ctx, t, chromedp.Value(byTestID("agent-command"))), "nodeward-agent --state-dir")

	// Reloading does not show it again (the browser re-posts the form, or
	// refuses to without asking; either way no token).
	_, err = chromedp.Run(ctx, chromedp.Reload())
	require.NoError(t, err)
	html := get(ctx, t, chromedp.Evaluate[string](`document.documentElement.outerHTML`))
	require.NotContains(t, html, boot.EnrollmentToken)
	do(ctx, t, chromedp.Navigate(base+"/console/nodes/"+boot.NodeID), chromedp.WaitVisible(byTestID("identity")))
	require.NotContains(t, get(ctx, t, chromedp.Evaluate[string](`document.documentElement.outerHTML`)), boot.EnrollmentToken)

	// A real agent follows the bootstrap; the node turns ready on the list.
	agentDone := runAgent(t, boot)
	pageHas(ctx, t, base+"/console/nodes", "node-"+boot.NodeID, "ready")
	// Its first heartbeat lands a moment after the enrollment.
	pageHas(ctx, t, base+"/console/nodes", "node-"+boot.NodeID, " ago")

	// Issue a command from the node's page and see it applied.
	do(ctx, t,
		chromedp.Click(chromedp.CSS(`[data-testid="node-`+boot.NodeID+`"] a[data-testid="node-link"]`)),
		chromedp.WaitVisible(byTestID("command-form")),
		chromedp.SetValue(byTestID("command-kind"), "prepare_image"),
		chromedp.SendKeys(byTestID("command-payload"), `{"image": "registry.example/app:1"}`),
		chromedp.SendKeys(byTestID("command-opid"), "browser-op-1"),
		chromedp.Click(byTestID("command-submit")),
		chromedp.WaitVisible(byTestID("flash")),
	)
	require.Contains(t, get(ctx, t, chromedp.Text(byTestID("flash"))), "browser-op-1")
	pageHas(ctx, t, base+"/console/nodes/"+boot.NodeID, "command-browser-op-1", "applied")
	// The agent's label is shown as text, not markup.
	require.Contains(t, get(ctx, t, chromedp.Text(byTestID("fact-labels"))), `<b>browser</b>`)

	// Retire it behind the confirmation step.
	do(ctx, t,
		chromedp.Click(byTestID("retire-link")),
		chromedp.WaitVisible(byTestID("retire-form")),
		chromedp.SendKeys(byTestID("retire-reason"), "decommissioned"),
		// Without the box ticked the browser does not submit.
		chromedp.Click(byTestID("retire-submit")),
		chromedp.WaitVisible(byTestID("retire-form")),
	)
	require.Equal(t, "ready", nodeState(t, app, boot.NodeID), "not retired without the confirmation")
	do(ctx, t,
		chromedp.Click(byTestID("retire-confirm-box")),
		chromedp.Click(byTestID("retire-submit")),
		chromedp.WaitVisible(byTestID("flash")),
	)
	require.Contains(t, get(ctx, t, chromedp.Text(byTestID("flash"))), "retired")
	require.Equal(t, "retired", get(ctx, t, chromedp.Text(chromedp.CSS(`.page-header [data-testid="node-state"]`))))
	require.Equal(t, "retired", nodeState(t, app, boot.NodeID))

	// Told it is retired, the agent stops.
	select {
	case err := <-agentDone:
		require.True(t, errors.Is(err, core.ErrRetired), "agent ended with %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("the agent did not stop after its node was retired")
	}
}

func nodeState(t *testing.T, app *controlplane.App, id string) string {
	t.Helper()
	n, err := app.Fleet.Node(context.Background(), id)
	require.NoError(t, err)
	return string(n.State)
}
