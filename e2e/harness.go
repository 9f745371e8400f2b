// Package e2e runs the real binaries: the control plane and the agent are
// built once per test run and started as processes, so restarts, kills and
// several replicas are real. Tests only; nothing here ships.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodeward/nodeward/apitest"
)

// TestMasterKey is the master key every test server shares (several
// replicas must have the same key).
const TestMasterKey = "6e6f646577617264206532652074657374206d6173746572206b65792031323334"

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error

	taggedMu sync.Mutex            // guards tagged
	tagged   = map[string]*build{} // server binaries built with tags, by tag list
)

// build is one binary built at most once.
type build struct {
	once sync.Once
	path string
	err  error
}

// Binaries builds the server and the agent once for the whole test binary
// and answers their paths.
func Binaries(t testing.TB) (server, agent string) {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "nodeward-e2e-bin-")
		if buildErr != nil {
			return
		}
		for _, b := range []struct{ out, pkg string }{{"nodeward", "./server"}, {"nodeward-agent", "./agent"}} {
			if buildErr = goBuild(filepath.Join(buildDir, b.out), b.pkg, ""); buildErr != nil {
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatalf("build binaries: %v", buildErr)
	}
	return filepath.Join(buildDir, "nodeward"), filepath.Join(buildDir, "nodeward-agent")
}

// ServerBinary answers the server built with build tags (a comma-separated
// list; empty is the normal build), building it once per list.
func ServerBinary(t testing.TB, tags string) string {
	t.Helper()
	server, _ := Binaries(t)
	if tags == "" {
		return server
	}
	taggedMu.Lock()
	b := tagged[tags]
	if b == nil {
		b = &build{}
		tagged[tags] = b
	}
	taggedMu.Unlock()
	b.once.Do(func() {
		b.path = filepath.Join(buildDir, "nodeward-"+strings.ReplaceAll(tags, ",", "-"))
		b.err = goBuild(b.path, "./server", tags)
	})
	if b.err != nil {
		t.Fatalf("build server with tags %s: %v", tags, b.err)
	}
	return b.path
}

func goBuild(out, pkg, tags string) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	args := []string{"build", "-o", out}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	cmd := exec.Command("go", append(args, pkg)...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %v\n%s", strings.Join(cmd.Args[1:], " "), err, b)
	}
	return nil
}

// Cleanup removes the built binaries; call it from TestMain.
func Cleanup() {
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}

// FreeAddr answers a loopback address with a port free right now.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// Server is one control-plane process (restartable on the same address
// and database).
type Server struct {
	Addr, URL   string
	DataDir     string // SQLite
	DatabaseURL string // Postgres
	Replica     string
	Token       string // an administrator API token
	Env         []string

	bin string
	t   testing.TB

	mu  sync.Mutex // guards the following
	cmd *exec.Cmd
	log *apitest.LogBuffer
	// exited is closed when the current process has exited.
	exited chan struct{}
}

// ServerOptions say how to start a server.
type ServerOptions struct {
	// DatabaseURL selects Postgres (a schema URL from dbtest.NewSchema);
	// empty runs SQLite in a temp data folder.
	DatabaseURL string
	// DataDir is the SQLite data folder (default: a fresh temp dir).
	DataDir string
	Replica string
	// Token is an existing administrator token (for a second replica of
	// one database); empty creates an administrator and a token.
	Token string
	Env   []string
	// Tags builds the server with these build tags (comma-separated),
	// e.g. nodeward_testkinds; empty runs the normal build.
	Tags string
}

// StartServer starts a control-plane process and waits for /readyz.
func StartServer(t testing.TB, o ServerOptions) *Server {
	t.Helper()
	bin := ServerBinary(t, o.Tags)
	addr := FreeAddr(t)
	s := &Server{Addr: addr, URL: "http://" + addr, DatabaseURL: o.DatabaseURL, Replica: o.Replica, Token: o.Token, bin: bin, t: t}
	if s.Replica == "" {
		s.Replica = "replica-" + strings.ReplaceAll(addr, ":", "-")
	}
	if o.DatabaseURL == "" {
		s.DataDir = o.DataDir
		if s.DataDir == "" {
			s.DataDir = t.TempDir()
		}
	}
	s.Env = append([]string{
		"NODEWARD_LISTEN=" + addr,
		"NODEWARD_PUBLIC_URL=" + s.URL,
		"NODEWARD_MASTER_KEY=" + TestMasterKey,
		"NODEWARD_AGENT_VERSION=e2e",
		"NODEWARD_REPLICA_ID=" + s.Replica,
		"NODEWARD_SHUTDOWN_GRACE=10s",
		"NODEWARD_LOG_FORMAT=json",
	}, o.Env...)
	if s.DataDir != "" {
		s.Env = append(s.Env, "NODEWARD_DATA_DIR="+s.DataDir)
	} else {
		s.Env = append(s.Env, "NODEWARD_DATABASE_URL="+s.DatabaseURL)
	}
	if s.Token == "" {
		s.run(t, strings.NewReader("e2e-admin-password\n"), "admin", "create", "--username", "e2e", "--password-stdin")
		s.Token = strings.TrimSpace(s.run(t, nil, "token", "create", "--name", "e2e"))
	}
	// FreeAddr's port is free when it answers, not when the process binds
	// it: a parallel test's server may take it first. Then this one cannot
	// listen, and starts again on another port.
	for attempt := 1; ; attempt++ {
		err := s.start(t)
		if err == nil {
			break
		}
		if !errors.Is(err, errAddrTaken) || attempt == 3 {
			t.Fatalf("%v\n%s", err, s.log.String())
		}
		s.moveTo(FreeAddr(t))
	}
	t.Cleanup(func() { s.Stop(t, syscall.SIGTERM) })
	return s
}

