package e2e

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nodeward/nodeward/agent/api"
)

// TestAgentRetirement retires a node under a running workload: the agent
// stops the workload (SIGTERM), reports its exit, and exits 0; the node is
// retired and refuses new work, and the agent started again on the same
// state dir learns it is retired and exits 0 again.
func TestAgentRetirement(t *testing.T) {
	t.Parallel()
	s := StartServer(t, ServerOptions{})
	f, b, a := enrolledAgent(t, s, "e2e-retire", AgentOptions{Name: "agent", Args: []string{"--retire-grace", "1s"}})
	node := b.NodeID

	f.issue(node, api.KindLaunchWorkload, "retire-sleep", api.LaunchWorkload{RunID: "long", AttemptID: "a1", Command: "sleep", Args: []string{"300"}})
	f.waitApplied("retire-sleep", time.Minute)
	f.waitWorkload(node, "long", "a1", "running", time.Minute)
	var st struct {
		PGID int `json:"pgid"`
	}
	raw, err := os.ReadFile(filepath.Join(a.StateDir, "workloads", "long", "attempts", "a1", "status.json"))
	if err != nil || json.Unmarshal(raw, &st) != nil || st.PGID <= 1 {
		t.Fatalf("workload status.json: %s, %v", raw, err)
	}

	s.API(t, http.MethodPost, "/api/v1/nodes/"+node+"/retire", map[string]any{}, http.StatusOK, nil)
	if code := a.Wait(t, 2*time.Minute); code != 0 {
		t.Fatalf("agent exit code after retirement: %d, want 0", code)
	}
	done := a.WaitLog(t, "node retired: workloads stopped, exits and results delivered; exiting", time.Second, nil)
	if done["stopped_workloads"] != float64(1) {
		t.Errorf("stopped_workloads %v, want 1", done["stopped_workloads"])
	}
	// The exit was delivered before the agent exited: no waiting here.
	w := f.workload(node, "long", "a1")
	if w.State != "exited" || w.ExitCode == nil || *w.ExitCode != 128+int(syscall.SIGTERM) {
		t.Errorf("workload after retirement: %s, exit_code %v; want exited with %d (SIGTERM)", w.State, w.ExitCode, 128+int(syscall.SIGTERM))
	}
	if err := syscall.Kill(-st.PGID, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the workload's process group %d is still there (kill 0: %v)", st.PGID, err)
	}
	if n := f.node(node); n.State != "retired" {
		t.Errorf("node state %s, want retired", n.State)
	}
	status, body := s.Call(t, http.MethodPost, "/api/v1/nodes/"+node+"/commands",
		map[string]any{"kind": api.KindLaunchWorkload, "operation_id": "retire-late", "payload": launchPayload("late", "exit 0", nil)}, s.Token)
	if status != http.StatusGone {
		t.Errorf("command for a retired node: status %d (%s), want 410", status, body)
	}

	// Started again (say by a service manager), it is told at once.
	a.Start(t)
	if code := a.Wait(t, 2*time.Minute); code != 0 {
		t.Errorf("agent restarted after retirement: exit code %d, want 0", code)
	}
}
