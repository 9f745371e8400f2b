package e2e

import (
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/internal/testwait"
)

// resultsGate is an HTTP proxy in front of one server that can hold back
// the agents' result reports: "block" refuses them before the server sees
// them, "lose" lets the server settle them and loses its answer.
type resultsGate struct {
	URL  string
	mode atomic.Value // "", "block" or "lose"
	seen atomic.Int64 // result reports held back
}

func startResultsGate(t *testing.T) (*resultsGate, func(target string)) {
	t.Helper()
	g := &resultsGate{}
	g.mode.Store("")
	var proxy atomic.Pointer[httputil.ReverseProxy]
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := proxy.Load()
		if p == nil {
			http.Error(w, "no backend", http.StatusBadGateway)
			return
		}
		if r.URL.Path == "/agent/v1/results" {
			switch g.mode.Load() {
			case "block":
				g.seen.Add(1)
				http.Error(w, "held back by the test", http.StatusBadGateway)
				return
			case "lose":
				g.seen.Add(1)
				rec := &discard{header: http.Header{}}
				p.ServeHTTP(rec, r)
				http.Error(w, "answer lost by the test", http.StatusBadGateway)
				return
			}
		}
		p.ServeHTTP(w, r)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g.URL = "http://" + ln.Addr().String()
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return g, func(target string) {
		u, err := url.Parse(target)
		if err != nil {
			t.Fatal(err)
		}
		p := httputil.NewSingleHostReverseProxy(u)
		p.FlushInterval = -1
		p.ErrorLog = log.New(io.Discard, "", 0) // held long-polls cut by a kill are expected
		proxy.Store(p)
	}
}

// discard is a ResponseWriter that drops the answer.
type discard struct{ header http.Header }

func (d *discard) Header() http.Header         { return d.header }
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) WriteHeader(int)             {}

// TestTortureAgentKillBeforeReport kills the agent exactly between applying
// a command and the server learning of it, deterministically: its result
// reports are held back (or reach the server and the answer is lost) while
// the workload runs and the journal records it done, then the agent is
// killed with SIGKILL and started again. The restarted agent reports the
// result from its journal; nothing runs twice, the exit is reported.
func TestTortureAgentKillBeforeReport(t *testing.T) {
	t.Parallel()
	cycles := TortureCycles(2)
	gate, setBackend := startResultsGate(t)
	s := StartServer(t, ServerOptions{Env: []string{"NODEWARD_PUBLIC_URL=" + gate.URL}})
	setBackend(s.URL)
	fig := &Figures{Fault: "agent kill -9 between applying and reporting", Cycles: cycles, Codes: map[string]int{}}
	markers := t.TempDir()
	f, b, a := enrolledAgent(t, s, "torture-gap", AgentOptions{Name: "agent"})
	node := b.NodeID
	var ops []issued
	for c := range cycles {
		mode := []string{"block", "lose"}[c%2]
		gate.mode.Store(mode)
		id := fmt.Sprintf("gap-%03d", c)
		f.issue(node, api.KindLaunchWorkload, id, launchPayload(id, `echo x >> "$MARKER_DIR/$NODEWARD_RUN_ID"`, map[string]string{"MARKER_DIR": markers}))
		ops = append(ops, issued{ID: id, Node: node, Run: id})
		before := gate.seen.Load()
		testwait.For(t, id+" applied on the node and its report held back", 2*time.Minute, func() bool {
			rec, ok, _ := readJournal(a.StateDir, id)
			return ok && rec.State == "done" && gate.seen.Load() > before
		})
		if st := f.command(id).State; mode == "block" && st != "pending" {
			t.Errorf("%s: the server settled it (%s) although its report was held back", id, st)
		}
		fig.Codes["report "+mode]++
		killed := time.Now()
		a.Kill(t)
		gate.mode.Store("")
		a.Start(t)
		f.waitApplied(id, 2*time.Minute)
		fig.Recovered(time.Since(killed))
	}
	verifyExactlyOnce(t, fig, s.URL, s.Token, ops, map[string]string{node: a.StateDir}, func(op issued) int {
		lines, err := readLines(filepath.Join(markers, op.Run))
		if err != nil {
			t.Fatal(err)
		}
		return len(lines)
	})
	for _, op := range ops {
		if w := f.waitWorkload(node, op.Run, "a1", "exited", 2*time.Minute); w.ExitCode == nil || *w.ExitCode != 0 {
			t.Errorf("%s: exit %v, want 0", op.Run, w.ExitCode)
		}
	}
	fig.Notes = append(fig.Notes, "each cycle alternates a report refused before the server saw it and a report settled by the server whose answer was lost; the agent is killed with the result only in its journal")
	fig.Report(t)
}