func (s *Server) run(t testing.TB, stdin io.Reader, args ...string) string {
	t.Helper()
	cmd := exec.Command(s.bin, args...)
	cmd.Env = append(os.Environ(), s.Env...)
	cmd.Stdin = stdin
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("nodeward %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// errAddrTaken: the process could not listen, its address in use.
var errAddrTaken = errors.New("server address taken by another process")

// moveTo gives a server that never started another address.
func (s *Server) moveTo(addr string) {
	oldURL := s.URL
	s.Addr, s.URL = addr, "http://"+addr
	for i, kv := range s.Env {
		switch {
		case strings.HasPrefix(kv, "NODEWARD_LISTEN="):
			s.Env[i] = "NODEWARD_LISTEN=" + addr
		case kv == "NODEWARD_PUBLIC_URL="+oldURL:
			s.Env[i] = "NODEWARD_PUBLIC_URL=" + s.URL
		}
	}
}

// Start starts the process (again) and waits until it is ready.
func (s *Server) Start(t testing.TB) {
	t.Helper()
	if err := s.start(t); err != nil {
		t.Fatalf("%v", err)
	}
}

// start starts the process and waits until it is ready: /readyz answers
// 200 and its own log says it listens (so the answer is not another
// process's on a port taken first).
func (s *Server) start(t testing.TB) error {
	t.Helper()
	cmd := exec.Command(s.bin, "serve")
	cmd.Env = append(os.Environ(), s.Env...)
	log := &apitest.LogBuffer{}
	pr, pw := io.Pipe()
	cmd.Stdout = pw
	cmd.Stderr = pw
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start server: %w", err)
	}
	exited := make(chan struct{})
	logDone := make(chan struct{})
	go func() {
		defer close(logDone)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			log.Write(append(sc.Bytes(), '\n'))
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		_ = cmd.Wait()
		_ = pw.Close()
		<-logDone // every line the process wrote is in the log
		close(exited)
	}()
	s.mu.Lock()
	s.cmd, s.log, s.exited = cmd, log, exited
	s.mu.Unlock()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("server %s log:\n%s", s.Replica, log.String())
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(s.URL + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(log.String(), `"msg":"listening"`) {
				return nil
			}
		}
		select {
		case <-exited:
			if strings.Contains(log.String(), "address already in use") {
				return errAddrTaken
			}
			return errors.New("server exited before it was ready")
		default:
		}
		if time.Now().After(deadline) {
			return errors.New("server not ready after 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop signals the process and waits for it to exit; it answers how long
// that took. Stopping a stopped server does nothing.
func (s *Server) Stop(t testing.TB, sig syscall.Signal) time.Duration {
	t.Helper()
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.mu.Unlock()
	if cmd == nil {
		return 0
	}
	select {
	case <-exited:
		return 0
	default:
	}
	start := time.Now()
	_ = cmd.Process.Signal(sig)
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		t.Errorf("server did not exit within 60s of %v", sig)
		<-exited
	}
	return time.Since(start)
}

// ExitCode answers the last process's exit code (-1 if killed by a signal).
func (s *Server) ExitCode() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.ProcessState == nil {
		return -1
	}
	return s.cmd.ProcessState.ExitCode()
}

// API calls the admin API with the server's token; out may be nil.
func (s *Server) API(t testing.TB, method, path string, body any, wantStatus int, out any) {
	t.Helper()
	status, raw := s.Call(t, method, path, body, s.Token)
	if status != wantStatus {
		t.Fatalf("%s %s: status %d, want %d: %s", method, path, status, wantStatus, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s: decode: %v: %s", method, path, err, raw)
		}
	}
}

// Call makes one request and answers the status and body.
func (s *Server) Call(t testing.TB, method, path string, body any, token string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, s.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw
}

// Log answers what the current (or last) process has logged so far.
func (s *Server) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.log == nil {
		return ""
	}
	return s.log.String()
}
