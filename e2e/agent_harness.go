package e2e

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
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

// Agent is one nodeward-agent process over a state directory; Start runs it
// (again) on the same directory, as a machine's service manager would.
type Agent struct {
	StateDir string
	// Args are added to every start (after the common flags).
	Args []string

	name string
	bin  string

	mu     sync.Mutex // guards the following
	cmd    *exec.Cmd
	exited chan struct{}
	lines  []string // every log line of every run, in order
	starts int
	runAt  int // index in lines where the current run's lines begin
}

// AgentOptions say how to start an agent the first time.
type AgentOptions struct {
	// Name labels the agent in failure logs.
	Name string
	// Bootstrap is the invitation's answer (raw JSON), written to a file
	// and passed with --bootstrap on the first start only; nil starts
	// from the state directory alone.
	Bootstrap []byte
	// StateDir defaults to a fresh temp directory.
	StateDir string
	// Args are passed on every start, e.g. --runtime simulated.
	Args []string
}

// NewAgent prepares an agent without starting it.
func NewAgent(t testing.TB, o AgentOptions) *Agent {
	t.Helper()
	_, bin := Binaries(t)
	a := &Agent{StateDir: o.StateDir, Args: o.Args, name: o.Name, bin: bin}
	if a.StateDir == "" {
		a.StateDir = filepath.Join(t.TempDir(), "state")
	}
	if a.name == "" {
		a.name = "agent"
	}
	t.Cleanup(func() {
		a.Kill(t)
		killWorkloads(a.StateDir)
		if t.Failed() {
			t.Logf("%s log:\n%s", a.name, strings.Join(a.Lines(), "\n"))
		}
	})
	return a
}

// StartAgent prepares an agent and starts it, with --bootstrap when the
// options carry one.
func StartAgent(t testing.TB, o AgentOptions) *Agent {
	t.Helper()
	a := NewAgent(t, o)
	var extra []string
	if o.Bootstrap != nil {
		extra = append(extra, "--bootstrap", writeBootstrap(t, o.Bootstrap))
	}
	a.Start(t, extra...)
	return a
}

func writeBootstrap(t testing.TB, raw []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "bootstrap.json")
	if err := os.WriteFile(p, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Start runs the agent process with the common flags, a.Args and extra.
// It does not wait for anything; use WaitLog or the API.
func (a *Agent) Start(t testing.TB, extra ...string) {
	t.Helper()
	a.mu.Lock()
	if a.cmd != nil {
		select {
		case <-a.exited:
		default:
			a.mu.Unlock()
			t.Fatalf("%s: Start while running", a.name)
		}
	}
	a.mu.Unlock()
	args := []string{"--state-dir", a.StateDir, "--allow-insecure-http", "--poll-wait", "5s", "--log-format", "json"}
	args = append(append(args, a.Args...), extra...)
	cmd := exec.Command(a.bin, args...)
	// Nothing of the test's environment that could steer the agent.
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "NODEWARD_") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", a.name, err)
	}
	pw.Close()
	exited := make(chan struct{})
	var readDone sync.WaitGroup
	readDone.Add(1)
	a.mu.Lock()
	a.starts++
	run := a.starts
	a.cmd, a.exited = cmd, exited
	a.runAt = len(a.lines)
	a.lines = append(a.lines, fmt.Sprintf(`{"msg":"e2e: start %d","args":%q}`, run, strings.Join(args, " ")))
	a.mu.Unlock()
	go func() {
		defer readDone.Done()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			a.mu.Lock()
			a.lines = append(a.lines, sc.Text())
			a.mu.Unlock()
		}
		pr.Close()
	}()
	go func() {
		_ = cmd.Wait()
		readDone.Wait()
		close(exited)
	}()
}

// Running reports whether the current process is alive.
func (a *Agent) Running() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd == nil {
		return false
	}
	select {
	case <-a.exited:
		return false
	default:
		return true
	}
}

// Signal sends sig to the running process (nothing if it is not running).
func (a *Agent) Signal(sig syscall.Signal) {
	a.mu.Lock()
	cmd := a.cmd
	a.mu.Unlock()
	if cmd != nil && a.Running() {
		_ = cmd.Process.Signal(sig)
	}
}

