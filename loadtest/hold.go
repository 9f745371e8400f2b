package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nodeward/nodeward/agent/api"
)

// HoldConfig is one hold run (issue 13): the same simulated agents are
// held first by the bare waiter (cmd/barewaiter, the floor), then by the
// real server binary, whose memory and CPU per held poll are read as a
// ratio to the floor; then commands are issued to the held agents at Rate.
type HoldConfig struct {
	Agents          int
	AgentsPerWorker int
	Wait            time.Duration // long-poll wait the agents ask for
	Settle          time.Duration // after every poll is held, before sampling
	Sample          time.Duration // the window RSS and CPU are sampled over
	Rate            float64       // commands/s issued to the held agents
	Duration        time.Duration // how long commands are issued
	TLS             bool          // both servers serve HTTPS (a throwaway CA)
	DatabaseURL     string        // Postgres for the server (a private schema); empty: SQLite
	// Replicas > 1 holds the agents on that many server processes sharing
	// the Postgres (the workers spread over them); each is measured.
	Replicas int
	// P99Target: see Config.
	P99Target float64
	// PollsTogether: see Config (both servers' agents).
	PollsTogether bool
	Log           io.Writer
	WorkerCommand []string
}

// HoldSide is what one server spent holding the agents.
type HoldSide struct {
	Held      int     `json:"long_polls_held"`
	IdleRSSKB int64   `json:"idle_rss_kb"`
	HeldRSSKB int64   `json:"held_rss_kb"` // the highest sample in the window
	PerPollKB float64 `json:"kb_per_held_poll"`
	Cores     float64 `json:"cores_while_holding"`
}

// HoldReport is a hold run's figures.
type HoldReport struct {
	Date     string   `json:"date"`
	Agents   int      `json:"agents"`
	TLS      bool     `json:"tls"`
	Database string   `json:"database"`
	Bare     HoldSide `json:"bare_waiter"`
	Server   HoldSide `json:"server"`
	// Ratio is the server's memory per held poll over the bare waiter's.
	Ratio   float64 `json:"ratio"`
	Deliver Report  `json:"deliver"`
	// PerReplica is each server process (Replicas > 1); Server is then
	// their sum, its per-poll figure over every poll held.
	PerReplica []HoldSide `json:"per_replica,omitempty"`
}

func (c *HoldConfig) defaults() error {
	if c.Agents < 1 {
		return errors.New("agents must be at least 1")
	}
	if c.AgentsPerWorker <= 0 {
		c.AgentsPerWorker = 2500
	}
	if c.Wait <= 0 {
		c.Wait = 25 * time.Second
	}
	if c.Settle <= 0 {
		c.Settle = 5 * time.Second
	}
	if c.Sample <= 0 {
		c.Sample = 10 * time.Second
	}
	if c.Duration <= 0 {
		c.Duration = 30 * time.Second
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	if len(c.WorkerCommand) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		c.WorkerCommand = []string{exe}
	}
	return nil
}

