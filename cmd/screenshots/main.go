// Command screenshots photographs every console page at laptop and phone
// width for the README (issue 12). It starts a throwaway control plane
// in-process on an embedded SQLite in a temporary folder, with a master
// key of its own, so nothing shown (the bootstrap on the invite answer
// included) is valid anywhere once it exits. It seeds a small fleet
// through the public API — nodes enrolled by real in-process agents on
// the simulated runtime, operations that succeed and one that fails, a
// fan-out, a configured node, a sealed secret, a package host — then
// drives headless Chromium through the console as an administrator and
// writes one PNG per page and width.
//
//	go run ./cmd/screenshots -out docs/screenshots
//
// `make screenshots` runs it. Chromium is $NODEWARD_CHROMIUM, else
// /usr/bin/chromium, else chromium on the PATH. It is a program, not a
// test: `go test` never writes into the tree.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/server/controlplane"
)

func main() {
	out := flag.String("out", "docs/screenshots", "folder the PNGs are written to")
	maxHeight := flag.Int("max-height", 2200, "tallest picture, in CSS pixels (a longer page is cut)")
	verbose := flag.Bool("v", false, "log the control plane's and agents' warnings")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := run(ctx, *out, *maxHeight, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "screenshots:", err)
		os.Exit(1)
	}
}

// chromium finds the browser as the browser tests do.
func chromium() (string, error) {
	for _, p := range []string{os.Getenv("NODEWARD_CHROMIUM"), "/usr/bin/chromium"} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("chromium"); err == nil {
		return p, nil
	}
	return "", errors.New("chromium not found: set NODEWARD_CHROMIUM or `apt-get install chromium`")
}

func run(ctx context.Context, out string, maxHeight int, verbose bool) error {
	browserPath, err := chromium()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "nodeward-screenshots-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	level := slog.LevelError
	if verbose {
		level = slog.LevelWarn
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	base := "http://" + ln.Addr().String()
	cfg := controlplane.Config{Listen: ln.Addr().String(), PublicURL: base, DataDir: filepath.Join(dir, "server"),
		ShutdownGrace: 5 * time.Second, LogLevel: "error", LogFormat: "text"}
	app, err := controlplane.Open(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer func() { _ = app.Close() }()
	srvCtx, stopServer := context.WithCancel(context.WithoutCancel(ctx))
	served := make(chan error, 1)
	go func() { served <- app.Serve(srvCtx, ln) }()
	// Agents stop before the server, so their last calls are answered.
	agents := &agents{dir: filepath.Join(dir, "agents"), log: log}
	defer func() {
		agents.stop()
		stopServer()
		<-served
	}()

	if _, err := app.Auth.CreateAdmin(ctx, adminUser, adminPassword); err != nil {
		return fmt.Errorf("create admin: %w", err)
	}
	token, _, err := app.Auth.CreateTokenFor(ctx, adminUser, "screenshots")
	if err != nil {
		return err
	}
	// Colleagues for the administrators page: one who left (disabled).
	admin, err := app.Auth.Admin(ctx, adminUser)
	if err != nil {
		return err
	}
	actor := auth.Principal{Kind: auth.KindAdmin, UserID: admin.ID, Username: admin.Username}
	for _, name := range []string{"grace", "linus"} {
		if _, err := app.Auth.AddAdmin(ctx, actor, name, adminPassword+"-"+name, "127.0.0.1:1"); err != nil {
			return fmt.Errorf("add admin: %w", err)
		}
	}
	if _, _, err := app.Auth.DisableAdmin(ctx, actor, "linus", "127.0.0.1:1"); err != nil {
		return fmt.Errorf("disable admin: %w", err)
	}
	api := &apiClient{base: base, token: token}
	fmt.Fprintln(os.Stderr, "screenshots: seeding a small fleet")
	s, err := seed(ctx, api, agents)
	if err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "screenshots: photographing the console")
	return photograph(ctx, browserPath, filepath.Join(dir, "chromium"), base, out, maxHeight, s)
}