// Kill sends SIGKILL and waits for the process to be gone. Workloads keep
// running under their supervisors, as on a real machine.
func (a *Agent) Kill(t testing.TB) {
	t.Helper()
	if !a.Running() {
		return
	}
	a.Signal(syscall.SIGKILL)
	a.Wait(t, 30*time.Second)
}

// Stop sends SIGTERM and answers the exit code.
func (a *Agent) Stop(t testing.TB) int {
	t.Helper()
	a.Signal(syscall.SIGTERM)
	return a.Wait(t, 60*time.Second)
}

// Wait waits for the process to exit and answers its exit code (-1 when a
// signal ended it).
func (a *Agent) Wait(t testing.TB, timeout time.Duration) int {
	t.Helper()
	a.mu.Lock()
	cmd, exited := a.cmd, a.exited
	a.mu.Unlock()
	if cmd == nil {
		t.Fatalf("%s was never started", a.name)
	}
	select {
	case <-exited:
	case <-time.After(timeout):
		t.Fatalf("%s did not exit within %s", a.name, timeout)
	}
	return cmd.ProcessState.ExitCode()
}

// Lines answers every log line so far (all runs).
func (a *Agent) Lines() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.lines...)
}

// Logs answers the decoded JSON log records whose msg is msg (all runs).
func (a *Agent) Logs(msg string) []map[string]any {
	return filterLogs(a.Lines(), msg)
}

// RunLogs is Logs for the current (or last) run only.
func (a *Agent) RunLogs(msg string) []map[string]any {
	a.mu.Lock()
	lines := append([]string(nil), a.lines[a.runAt:]...)
	a.mu.Unlock()
	return filterLogs(lines, msg)
}

