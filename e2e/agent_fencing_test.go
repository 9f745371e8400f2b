package e2e

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodeward/nodeward/agent/api"
)

// TestAgentFencing reinvites a node and enrolls a second agent process with
// the fresh bootstrap: the first agent is fenced and exits 2 saying a
// reinvite is needed (and keeps saying so when started again), while the
// second carries on with the node's work.
func TestAgentFencing(t *testing.T) {
	t.Parallel()
	s := StartServer(t, ServerOptions{})
	f, b, first := enrolledAgent(t, s, "e2e-fencing", AgentOptions{Name: "agent-1"})
	node := b.NodeID
	f.issue(node, api.KindLaunchWorkload, "fencing-first", launchPayload("first", "exit 0", nil))
	f.waitApplied("fencing-first", time.Minute)
	oldToken := f.node(node).FencingToken

	nb, raw := f.reinvite(node)
	if nb.EnrollmentToken == b.EnrollmentToken {
		t.Fatalf("reinvite of a redeemed invitation handed back the spent token")
	}
	second := StartAgent(t, AgentOptions{Name: "agent-2", Bootstrap: raw})
	enrolled := second.WaitLog(t, "enrolled", time.Minute, nil)
	newToken, _ := enrolled["fencing_token"].(float64)
	if int64(newToken) <= oldToken {
		t.Fatalf("second enrollment fencing_token %v, want above %d", enrolled["fencing_token"], oldToken)
	}

	if code := first.Wait(t, 2*time.Minute); code != 2 {
		t.Fatalf("fenced agent exit code %d, want 2", code)
	}
	fatal := first.WaitLog(t, "fatal: this node needs a reinvite", time.Second, nil)
	if fatal["code"] != "fenced" {
		t.Errorf("fenced agent: code %v, want fenced", fatal["code"])
	}
	if n := f.node(node); n.FencingToken != int64(newToken) || n.State != "ready" {
		t.Errorf("node: state %s, fencing_token %d; want ready at %v", n.State, n.FencingToken, newToken)
	}

	// The second agent does the node's work now.
	f.issue(node, api.KindLaunchWorkload, "fencing-second", launchPayload("second", "exit 0", nil))
	c := f.waitApplied("fencing-second", time.Minute)
	if c.FencingToken != int64(newToken) {
		t.Errorf("command fencing_token %d, want %v", c.FencingToken, newToken)
	}
	if w := f.waitWorkload(node, "second", "a1", "exited", time.Minute); w.ExitCode == nil || *w.ExitCode != 0 {
		t.Errorf("second: exit_code %v, want 0", w.ExitCode)
	}
	if _, err := os.Stat(filepath.Join(second.StateDir, "workloads", "second", "attempts", "a1", "exit.json")); err != nil {
		t.Errorf("the second agent did not run the workload: %v", err)
	}
	if _, err := os.Stat(filepath.Join(first.StateDir, "workloads", "second")); err == nil {
		t.Errorf("the fenced agent ran work issued after it was fenced")
	}

	// Restarted without a new bootstrap, the fenced agent stops at once.
	first.Start(t)
	if code := first.Wait(t, time.Minute); code != 2 {
		t.Errorf("fenced agent restarted: exit code %d, want 2", code)
	}
	if code := second.Stop(t); code != 0 {
		t.Errorf("second agent exit code after SIGTERM: %d, want 0", code)
	}
}
