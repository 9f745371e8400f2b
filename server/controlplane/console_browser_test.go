package controlplane_test

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/server/controlplane"
)

// chromiumPath finds Chromium. Outside CI a missing browser skips the
// browser tests; under CI=true it fails them.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("NODEWARD_CHROMIUM"), "/usr/bin/chromium"} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium not found at /usr/bin/chromium (or $NODEWARD_CHROMIUM): CI must run the browser tests")
	}
	t.Skip("chromium not found at /usr/bin/chromium (or $NODEWARD_CHROMIUM): skipping the browser test; install it with `apt-get install chromium`")
	return ""
}

// startServer runs the real control plane in-process on a loopback port
// with a fresh data folder, until the test ends.
func startServer(t *testing.T) (*controlplane.App, string) {
	t.Helper()
	logs := &apitest.LogBuffer{}
	cfg := controlplane.Config{
		Listen: "127.0.0.1:0", DataDir: t.TempDir(), ShutdownGrace: 5 * time.Second,
		LogLevel: "info", LogFormat: "text",
	}
	app, err := controlplane.Open(context.Background(), cfg, slog.New(slog.NewTextHandler(logs, nil)))
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
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
	return app, "http://" + ln.Addr().String()
}

// browser starts a headless Chromium with a fresh profile; the context
// bounds the whole test so it never hangs.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := chromiumPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancelAlloc)
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	t.Cleanup(cancelBrowser)
	require.NoError(t, chromedp.Do(bctx), "start chromium")
	return bctx
}

func byTestID(id string) chromedp.CSS { return chromedp.CSS(`[data-testid="` + id + `"]`) }

// do runs browser steps, failing the test on the first error.
func do(ctx context.Context, t *testing.T, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	require.NoError(t, chromedp.Do(ctx, steps...))
}

// get runs one browser action that answers a value.
func get[T any](ctx context.Context, t *testing.T, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(ctx, a)
	require.NoError(t, err)
	return v
}

func TestConsoleInBrowser(t *testing.T) {
	app, base := startServer(t)
	_, err := app.Auth.CreateAdmin(context.Background(), "ada", "correct horse battery staple")
	require.NoError(t, err)
	ctx := browser(t)

	// An anonymous visit lands on the sign-in form, remembering where it was going.
	do(ctx, t, chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(byTestID("login-form")))
	require.Equal(t, base+"/console/login?next=%2Fconsole%2F", get(ctx, t, chromedp.Location()))

	// Sign in.
	do(ctx, t,
		chromedp.SendKeys(byTestID("login-username"), "ada"),
		chromedp.SendKeys(byTestID("login-password"), "correct horse battery staple"),
		chromedp.Click(byTestID("login-submit")),
		chromedp.WaitVisible(byTestID("overview")),
	)
	require.Equal(t, "ada", get(ctx, t, chromedp.Text(byTestID("username"))))
	require.Equal(t, base+"/console/", get(ctx, t, chromedp.Location()))
	require.Contains(t, get(ctx, t, chromedp.Text(byTestID("empty-fleet"))), "No nodes yet")

	// The stylesheet applied under the CSP: the header has the brand colour.
	bg := get(ctx, t, chromedp.Evaluate[string](
		`getComputedStyle(document.querySelector("header.topbar")).backgroundColor`))
	require.Equal(t, "rgb(31, 79, 143)", bg)

	// Create an API token: it is shown once, and it works.
	do(ctx, t,
		chromedp.Click(byTestID("nav-tokens")),
		chromedp.WaitVisible(byTestID("token-create-form")),
		chromedp.SendKeys(byTestID("token-name"), "browser script"),
		chromedp.Click(byTestID("token-create")),
		chromedp.WaitVisible(byTestID("new-token")),
		// copy.js reveals the copy button.
		chromedp.WaitVisible(chromedp.CSS(`button[data-copy="new-token"]`)),
	)
	token := get(ctx, t, chromedp.Value(byTestID("new-token")))
	require.True(t, strings.HasPrefix(token, "nwa_"), token)
	require.Equal(t, "browser script", get(ctx, t, chromedp.Text(byTestID("token-created-name"))))
	req, err := http.NewRequest(http.MethodGet, base+"/api/v1/whoami", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)

	// Back on the list the token is named, not shown.
	do(ctx, t, chromedp.Click(byTestID("back-to-tokens")), chromedp.WaitVisible(byTestID("token-table")))
	listed := get(ctx, t, chromedp.Text(byTestID("token-table")))
	require.Contains(t, listed, "browser script")
	require.NotContains(t, listed, token)

	// Log out: back to the sign-in form, and the console is closed again.
	do(ctx, t, chromedp.Click(byTestID("logout")), chromedp.WaitVisible(byTestID("login-form")))
	require.Equal(t, base+"/console/login", get(ctx, t, chromedp.Location()))
	do(ctx, t, chromedp.Navigate(base+"/console/tokens"), chromedp.WaitVisible(byTestID("login-form")))
}