func filterLogs(lines []string, msg string) []map[string]any {
	var out []map[string]any
	for _, l := range lines {
		var rec map[string]any
		if json.Unmarshal([]byte(l), &rec) != nil {
			continue
		}
		if rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

// WaitLog waits until the current run logged a record with msg satisfying
// match (nil: any), and answers it.
func (a *Agent) WaitLog(t testing.TB, msg string, timeout time.Duration, match func(map[string]any) bool) map[string]any {
	t.Helper()
	var found map[string]any
	testwait.For(t, fmt.Sprintf("%s to log %q", a.name, msg), timeout, func() bool {
		for _, rec := range a.RunLogs(msg) {
			if match == nil || match(rec) {
				found = rec
				return true
			}
		}
		return false
	})
	return found
}

// killWorkloads ends whatever process groups the state dir's supervisors
// started, so no test leaves a workload behind (the supervisors then record
// the exit and end).
func killWorkloads(stateDir string) {
	matches, _ := filepath.Glob(filepath.Join(stateDir, "workloads", "*", "attempts", "*", "status.json"))
	for _, m := range matches {
		if _, err := os.Stat(filepath.Join(filepath.Dir(m), "exit.json")); err == nil {
			continue
		}
		raw, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		var st struct {
			PGID int `json:"pgid"`
		}
		if json.Unmarshal(raw, &st) == nil && st.PGID > 1 {
			_ = syscall.Kill(-st.PGID, syscall.SIGKILL)
		}
	}
}

// fleetAPI drives the admin API of one server for agent tests.
type fleetAPI struct {
	t testing.TB
	s *Server
}

// commandRecord is GET /api/v1/commands/{operation_id}.
type commandRecord struct {
	OperationID    string          `json:"operation_id"`
	NodeID         string          `json:"node_id"`
	Kind           string          `json:"kind"`
	State          string          `json:"state"`
	FencingToken   int64           `json:"fencing_token"`
	Payload        json.RawMessage `json:"payload"`
	FailureCode    string          `json:"failure_code"`
	FailureMessage string          `json:"failure_message"`
	DeliveryCount  int             `json:"delivery_count"`
}

// nodeRecord is GET /api/v1/nodes/{id}.
type nodeRecord struct {
	NodeID          string     `json:"node_id"`
	State           string     `json:"state"`
	FencingToken    int64      `json:"fencing_token"`
	LastHeartbeatAt *time.Time `json:"last_heartbeat_at"`
	AgentVersion    string     `json:"agent_version"`
	Facts           *api.Facts `json:"facts"`
	Disk            struct {
		State     string `json:"state"`
		FreeBytes *int64 `json:"free_bytes"`
	} `json:"disk"`
}

// workloadState is GET /api/v1/nodes/{id}/workloads/{run}/{attempt}.
type workloadState struct {
	RunID     string `json:"run_id"`
	AttemptID string `json:"attempt_id"`
	State     string `json:"state"`
	ExitCode  *int   `json:"exit_code"`
}

// invite asks for a bootstrap and answers it decoded and raw.
func (f fleetAPI) invite(rental string, generation int64) (api.Bootstrap, []byte) {
	f.t.Helper()
	status, raw := f.s.Call(f.t, http.MethodPost, "/api/v1/nodes/invitations",
		map[string]any{"rental_id": rental, "generation": generation}, f.s.Token)
	if status != http.StatusCreated {
		f.t.Fatalf("invite: status %d: %s", status, raw)
	}
	var b api.Bootstrap
	if err := json.Unmarshal(raw, &b); err != nil {
		f.t.Fatalf("invite: %v: %s", err, raw)
	}
	return b, raw
}

// reinvite answers a bootstrap for the node again.
func (f fleetAPI) reinvite(nodeID string) (api.Bootstrap, []byte) {
	f.t.Helper()
	status, raw := f.s.Call(f.t, http.MethodPost, "/api/v1/nodes/"+nodeID+"/reinvite", map[string]any{}, f.s.Token)
	if status != http.StatusOK {
		f.t.Fatalf("reinvite: status %d: %s", status, raw)
	}
	var b api.Bootstrap
	if err := json.Unmarshal(raw, &b); err != nil {
		f.t.Fatalf("reinvite: %v: %s", err, raw)
	}
	return b, raw
}

// issue records a command for the node (201).
func (f fleetAPI) issue(nodeID, kind, operationID string, payload any) {
	f.t.Helper()
	f.s.API(f.t, http.MethodPost, "/api/v1/nodes/"+nodeID+"/commands",
		map[string]any{"kind": kind, "operation_id": operationID, "payload": payload}, http.StatusCreated, nil)
}

func (f fleetAPI) command(operationID string) commandRecord {
	f.t.Helper()
	var c commandRecord
	f.s.API(f.t, http.MethodGet, "/api/v1/commands/"+operationID, nil, http.StatusOK, &c)
	return c
}

// waitSettled waits until the command is no longer pending and answers it.
func (f fleetAPI) waitSettled(operationID string, timeout time.Duration) commandRecord {
	f.t.Helper()
	var c commandRecord
	testwait.For(f.t, "command "+operationID+" to settle", timeout, func() bool {
		c = f.command(operationID)
		return c.State != "pending"
	})
	return c
}

// waitApplied waits until the command settled and fails unless it was applied.
func (f fleetAPI) waitApplied(operationID string, timeout time.Duration) commandRecord {
	f.t.Helper()
	c := f.waitSettled(operationID, timeout)
	if c.State != "applied" {
		f.t.Fatalf("command %s: state %s (%s: %s), want applied", operationID, c.State, c.FailureCode, c.FailureMessage)
	}
	return c
}

func (f fleetAPI) node(nodeID string) nodeRecord {
	f.t.Helper()
	var n nodeRecord
	f.s.API(f.t, http.MethodGet, "/api/v1/nodes/"+nodeID, nil, http.StatusOK, &n)
	return n
}

func (f fleetAPI) waitNodeState(nodeID, state string, timeout time.Duration) nodeRecord {
	f.t.Helper()
	var n nodeRecord
	testwait.For(f.t, "node "+nodeID+" to be "+state, timeout, func() bool {
		n = f.node(nodeID)
		return n.State == state
	})
	return n
}

func (f fleetAPI) workload(nodeID, run, attempt string) workloadState {
	f.t.Helper()
	var w workloadState
	f.s.API(f.t, http.MethodGet, "/api/v1/nodes/"+nodeID+"/workloads/"+run+"/"+attempt, nil, http.StatusOK, &w)
	return w
}

func (f fleetAPI) waitWorkload(nodeID, run, attempt, state string, timeout time.Duration) workloadState {
	f.t.Helper()
	var w workloadState
	testwait.For(f.t, fmt.Sprintf("workload %s/%s to be %s", run, attempt, state), timeout, func() bool {
		w = f.workload(nodeID, run, attempt)
		return w.State == state
	})
	return w
}

// workloadOutput is GET /api/v1/nodes/{id}/workloads/{run}/{attempt}/output.
type workloadOutput struct {
	StdoutTail string `json:"stdout_tail"`
	StderrTail string `json:"stderr_tail"`
	Truncated  bool   `json:"truncated"`
}

// waitOutput waits for the attempt's output to be uploaded (404 until then).
func (f fleetAPI) waitOutput(nodeID, run, attempt string, timeout time.Duration) workloadOutput {
	f.t.Helper()
	var o workloadOutput
	path := "/api/v1/nodes/" + nodeID + "/workloads/" + run + "/" + attempt + "/output"
	testwait.For(f.t, fmt.Sprintf("output of %s/%s", run, attempt), timeout, func() bool {
		status, raw := f.s.Call(f.t, http.MethodGet, path, nil, f.s.Token)
		if status == http.StatusNotFound {
			return false
		}
		if status != http.StatusOK {
			f.t.Fatalf("GET %s: status %d: %s", path, status, raw)
		}
		if err := json.Unmarshal(raw, &o); err != nil {
			f.t.Fatalf("GET %s: decode: %v: %s", path, err, raw)
		}
		return true
	})
	return o
}

// sessionHeld reports whether a long-poll of the node is held now.
func (f fleetAPI) sessionHeld(nodeID string) bool {
	f.t.Helper()
	var out struct {
		Sessions []struct {
			NodeID string `json:"node_id"`
		} `json:"sessions"`
	}
	f.s.API(f.t, http.MethodGet, "/api/v1/sessions", nil, http.StatusOK, &out)
	for _, s := range out.Sessions {
		if s.NodeID == nodeID {
			return true
		}
	}
	return false
}

// reconciliation is GET /api/v1/nodes/{id}/reconciliation.
type reconciliation struct {
	Applied   []string        `json:"applied_operation_ids"`
	Pending   []string        `json:"pending_operation_ids"`
	Workloads []workloadState `json:"workloads"`
}

func (f fleetAPI) reconcile(nodeID string) reconciliation {
	f.t.Helper()
	var r reconciliation
	f.s.API(f.t, http.MethodGet, "/api/v1/nodes/"+nodeID+"/reconciliation", nil, http.StatusOK, &r)
	return r
}

// launchPayload is a launch_workload payload for `sh -c script`.
func launchPayload(run, script string, env map[string]string) api.LaunchWorkload {
	return api.LaunchWorkload{RunID: run, AttemptID: "a1", Command: "sh", Args: []string{"-c", script}, Env: env}
}

// readLines answers the lines of a file (nil when it does not exist).
func readLines(path string) ([]string, error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	s := strings.TrimSuffix(string(raw), "\n")
	if s == "" {
		return []string{}, nil
	}
	return strings.Split(s, "\n"), nil
}

// enrolledAgent invites a node, starts an agent with the bootstrap and waits
// until the node is ready.
func enrolledAgent(t testing.TB, s *Server, rental string, o AgentOptions) (fleetAPI, api.Bootstrap, *Agent) {
	t.Helper()
	f := fleetAPI{t: t, s: s}
	b, raw := f.invite(rental, 1)
	o.Bootstrap = raw
	a := StartAgent(t, o)
	a.WaitLog(t, "enrolled", time.Minute, nil)
	f.waitNodeState(b.NodeID, "ready", time.Minute)
	return f, b, a
}
