package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/internal/testwait"
)

// These tests build the real binary and drive it against a minimal control
// plane: the shim re-exec, the state dir and the exit codes are the ones an
// operator gets.

const patience = 30 * time.Second

func buildAgent(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "nodeward-agent")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

type miniCP struct {
	mu       sync.Mutex
	queue    []api.Command
	retired  bool
	fencing  int64
	results  map[string]api.Result
	workload map[string]api.WorkloadObservation // run/attempt/state -> obs
	enrolls  int
	config   *api.ConfigDelivery // carried by every poll answer until a report names it
	reports  []api.ConfigReport
}

func (cp *miniCP) handler() http.Handler {
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, v any) { json.NewEncoder(w).Encode(v) }
	problem := func(w http.ResponseWriter, status int, code string) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(status)
		reply(w, api.Problem{Status: status, Code: code, Title: code})
	}
	mux.HandleFunc("POST /agent/v1/enroll", func(w http.ResponseWriter, r *http.Request) {
		cp.mu.Lock()
		defer cp.mu.Unlock()
		if cp.enrolls > 0 {
			problem(w, 409, "enrollment_spent")
			return
		}
		cp.enrolls++
		cp.fencing++
		reply(w, api.EnrollResponse{NodeID: "node-1", SessionToken: fmt.Sprintf("s%d", cp.fencing), SessionExpiresAt: time.Now().Add(time.Hour),
			SessionTTLSeconds: 3600, FencingToken: cp.fencing, LeaseSeconds: 90, HeartbeatSeconds: 30})
	})
	mux.HandleFunc("POST /agent/v1/session/renew", func(w http.ResponseWriter, r *http.Request) {
		cp.mu.Lock()
		defer cp.mu.Unlock()
		if r.Header.Get("Authorization") != fmt.Sprintf("Bearer s%d", cp.fencing) {
			problem(w, 409, "fenced")
			return
		}
		reply(w, api.RenewResponse{SessionToken: fmt.Sprintf("s%d", cp.fencing), SessionExpiresAt: time.Now().Add(time.Hour), SessionTTLSeconds: 3600})
	})
	mux.HandleFunc("GET /agent/v1/commands", func(w http.ResponseWriter, r *http.Request) {
		deadline := time.Now().Add(200 * time.Millisecond)
		for {
			cp.mu.Lock()
			if cp.retired {
				cp.mu.Unlock()
				problem(w, 410, "node_retired")
				return
			}
			if len(cp.queue) > 0 || time.Now().After(deadline) {
				cmds := cp.queue
				cp.queue = nil
				resp := api.CommandsResponse{Commands: cmds, Config: cp.config}
				if c := cp.config; c != nil && len(cp.reports) > 0 && cp.reports[len(cp.reports)-1].Revision == c.Revision {
					resp.Config = nil
				}
				cp.mu.Unlock()
				if resp.Commands == nil {
					resp.Commands = []api.Command{}
				}
				reply(w, resp)
				return
			}
			cp.mu.Unlock()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	})
	mux.HandleFunc("POST /agent/v1/results", func(w http.ResponseWriter, r *http.Request) {
		var req api.ResultsRequest
		json.NewDecoder(r.Body).Decode(&req)
		cp.mu.Lock()
		defer cp.mu.Unlock()
		var out api.ResultsResponse
		for _, res := range req.Results {
			cp.results[res.OperationID] = res
			out.Settled = append(out.Settled, api.Settled{OperationID: res.OperationID, State: "applied"})
		}
		reply(w, out)
	})
	mux.HandleFunc("POST /agent/v1/events", func(w http.ResponseWriter, r *http.Request) {
		var req api.EventsRequest
		json.NewDecoder(r.Body).Decode(&req)
		cp.mu.Lock()
		defer cp.mu.Unlock()
		for _, e := range req.Events {
			if e.Workload != nil {
				cp.workload[e.Workload.RunID+"/"+e.Workload.AttemptID+"/"+e.Workload.State] = *e.Workload
			}
			if e.Config != nil {
				cp.reports = append(cp.reports, *e.Config)
			}
		}
		reply(w, api.EventsResponse{Recorded: len(req.Events)})
	})
	return mux
}

