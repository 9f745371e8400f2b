package e2e

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"
)

// TestTorturePostgresRestart crashes a private Postgres cluster (immediate
// stop) under a command stream and starts it again, repeatedly: while the
// database is down the control plane answers clear 503s at once — readiness,
// admin reads, command submits — never a hang or a 500; when it is back the
// server recovers by itself (no restart, no operator) and every command it
// accepted is applied exactly once.
func TestTorturePostgresRestart(t *testing.T) {
	t.Parallel()
	pg := startPGCluster(t)
	cycles := TortureCycles(2)
	fig := &Figures{Fault: "Postgres crash and restart (private cluster)", Cycles: cycles, Codes: map[string]int{}}
	s := StartServer(t, ServerOptions{DatabaseURL: pg.URL()})

	var agents []*Agent
	stateDirs := map[string]string{}
	var nodes []string
	for i := range 2 {
		_, b, a := enrolledAgent(t, s, fmt.Sprintf("torture-pg-%d", i), AgentOptions{Name: fmt.Sprintf("agent-%d", i), Args: []string{"--runtime", "simulated"}})
		agents = append(agents, a)
		nodes = append(nodes, b.NodeID)
		stateDirs[b.NodeID] = a.StateDir
	}
	st := &stream{t: t, base: func() string { return s.URL }, token: s.Token, nodes: nodes, prefix: "pgrestart", payload: simulatedLaunch, pace: 50 * time.Millisecond}
	st.start()
	outage := []struct{ method, path string }{
		{http.MethodGet, "/readyz"},
		{http.MethodGet, "/api/v1/nodes"},
		{http.MethodGet, "/api/v1/commands/pgrestart-0000"},
	}
	var slowest time.Duration
	for c := range cycles {
		time.Sleep(time.Duration(300+rand.IntN(1200)) * time.Millisecond)
		pg.Crash()
		for _, o := range outage {
			began := time.Now()
			status, raw, err := TryCall(s.URL, o.method, o.path, nil, s.Token, nil)
			took := time.Since(began)
			slowest = max(slowest, took)
			switch {
			case err != nil:
				t.Errorf("cycle %d: %s %s with the database down: %v after %s (a hang, not a 503)", c, o.method, o.path, err, took)
				fig.Codes["transport_error"]++
			case status != http.StatusServiceUnavailable:
				t.Errorf("cycle %d: %s %s with the database down: %d %s, want 503", c, o.method, o.path, status, raw)
				fig.Codes[fmt.Sprintf("%d %s", status, ProblemCode(raw))]++
			default:
				code := ProblemCode(raw)
				if code == "" {
					code = "not_ready" // /readyz answers its checks, not a problem document
				}
				fig.Codes[fmt.Sprintf("%d %s", status, code)]++
			}
			if took > 15*time.Second {
				t.Errorf("cycle %d: %s %s took %s with the database down (a hang)", c, o.method, o.path, took)
			}
		}
		pg.Start()
		back := time.Now()
		fig.Recovered(st.probe(fmt.Sprintf("pgrestart-probe-%03d", c), nodes[c%len(nodes)], back))
	}
	ops := st.finish()
	verifyExactlyOnce(t, fig, s.URL, s.Token, ops, stateDirs, launchCounts(agents...))
	st.mu.Lock()
	for k, v := range st.codes {
		fig.Codes["stream: "+k] += v
	}
	for _, r := range st.rejected {
		t.Errorf("refused: %s", r)
	}
	st.mu.Unlock()
	fig.Notes = append(fig.Notes, fmt.Sprintf("slowest answer while the database was down: %s; recovery is measured from the database accepting connections again to a new command applied", slowest.Round(time.Millisecond)))
	fig.Report(t)
}
