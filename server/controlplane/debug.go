package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"
)

// The debug listener (NODEWARD_DEBUG_ADDR, --debug-addr) serves the Go
// runtime's profiles (net/http/pprof) on an address of its own, off by
// default and never on the public listener: a profile shows memory
// contents, goroutine stacks and request paths, and a CPU profile or an
// execution trace costs the process while it runs. Only a loopback address
// is accepted (an operator reaches it with an SSH tunnel or kubectl
// port-forward), so enabling it cannot open it to the network by mistake.

// checkDebugAddr validates the debug listener's address: empty (off), or
// host:port with host a loopback IP or "localhost".
func checkDebugAddr(addr string) error {
	if addr == "" {
		return nil
	}
	const setting = "debug listener (NODEWARD_DEBUG_ADDR, --debug-addr)"
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		return fmt.Errorf("%s %q is not host:port", setting, addr)
	}
	if _, err := net.LookupPort("tcp", port); err != nil {
		return fmt.Errorf("%s %q: bad port", setting, addr)
	}
	if strings.EqualFold(host, "localhost") {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%s %q: want a loopback address such as 127.0.0.1:6060; profiles show memory contents, "+
			"so reach it through an SSH tunnel or port-forward instead of listening on %q", setting, addr, host)
	}
	return nil
}

// debugHandler serves the pprof endpoints under /debug/pprof/ and nothing
// else (its own mux: net/http/pprof's registration on the default mux is
// never served).
func debugHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// ListenDebug opens the debug listener when the configuration names one
// (Serve then serves it beside the public listener and stops it with the
// server); it answers the listener, or nil when it is off. A bind failure
// names the setting.
func (a *App) ListenDebug() (net.Listener, error) {
	if a.Config.DebugAddr == "" {
		return nil, nil
	}
	if err := checkDebugAddr(a.Config.DebugAddr); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", a.Config.DebugAddr)
	if err != nil {
		return nil, fmt.Errorf("debug listener (NODEWARD_DEBUG_ADDR, --debug-addr) on %s: %w", a.Config.DebugAddr, err)
	}
	a.debugLn = ln
	return ln, nil
}

// serveDebug serves the debug listener (if any) until stop is called.
func (a *App) serveDebug() (stop func()) {
	ln := a.debugLn
	if ln == nil {
		return func() {}
	}
	srv := &http.Server{
		Handler:           debugHandler(),
		ReadHeaderTimeout: 10 * time.Second,
		// No WriteTimeout: a CPU profile or trace writes for as long as
		// its seconds parameter asks.
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.Log.Error("debug listener", "err", err)
		}
	}()
	a.Log.Info("debug listener serving profiles", "addr", ln.Addr().String(), "path", "/debug/pprof/")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			_ = srv.Close() // a profile in progress is cut short
		}
		<-done
	}
}