func (cp *miniCP) push(op, kind string, payload any) {
	b, _ := json.Marshal(payload)
	cp.mu.Lock()
	cp.queue = append(cp.queue, api.Command{OperationID: op, NodeID: "node-1", Kind: kind, FencingToken: cp.fencing, Payload: b})
	cp.mu.Unlock()
}

func (cp *miniCP) has(f func() bool) bool {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return f()
}

// syncBuffer collects a child's stderr safely.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func exitCode(t *testing.T, cmd *exec.Cmd, log *syncBuffer) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(patience):
		cmd.Process.Kill()
		t.Fatalf("agent did not exit; log:\n%s", log.String())
		return -1
	}
}

func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the agent binary")
	}
	bin := buildAgent(t)
	cp := &miniCP{results: map[string]api.Result{}, workload: map[string]api.WorkloadObservation{}}
	srv := httptest.NewServer(cp.handler())
	defer srv.Close()
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "state")
	bsFile := filepath.Join(dir, "bootstrap.json")
	bs, _ := json.Marshal(api.Bootstrap{NodeID: "node-1", Generation: 1, EnrollmentToken: "tok", ControlPlaneURL: srv.URL, AgentVersion: "dev"})
	os.WriteFile(bsFile, bs, 0o600)

	start := func(args ...string) (*exec.Cmd, *syncBuffer) {
		log := &syncBuffer{}
		cmd := exec.Command(bin, append([]string{"--state-dir", stateDir, "--poll-wait", "1s", "--retire-grace", "1s"}, args...)...)
		cmd.Stderr = log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, log
	}

	t.Run("HelpAndBadFlags", func(t *testing.T) {
		cmd, log := start("--help")
		if code := exitCode(t, cmd, log); code != 0 || !strings.Contains(log.String(), "-bootstrap") {
			t.Fatalf("--help: exit %d; log:\n%s", code, log.String())
		}
		// Not 2: that status tells a supervisor the node needs a reinvite.
		for _, bad := range [][]string{{"--no-such-flag"}, {"--poll-wait", "90s"}, {"--poll-wait", "0s"}, {"--retire-grace", "-1s"}, {"--log-format", "xml"}} {
			cmd, log = start(bad...)
			if code := exitCode(t, cmd, log); code != 1 {
				t.Fatalf("%v: exit %d; log:\n%s", bad, code, log.String())
			}
		}
	})

	t.Run("PlainHTTPRefusedWithoutFlag", func(t *testing.T) {
		cmd, log := start("--bootstrap", bsFile)
		if code := exitCode(t, cmd, log); code != 1 || !strings.Contains(log.String(), "allow-insecure-http") {
			t.Fatalf("exit %d; log:\n%s", code, log.String())
		}
	})

	t.Run("ErrorAnswerSavedAsBootstrap", func(t *testing.T) {
		// What `curl -o bootstrap.json` saves when the invitation is refused.
		bad := filepath.Join(dir, "refused.json")
		os.WriteFile(bad, []byte(identityExists), 0o600)
		cmd, log := start("--bootstrap", bad, "--allow-insecure-http")
		if code := exitCode(t, cmd, log); code != 1 {
			t.Fatalf("exit %d; log:\n%s", code, log.String())
		}
		for _, want := range []string{"error answer", "invitation failed", "code=identity_exists", "rack-4-slot-2", "new rental_id"} {
			if !strings.Contains(log.String(), want) {
				t.Fatalf("log lacks %q:\n%s", want, log.String())
			}
		}
		if strings.Contains(log.String(), "are required") {
			t.Fatalf("the log blames missing fields:\n%s", log.String())
		}
	})

	agent, log := start("--bootstrap", bsFile, "--allow-insecure-http")
	testwait.For(t, "enrolled", patience, func() bool { return strings.Contains(log.String(), "msg=enrolled") }, log.String)

	gate := filepath.Join(dir, "gate")
	cp.push("op-launch", api.KindLaunchWorkload, api.LaunchWorkload{RunID: "run-1", AttemptID: "a1", Command: "sh",
		Args: []string{"-c", `while [ ! -e "$GATE" ]; do sleep 0.02; done; exit 3`}, Env: map[string]string{"GATE": gate}})
	testwait.For(t, "the launch applied and running reported", patience, func() bool {
		return cp.has(func() bool { _, ok := cp.workload["run-1/a1/running"]; return cp.results["op-launch"].Applied && ok })
	}, log.String)

	// Kill the agent outright; the workload exits while it is down.
	agent.Process.Signal(syscall.SIGKILL)
	agent.Wait()
	os.WriteFile(gate, nil, 0o600)

	// Restart without the bootstrap: the stored session is enough, and the
	// exit that happened while it was down is reported.
	agent, log = start("--allow-insecure-http")
	testwait.For(t, "the exit reported after restart", patience, func() bool {
		return cp.has(func() bool {
			o, ok := cp.workload["run-1/a1/exited"]
			return ok && o.ExitCode != nil && *o.ExitCode == 3
		})
	}, log.String)
	if !strings.Contains(log.String(), "session restored") {
		t.Fatalf("no session restored line:\n%s", log.String())
	}

	// A long-running workload, then retirement: it is stopped and its exit
	// delivered before the agent exits 0.
	cp.push("op-sleep", api.KindLaunchWorkload, api.LaunchWorkload{RunID: "run-2", AttemptID: "a1", Command: "sleep", Args: []string{"300"}})
	testwait.For(t, "run-2 running", patience, func() bool {
		return cp.has(func() bool { _, ok := cp.workload["run-2/a1/running"]; return ok })
	}, log.String)
	cp.has(func() bool { cp.retired = true; return true })
	if code := exitCode(t, agent, log); code != 0 {
		t.Fatalf("retired agent exited %d; log:\n%s", code, log.String())
	}
	if !cp.has(func() bool {
		o, ok := cp.workload["run-2/a1/exited"]
		return ok && o.ExitCode != nil && *o.ExitCode == 143
	}) {
		t.Fatalf("run-2 exit not delivered; log:\n%s", log.String())
	}
	if !strings.Contains(log.String(), "node retired: workloads stopped") {
		t.Fatalf("no retirement line:\n%s", log.String())
	}

	// Fenced: someone else enrolled this node; the agent needs a reinvite.
	cp.has(func() bool { cp.retired = false; cp.fencing++; return true })
	agent, log = start("--allow-insecure-http")
	if code := exitCode(t, agent, log); code != 2 || !strings.Contains(log.String(), "reinvite") {
		t.Fatalf("fenced agent exited %d; log:\n%s", code, log.String())
	}
}