// RunHold performs a hold run. It builds the server and the bare waiter
// from this module (so it runs from a checkout), starts each as its own
// process on loopback, and stops both before it answers.
func RunHold(ctx context.Context, cfg HoldConfig) (rep HoldReport, err error) {
	if err := cfg.defaults(); err != nil {
		return rep, err
	}
	logf := func(format string, args ...any) { fmt.Fprintf(cfg.Log, "loadtest: "+format+"\n", args...) }
	rep.Date, rep.Agents, rep.TLS = time.Now().UTC().Format(time.RFC3339), cfg.Agents, cfg.TLS
	dir, err := os.MkdirTemp("", "nodeward-hold-")
	if err != nil {
		return rep, err
	}
	defer os.RemoveAll(dir)
	logf("building the server and the bare waiter")
	serverBin, waiterBin := filepath.Join(dir, "nodeward"), filepath.Join(dir, "barewaiter")
	for out, pkg := range map[string]string{serverBin: "./server", waiterBin: "./cmd/barewaiter"} {
		if err := goBuild(ctx, out, pkg); err != nil {
			return rep, err
		}
	}
	var certFile, keyFile, caPEM string
	if cfg.TLS {
		if certFile, keyFile, caPEM, err = writeThrowawayCert(dir); err != nil {
			return rep, err
		}
	}
	if rep.Bare, err = holdBare(ctx, cfg, waiterBin, certFile, keyFile, caPEM, logf); err != nil {
		return rep, fmt.Errorf("bare waiter: %w", err)
	}
	rep.Database = "sqlite"
	if cfg.DatabaseURL != "" {
		rep.Database = "postgres"
	}
	if cfg.Replicas > 1 {
		if cfg.DatabaseURL == "" || cfg.TLS {
			return rep, errors.New("hold -replicas needs -db postgres and no -tls")
		}
		rep.PerReplica, rep.Deliver, err = holdReplicas(ctx, cfg, logf)
		for _, s := range rep.PerReplica {
			rep.Server.Held += s.Held
			rep.Server.IdleRSSKB += s.IdleRSSKB
			rep.Server.HeldRSSKB += s.HeldRSSKB
			rep.Server.Cores += s.Cores
		}
		if rep.Server.Held > 0 {
			rep.Server.PerPollKB = float64(rep.Server.HeldRSSKB-rep.Server.IdleRSSKB) / float64(rep.Server.Held)
		}
		if err != nil {
			return rep, fmt.Errorf("replicas: %w", err)
		}
	} else if rep.Server, rep.Deliver, err = holdServer(ctx, cfg, dir, serverBin, certFile, keyFile, caPEM, logf); err != nil {
		return rep, fmt.Errorf("server: %w", err)
	}
	if rep.Bare.PerPollKB > 0 {
		rep.Ratio = rep.Server.PerPollKB / rep.Bare.PerPollKB
	}
	return rep, nil
}

func holdBare(ctx context.Context, cfg HoldConfig, bin, certFile, keyFile, caPEM string, logf func(string, ...any)) (HoldSide, error) {
	var side HoldSide
	args := []string{"-listen", "127.0.0.1:0"}
	if certFile != "" {
		args = append(args, "-tls-cert", certFile, "-tls-key", keyFile)
	}
	cmd, url, err := startBare(ctx, bin, cfg.Log, args...)
	if err != nil {
		return side, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	hc := &http.Client{Transport: transportFor(caPEM), Timeout: 10 * time.Second}
	side.IdleRSSKB = rssKB(cmd.Process.Pid)

	agents := make([]api.Bootstrap, cfg.Agents)
	for i := range agents {
		agents[i].NodeID = "bare-" + strconv.Itoa(i)
	}
	workers, err := startWorkers(Config{WorkerCommand: cfg.WorkerCommand, Log: cfg.Log}, workerJob{URL: url, Bare: true, SpreadPolls: !cfg.PollsTogether,
		CACertificatePEM: caPEM, Wait: cfg.Wait, StopBy: time.Now().Add(10 * time.Minute).UnixNano()}, agents, cfg.AgentsPerWorker)
	defer stopWorkers(workers)
	if err != nil {
		return side, err
	}
	side.Held, err = waitHeld(ctx, heldNeeded(cfg.Agents, cfg.PollsTogether), 2*time.Minute, 200*time.Millisecond,
		func(ctx context.Context) (int, error) { return heldByWaiter(ctx, hc, url) })
	if err != nil {
		return side, err
	}
	logf("bare waiter holds %d polls; sampling", side.Held)
	sampleHold(ctx, cmd.Process.Pid, cfg, &side)
	logf("bare waiter: %d KB idle, %d KB holding (%.1f KB a poll), %.2f cores", side.IdleRSSKB, side.HeldRSSKB, side.PerPollKB, side.Cores)
	return side, ctx.Err()
}

// startBare starts cmd/barewaiter's binary and answers it with the URL
// its listening line names; on error nothing is left running.
func startBare(ctx context.Context, bin string, log io.Writer, args ...string) (*exec.Cmd, string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stderr = log
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, "", fmt.Errorf("%s: no listening line: %w", filepath.Base(bin), err)
	}
	return cmd, strings.TrimSpace(strings.TrimPrefix(line, "listening ")), nil
}

