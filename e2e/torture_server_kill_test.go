package e2e

import (
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/nodeward/nodeward/agent/api"
)

// simulatedLaunch is a launch the simulated runtime runs and ends at once
// with exit code 0.
func simulatedLaunch(run string) (string, any) {
	return api.KindLaunchWorkload, api.LaunchWorkload{RunID: run, AttemptID: "a1", Command: "exit", Args: []string{"0"}}
}

// TestTortureServerKill9 kills the control plane with SIGKILL at random
// moments while agents run a stream of commands, and starts it again on the
// same database: afterwards every command the API accepted was applied
// exactly once on its node (the agents' logs count the effects, their
// journals hold the record), the server and the ledger agree, and nothing
// was lost. An answer lost to the kill is recovered by retrying with the
// same Idempotency-Key.
func TestTortureServerKill9(t *testing.T) {
	t.Parallel()
	cycles := TortureCycles(2)
	s := StartServer(t, ServerOptions{})
	fig := &Figures{Fault: "control plane kill -9 (SQLite)", Cycles: cycles}

	var agents []*Agent
	stateDirs := map[string]string{}
	var nodes []string
	for i := range 2 {
		_, b, a := enrolledAgent(t, s, fmt.Sprintf("torture-cp-%d", i), AgentOptions{Name: fmt.Sprintf("agent-%d", i), Args: []string{"--runtime", "simulated"}})
		agents = append(agents, a)
		nodes = append(nodes, b.NodeID)
		stateDirs[b.NodeID] = a.StateDir
	}
	st := &stream{t: t, base: func() string { return s.URL }, token: s.Token, nodes: nodes, prefix: "cpkill", payload: simulatedLaunch, pace: 40 * time.Millisecond}
	st.start()
	for c := range cycles {
		// A random moment: the stream keeps issuing, agents keep polling
		// and reporting, so the kill lands between any two steps.
		time.Sleep(time.Duration(200+rand.IntN(1300)) * time.Millisecond)
		killed := time.Now()
		s.Stop(t, syscall.SIGKILL)
		s.Start(t)
		fig.Recovered(st.probe(fmt.Sprintf("cpkill-probe-%03d", c), nodes[c%len(nodes)], killed))
	}
	ops := st.finish()
	verifyExactlyOnce(t, fig, s.URL, s.Token, ops, stateDirs, launchCounts(agents...))
	for _, node := range nodes {
		f := fleetAPI{t: t, s: s}
		if rec := f.reconcile(node); len(rec.Pending) != 0 {
			t.Errorf("node %s: reconciliation still lists pending %v", node, rec.Pending)
		}
	}
	st.mu.Lock()
	fig.Codes = st.codes
	fig.Notes = append(fig.Notes, fmt.Sprintf("%d answers lost to a kill were recovered by retrying with the same Idempotency-Key (answered 200, recorded once)", st.replays))
	for _, r := range st.rejected {
		t.Errorf("refused: %s", r)
	}
	st.mu.Unlock()
	fig.Report(t)
}