// identityExists is the control plane's answer to a second invitation of the
// same rental id and generation.
const identityExists = `{"type":"https://nodeward.dev/problems/identity_exists","title":"Conflict","status":409,` +
	`"detail":"rental rack-4-slot-2 generation 1 was already invited","code":"identity_exists",` +
	`"instance":"/api/v1/nodes/invitations","request_id":"4f2a"}`

func TestReadBootstrapErrorAnswer(t *testing.T) {
	file := filepath.Join(t.TempDir(), "bootstrap.json")
	os.WriteFile(file, []byte(identityExists), 0o600)
	for _, src := range []string{file, identityExists} { // a path, or the JSON itself (the environment)
		_, err := readBootstrap(src)
		if err == nil {
			t.Fatalf("%s: an error answer was taken for a bootstrap", src)
		}
		for _, want := range []string{"code=identity_exists", "status=409", "rack-4-slot-2 generation 1 was already invited", "higher generation"} {
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("%q lacks %q", err, want)
			}
		}
	}

	unauth := `{"type":"about:blank","title":"Unauthorized","status":401,"code":"unauthenticated"}`
	if _, err := readBootstrap(unauth); err == nil || !strings.Contains(err.Error(), "code=unauthenticated") ||
		!strings.Contains(err.Error(), `detail="Unauthorized"`) || !strings.Contains(err.Error(), "token") {
		t.Fatalf("got %v", err)
	}

	// A real bootstrap still reads.
	b, err := readBootstrap(`{"node_id":"n1","generation":1,"enrollment_token":"t","control_plane_url":"https://cp"}`)
	if err != nil || b.NodeID != "n1" {
		t.Fatalf("bootstrap: %+v, %v", b, err)
	}
}