func holdServer(ctx context.Context, cfg HoldConfig, dir, bin, certFile, keyFile, caPEM string, logf func(string, ...any)) (HoldSide, Report, error) {
	var side HoldSide
	addr, err := freeLoopbackAddr()
	if err != nil {
		return side, Report{}, err
	}
	scheme := "http"
	if certFile != "" {
		scheme = "https"
	}
	url := scheme + "://" + addr
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	env := append(os.Environ(),
		"NODEWARD_LISTEN="+addr, "NODEWARD_PUBLIC_URL="+url, "NODEWARD_MASTER_KEY="+hex.EncodeToString(key),
		"NODEWARD_AGENT_VERSION=loadtest", "NODEWARD_LOG_LEVEL=warn", "NODEWARD_LOG_FORMAT=json")
	statURL := "" // the tail's wait sampling
	if cfg.DatabaseURL != "" {
		su, drop, err := newSchema(ctx, cfg.DatabaseURL)
		if err != nil {
			return side, Report{}, err
		}
		defer drop()
		statURL = su
		env = append(env, "NODEWARD_DATABASE_URL="+su)
	} else {
		env = append(env, "NODEWARD_DATA_DIR="+filepath.Join(dir, "data"))
	}
	if certFile != "" {
		env = append(env, "NODEWARD_TLS_CERT_FILE="+certFile, "NODEWARD_TLS_KEY_FILE="+keyFile)
	}
	cli := func(stdin string, args ...string) (string, error) {
		c := exec.CommandContext(ctx, bin, args...)
		c.Env, c.Stdin = env, strings.NewReader(stdin)
		out, err := c.Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return "", fmt.Errorf("nodeward %s: %w: %s", args[0], err, ee.Stderr)
			}
			return "", err
		}
		return strings.TrimSpace(string(out)), nil
	}
	if _, err := cli("loadtest-password\n", "admin", "create", "--username", "loadtest", "--password-stdin"); err != nil {
		return side, Report{}, err
	}
	token, err := cli("", "token", "create", "--name", "loadtest")
	if err != nil {
		return side, Report{}, err
	}
	logFile, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		return side, Report{}, err
	}
	defer logFile.Close()
	cmd := exec.CommandContext(ctx, bin, "serve")
	cmd.Env, cmd.Stdout, cmd.Stderr = env, logFile, logFile
	if err := cmd.Start(); err != nil {
		return side, Report{}, err
	}
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}()
	hc := &http.Client{Transport: transportFor(caPEM), Timeout: 10 * time.Second}
	if err := waitReady(ctx, hc, url); err != nil {
		tail, _ := os.ReadFile(logFile.Name())
		return side, Report{}, fmt.Errorf("%w; server log:\n%s", err, tail)
	}
	side.IdleRSSKB = rssKB(cmd.Process.Pid)
	logf("server (pid %d) ready on %s; holding %d agents", cmd.Process.Pid, url, cfg.Agents)

	dcfg := Config{Agents: cfg.Agents, AgentsPerWorker: cfg.AgentsPerWorker, Rate: cfg.Rate, Duration: cfg.Duration,
		Wait: cfg.Wait, URL: url, Token: token, CACertificatePEM: caPEM, WorkerCommand: cfg.WorkerCommand, Log: cfg.Log,
		P99Target: cfg.P99Target, PGStatURL: statURL, PollsTogether: cfg.PollsTogether,
		OnHeld: func(ctx context.Context, held int) {
			side.Held = held
			sampleHold(ctx, cmd.Process.Pid, cfg, &side)
			logf("server: %d KB idle, %d KB holding (%.1f KB a poll), %.2f cores; RSS now %s", side.IdleRSSKB, side.HeldRSSKB, side.PerPollKB, side.Cores,
				rssParts(cmd.Process.Pid))
		}}
	deliver, err := Run(ctx, dcfg)
	if err != nil {
		tail, _ := os.ReadFile(logFile.Name())
		return side, deliver, fmt.Errorf("%w; server log:\n%s", err, lastLines(string(tail), 20))
	}
	return side, deliver, nil
}

