package controlplane

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDebugAddrSetting: the debug listener's address comes from
// NODEWARD_DEBUG_ADDR or --debug-addr (the flag wins), is off by default,
// and anything but a loopback host:port is refused at start with a line
// naming the setting.
func TestDebugAddrSetting(t *testing.T) {
	parse := func(env string, args ...string) (Config, error) {
		return parseServe(t, "NODEWARD_DEBUG_ADDR", env, args...)
	}
	for _, tc := range []struct {
		env  string
		args []string
		want string
	}{
		{"", nil, ""}, // off
		{"127.0.0.1:6060", nil, "127.0.0.1:6060"},
		{"[::1]:6060", nil, "[::1]:6060"},
		{"localhost:0", nil, "localhost:0"},
		{"127.0.0.2:6060", nil, "127.0.0.2:6060"},
		{"127.0.0.1:6060", []string{"--debug-addr", "127.0.0.1:7070"}, "127.0.0.1:7070"},
		{"", []string{"--debug-addr", "127.0.0.1:6061"}, "127.0.0.1:6061"},
	} {
		c, err := parse(tc.env, tc.args...)
		require.NoError(t, err, "%q %v", tc.env, tc.args)
		require.Equal(t, tc.want, c.DebugAddr, "%q %v", tc.env, tc.args)
	}
	for _, tc := range []struct {
		env  string
		args []string
		want string
	}{
		{"6060", nil, "not host:port"},
		{"127.0.0.1", nil, "not host:port"},
		{"127.0.0.1:", nil, "not host:port"},
		{"127.0.0.1:99999", nil, "bad port"},
		{":6060", nil, "loopback"},         // every interface
		{"0.0.0.0:6060", nil, "loopback"},  // every interface
		{"10.1.2.3:6060", nil, "loopback"}, // a network address
		{"example.com:6060", nil, "loopback"},
		{"", []string{"--debug-addr", "[::]:6060"}, "loopback"},
		{"127.0.0.1:6060", []string{"--debug-addr", "192.168.1.1:6060"}, "loopback"},
	} {
		_, err := parse(tc.env, tc.args...)
		require.Error(t, err, "%q %v", tc.env, tc.args)
		require.Contains(t, err.Error(), "NODEWARD_DEBUG_ADDR", "%q %v", tc.env, tc.args)
		require.Contains(t, err.Error(), tc.want, "%q %v", tc.env, tc.args)
	}
}

// TestDebugListenerServesProfilesPublicDoesNot: with the debug listener on,
// pprof answers there (the index, a goroutine profile) and the public
// listener answers none of /debug/pprof/; with it off, nothing listens.
func TestDebugListenerServesProfilesPublicDoesNot(t *testing.T) {
	cfg := Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), ShutdownGrace: 5 * time.Second, LogLevel: "info",
		LogFormat: "json", DebugAddr: "127.0.0.1:0"}
	require.NoError(t, cfg.Validate())
	app, err := Open(context.Background(), cfg, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	defer app.Close()
	dln, err := app.ListenDebug()
	require.NoError(t, err)
	require.NotNil(t, dln)
	pub, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- app.Serve(ctx, pub) }()
	defer func() {
		cancel()
		select {
		case err := <-served:
			require.NoError(t, err)
		case <-time.After(time.Minute):
			t.Fatal("Serve did not return")
		}
	}()

	hc := &http.Client{Timeout: time.Minute}
	get := func(url string) (int, string) {
		resp, err := hc.Get(url)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	debugURL, publicURL := "http://"+dln.Addr().String(), "http://"+pub.Addr().String()
	code, body := get(debugURL + "/debug/pprof/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "goroutine")
	code, body = get(debugURL + "/debug/pprof/goroutine?debug=1")
	require.Equal(t, http.StatusOK, code)
	require.True(t, strings.HasPrefix(body, "goroutine profile: total "), body[:min(len(body), 80)])
	require.Contains(t, body, "net/http.(*Server).Serve", "the profile is this process's")
	code, _ = get(debugURL + "/debug/pprof/cmdline")
	require.Equal(t, http.StatusOK, code)
	// The debug listener serves profiles and nothing else.
	code, _ = get(debugURL + "/api/v1/nodes")
	require.Equal(t, http.StatusNotFound, code)
	code, _ = get(debugURL + "/metrics")
	require.Equal(t, http.StatusNotFound, code)

	// The public listener serves no profile, whatever the path.
	for _, p := range []string{"/debug/pprof/", "/debug/pprof/goroutine?debug=1", "/debug/pprof/cmdline", "/debug/pprof/heap"} {
		code, body := get(publicURL + p)
		require.NotEqual(t, http.StatusOK, code, p)
		require.NotContains(t, body, "goroutine profile", p)
	}
	code, _ = get(publicURL + "/healthz")
	require.Equal(t, http.StatusOK, code, "the public listener serves")

	// The database pools' waits are exported (SQLite: the shared pool and
	// the writer's own connection).
	code, body = get(publicURL + "/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `go_sql_wait_count_total{db_name="pool"}`)
	require.Contains(t, body, `go_sql_wait_count_total{db_name="writer"} 0`)
	require.Contains(t, body, `go_sql_max_open_connections{db_name="writer"} 1`)
	// The collector's settings and cost (the memory policy runs only in
	// `serve`, so not here: the percent is the process's, 100 unless GOGC).
	require.Contains(t, body, "nodeward_memory_policy_active 0")
	require.Regexp(t, `(?m)^nodeward_gc_percent -?\d+$`, body)
	require.Regexp(t, `(?m)^nodeward_gc_cpu_seconds_total \S+$`, body)
	require.Contains(t, body, "nodeward_memory_policy_releases_total 0")
	// Every write batch's duration, commit included (a disk's slow sync
	// shows here first).
	require.Regexp(t, `(?m)^nodeward_write_batch_seconds_count \d+$`, body)
	require.Contains(t, body, `nodeward_write_batch_seconds_bucket{le="0.0005"}`)
}

// TestDebugListenerOffByDefault: no setting, no listener.
func TestDebugListenerOffByDefault(t *testing.T) {
	cfg := Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), ShutdownGrace: 5 * time.Second, LogLevel: "info", LogFormat: "json"}
	require.NoError(t, cfg.Validate())
	app, err := Open(context.Background(), cfg, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	defer app.Close()
	ln, err := app.ListenDebug()
	require.NoError(t, err)
	require.Nil(t, ln)
	require.Nil(t, app.debugLn)
}