// TestConsoleAdministratorsInBrowser: an administrator adds a colleague,
// disables them, and changes their own password, as a person would.
func TestConsoleAdministratorsInBrowser(t *testing.T) {
	app, base := startServer(t)
	_, err := app.Auth.CreateAdmin(context.Background(), "ada", "correct horse battery staple")
	require.NoError(t, err)
	ctx := browser(t)
	signIn := func(password string) {
		do(ctx, t,
			chromedp.Navigate(base+"/console/login"),
			chromedp.WaitVisible(byTestID("login-form")),
			chromedp.SendKeys(byTestID("login-username"), "ada"),
			chromedp.SendKeys(byTestID("login-password"), password),
			chromedp.Click(byTestID("login-submit")),
			chromedp.WaitVisible(byTestID("overview")),
		)
	}
	signIn("correct horse battery staple")

	do(ctx, t,
		chromedp.Click(byTestID("nav-admins")),
		chromedp.WaitVisible(byTestID("admin-add-form")),
		chromedp.SendKeys(byTestID("admin-username"), "bob"),
		chromedp.SendKeys(byTestID("admin-password"), "bobs-long-password"),
		chromedp.Click(byTestID("admin-add")),
		chromedp.WaitVisible(byTestID("admin-bob")),
	)
	require.Contains(t, get(ctx, t, chromedp.Text(byTestID("flash"))), "Added the administrator bob")
	do(ctx, t,
		chromedp.Click(chromedp.CSS(`[data-testid="admin-bob"] [data-testid="admin-disable"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="admin-bob"] [data-testid="admin-enable"]`)),
	)
	require.Equal(t, "disabled", get(ctx, t, chromedp.Text(chromedp.CSS(`[data-testid="admin-bob"] [data-testid="admin-status"]`))))
	_, _, err = app.Auth.Login(context.Background(), "bob", "bobs-long-password", "127.0.0.1:1")
	require.Error(t, err, "a disabled administrator does not sign in")

	// Your account, from your name in the header.
	do(ctx, t,
		chromedp.Click(byTestID("username")),
		chromedp.WaitVisible(byTestID("password-form")),
		chromedp.SendKeys(byTestID("current-password"), "correct horse battery staple"),
		chromedp.SendKeys(byTestID("new-password"), "a brand new passphrase"),
		chromedp.SendKeys(byTestID("confirm-password"), "a brand new passphrase"),
		chromedp.Click(byTestID("password-submit")),
		chromedp.WaitVisible(byTestID("flash")),
	)
	require.Contains(t, get(ctx, t, chromedp.Text(byTestID("flash"))), "Your password is changed")
	do(ctx, t, chromedp.Click(byTestID("logout")), chromedp.WaitVisible(byTestID("login-form")))
	signIn("a brand new passphrase")
}

func TestConsoleSetupInBrowser(t *testing.T) {
	app, base := startServer(t)
	setupToken, err := app.Auth.OpenSetup(context.Background())
	require.NoError(t, err)
	require.NotEmpty(t, setupToken)
	ctx := browser(t)

	// setup.js copies the token from the fragment and drops the fragment.
	do(ctx, t,
		chromedp.Navigate(base+"/console/setup#"+setupToken),
		chromedp.WaitVisible(byTestID("setup-form")),
	)
	_, err = chromedp.Run(ctx, chromedp.Poll[chromedp.Void](
		`document.getElementById("setup_token").value !== ""`, chromedp.WithPollingTimeout(10*time.Second)))
	require.NoError(t, err)
	require.Equal(t, setupToken, get(ctx, t, chromedp.Value(byTestID("setup-token"))))
	require.Equal(t, base+"/console/setup", get(ctx, t, chromedp.Location()))

	do(ctx, t,
		chromedp.SendKeys(byTestID("setup-username"), "root"),
		chromedp.SendKeys(byTestID("setup-password"), "a long enough password"),
		chromedp.Click(byTestID("setup-submit")),
		chromedp.WaitVisible(byTestID("overview")),
	)
	require.Equal(t, "root", get(ctx, t, chromedp.Text(byTestID("username"))))

	// Setup is closed now.
	do(ctx, t, chromedp.Navigate(base+"/console/setup"), chromedp.WaitVisible(byTestID("setup-closed")))
	has, err := app.Auth.HasAdmin(context.Background())
	require.NoError(t, err)
	require.True(t, has)
}