// sampleHold waits cfg.Settle, then samples the process's RSS every second
// over cfg.Sample (keeping the highest) and its CPU over the window.
func sampleHold(ctx context.Context, pid int, cfg HoldConfig, side *HoldSide) {
	if !sleepCtx(ctx, cfg.Settle) {
		return
	}
	cpu0, t0 := processCPU(pid), time.Now()
	for end := t0.Add(cfg.Sample); time.Now().Before(end); {
		side.HeldRSSKB = max(side.HeldRSSKB, rssKB(pid))
		if !sleepCtx(ctx, time.Second) {
			return
		}
	}
	side.HeldRSSKB = max(side.HeldRSSKB, rssKB(pid))
	side.Cores = (processCPU(pid) - cpu0) / time.Since(t0).Seconds()
	if side.Held > 0 {
		side.PerPollKB = float64(side.HeldRSSKB-side.IdleRSSKB) / float64(side.Held)
	}
}

// rssKB answers a process's resident set in KiB (from /proc), or 0.
func rssKB(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// rssParts is the process's resident memory by kind (/proc status):
// anonymous (the Go heap and stacks, the runtime's own, SQLite's caches),
// file-backed (the binary, mapped database files) and shared.
func rssParts(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return "unknown"
	}
	var parts []string
	for _, line := range strings.Split(string(b), "\n") {
		for _, k := range []string{"RssAnon:", "RssFile:", "RssShmem:"} {
			if rest, ok := strings.CutPrefix(line, k); ok {
				parts = append(parts, strings.TrimSuffix(k, ":")+" "+strings.TrimSpace(rest))
			}
		}
	}
	return strings.Join(parts, ", ")
}

// waitHeld asks count every interval until it answers at least need, and
// answers the last count; it gives up after within. A count that fails is
// asked again: with TLS, the bare waiter's count queues behind thousands of
// handshakes while the fleet connects on a busy machine, and times out —
// a slow answer, not a failed run.
func waitHeld(ctx context.Context, need int, within, interval time.Duration, count func(context.Context) (int, error)) (int, error) {
	deadline := time.Now().Add(within)
	held := 0
	var lastErr error
	for held < need {
		if time.Now().After(deadline) {
			if lastErr != nil {
				return held, fmt.Errorf("only %d of %d polls held after %s (the last count failed: %w)", held, need, within, lastErr)
			}
			return held, fmt.Errorf("only %d of %d polls held after %s", held, need, within)
		}
		if !sleepCtx(ctx, interval) {
			return held, ctx.Err()
		}
		n, err := count(ctx)
		if err != nil {
			lastErr = err
			continue
		}
		held, lastErr = n, nil
	}
	return held, nil
}

func heldByWaiter(ctx context.Context, hc *http.Client, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/held", nil)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

func waitReady(ctx context.Context, hc *http.Client, url string) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/readyz", nil)
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
	return errors.New("not ready after 1m")
}

func freeLoopbackAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// goBuild builds a package of this module (the tool runs from a checkout).
func goBuild(ctx context.Context, out, pkg string) error {
	gomod, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil || len(strings.TrimSpace(string(gomod))) == 0 || strings.TrimSpace(string(gomod)) == os.DevNull {
		return fmt.Errorf("go build %s: run the tool from a checkout of the module", pkg)
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	cmd.Dir = filepath.Dir(strings.TrimSpace(string(gomod)))
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return nil
}

// transportFor is an HTTP transport trusting caPEM (when set) instead of
// the system roots.
func transportFor(caPEM string) *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	if caPEM != "" {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM([]byte(caPEM))
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return tr
}

// writeThrowawayCert writes a self-signed certificate for 127.0.0.1 (and
// its key) into dir, answering the files and the PEM clients pin.
func writeThrowawayCert(dir string) (certFile, keyFile, caPEM string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "nodeward loadtest"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", "", "", err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", "", err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		return "", "", "", err
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return "", "", "", err
	}
	return certFile, keyFile, string(certPEM), nil
}