func TestBinaryConfigHook(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the agent binary")
	}
	bin := buildAgent(t)
	cp := &miniCP{results: map[string]api.Result{}, workload: map[string]api.WorkloadObservation{}}
	srv := httptest.NewServer(cp.handler())
	defer srv.Close()
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "state")
	bs, _ := json.Marshal(api.Bootstrap{NodeID: "node-1", Generation: 1, EnrollmentToken: "tok", ControlPlaneURL: srv.URL, AgentVersion: "dev"})
	seen := filepath.Join(dir, "seen")
	hook := filepath.Join(dir, "apply.sh")
	os.WriteFile(hook, []byte("#!/bin/sh\necho \"$1 $2 rev=$NODEWARD_CONFIG_REVISION hash=$NODEWARD_CONFIG_HASH boot=[$NODEWARD_AGENT_BOOTSTRAP]\" >> "+seen+"\n"), 0o755)

	start := func(args ...string) (*exec.Cmd, *syncBuffer) {
		log := &syncBuffer{}
		cmd := exec.Command(bin, append([]string{"--state-dir", stateDir, "--poll-wait", "1s", "--allow-insecure-http"}, args...)...)
		// The bootstrap (an enrollment token) in the environment must not
		// reach the hook.
		cmd.Env = append(os.Environ(), "NODEWARD_AGENT_BOOTSTRAP="+string(bs))
		cmd.Stderr = log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, log
	}

	t.Run("MissingHookRefusedAtStart", func(t *testing.T) {
		cmd, log := start("--config-hook", filepath.Join(dir, "absent.sh")+" x")
		if code := exitCode(t, cmd, log); code != 1 || !strings.Contains(log.String(), "config-hook") {
			t.Fatalf("exit %d; log:\n%s", code, log.String())
		}
	})

	cp.mu.Lock()
	cp.config = &api.ConfigDelivery{Revision: 1, Hash: "h1", Format: "app/v1", Document: json.RawMessage(`{"workers":4}`)}
	cp.mu.Unlock()
	agent, log := start("--config-hook", hook+" extra", "--config-hook-timeout", "10s")
	defer func() { agent.Process.Signal(syscall.SIGTERM); exitCode(t, agent, log) }()
	testwait.For(t, "the configuration reported", patience, func() bool {
		return cp.has(func() bool { return len(cp.reports) > 0 })
	}, log.String)
	var rep api.ConfigReport
	cp.has(func() bool { rep = cp.reports[0]; return true })
	if rep != (api.ConfigReport{Revision: 1, Hash: "h1", State: api.ConfigApplied}) {
		t.Fatalf("report %+v; log:\n%s", rep, log.String())
	}
	got, _ := os.ReadFile(seen)
	if want := "extra " + filepath.Join(stateDir, "config", "current.json") + " rev=1 hash=h1 boot=[]\n"; string(got) != want {
		t.Fatalf("hook saw %q, want %q", got, want)
	}
	doc, _ := os.ReadFile(filepath.Join(stateDir, "config", "current.json"))
	if strings.TrimSpace(string(doc)) != `{"workers":4}` {
		t.Fatalf("current.json %q", doc)
	}
}

// FuzzReadBootstrap: an inline bootstrap of any shape is read or refused
// with an error, never a panic.
func FuzzReadBootstrap(f *testing.F) {
	f.Add(`{"node_id":"n","generation":1,"enrollment_token":"t","control_plane_url":"https://cp"}`)
	f.Add(`{"type":"https://nodeward.dev/problems/unauthenticated","status":401,"code":"unauthenticated"}`)
	f.Add(`{"node_id":1}`)
	f.Fuzz(func(t *testing.T, s string) {
		_, _ = readBootstrap("{" + s)
	})
}
