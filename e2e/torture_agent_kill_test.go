package e2e

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/internal/testwait"
)

// TestTortureAgentKill9 kills agents with SIGKILL at random moments while a
// stream of launches runs — every other cycle right after the agent logged
// a launch, which lands between applying a command and recording or
// reporting it — and starts them again on their state dirs: every command
// ends applied, every workload ran exactly once (each appends a line to a
// marker file outside the state dir) and every workload exit is reported.
func TestTortureAgentKill9(t *testing.T) {
	t.Parallel()
	cycles := TortureCycles(2)
	s := StartServer(t, ServerOptions{})
	fig := &Figures{Fault: "agent kill -9 (process runtime)", Cycles: cycles}
	markers := t.TempDir()

	var agents []*Agent
	stateDirs := map[string]string{}
	var nodes []string
	for i := range 2 {
		_, b, a := enrolledAgent(t, s, fmt.Sprintf("torture-agent-%d", i), AgentOptions{Name: fmt.Sprintf("agent-%d", i)})
		agents = append(agents, a)
		nodes = append(nodes, b.NodeID)
		stateDirs[b.NodeID] = a.StateDir
	}
	launch := func(run string) (string, any) {
		return api.KindLaunchWorkload, launchPayload(run, `echo x >> "$MARKER_DIR/$NODEWARD_RUN_ID"`, map[string]string{"MARKER_DIR": markers})
	}
	st := &stream{t: t, base: func() string { return s.URL }, token: s.Token, nodes: nodes, prefix: "agentkill", payload: launch, pace: 80 * time.Millisecond}
	st.start()
	for c := range cycles {
		i := c % len(agents)
		a := agents[i]
		if c%2 == 1 {
			// Right after a launch: the effect happened, its result may
			// not be recorded or reported yet.
			before := len(a.RunLogs("workload launched"))
			testwait.For(t, "a launch to kill after", time.Minute, func() bool { return len(a.RunLogs("workload launched")) > before })
		} else {
			time.Sleep(time.Duration(100+rand.IntN(1400)) * time.Millisecond)
		}
		killed := time.Now()
		a.Kill(t)
		a.Start(t)
		fig.Recovered(st.probe(fmt.Sprintf("agentkill-probe-%03d", c), nodes[i], killed))
	}
	ops := st.finish()
	verifyExactlyOnce(t, fig, s.URL, s.Token, ops, stateDirs, func(op issued) int {
		lines, err := readLines(filepath.Join(markers, op.Run))
		if err != nil {
			t.Fatal(err)
		}
		return len(lines)
	})
	f := fleetAPI{t: t, s: s}
	for _, op := range ops {
		w := f.waitWorkload(op.Node, op.Run, "a1", "exited", 3*time.Minute)
		if w.ExitCode == nil || *w.ExitCode != 0 {
			t.Errorf("%s: exit code %v, want 0", op.Run, w.ExitCode)
		}
	}
	resolved := 0
	for _, a := range agents {
		resolved += len(a.Logs("resolving operation interrupted by the last shutdown"))
	}
	st.mu.Lock()
	fig.Codes = st.codes
	for _, r := range st.rejected {
		t.Errorf("refused: %s", r)
	}
	st.mu.Unlock()
	fig.Notes = append(fig.Notes, fmt.Sprintf("%d operations interrupted by a kill were resolved from the journal at restart", resolved))
	fig.Report(t)
}
