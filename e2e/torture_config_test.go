package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodeward/nodeward/internal/testwait"
	"github.com/nodeward/nodeward/metrics"
)

// cfgTortureHook is the apply hook the configuration torture gives every
// agent: it appends "revision hash" to the node's log ($1) before anything
// else — a line is a run of the hook, whatever happens next — notes in
// $1.overlaps when it starts while another run is still going (a run
// orphaned by killing its agent), checks the document it was handed is
// there and sleeps up to ~0.8 s, so a kill lands between writing the
// configuration and reporting it.
const cfgTortureHook = `#!/bin/sh
echo "$NODEWARD_CONFIG_REVISION $NODEWARD_CONFIG_HASH" >> "$1"
if p=$(cat "$1.running" 2>/dev/null) && kill -0 "$p" 2>/dev/null; then echo "$NODEWARD_CONFIG_REVISION" >> "$1.overlaps"; fi
echo $$ > "$1.running"
test -z "$2" || test -s "$2" || { echo "document $2 missing" >&2; exit 1; }
r=$(od -An -N1 -tu1 /dev/urandom | tr -d ' ')
sleep "$(printf '0.%03d' $((r * 3)))"
[ "$(cat "$1.running")" != $$ ] || rm -f "$1.running"
exit 0
`

// cfgTortureNode is GET /api/v1/nodes/{id}/config, the parts the suite reads.
type cfgTortureNode struct {
	Desired *struct {
		Revision int64  `json:"revision"`
		Hash     string `json:"hash"`
	} `json:"desired"`
	Reported *struct {
		Revision int64  `json:"revision"`
		Hash     string `json:"hash"`
		State    string `json:"state"`
	} `json:"reported"`
	AppliedRevision int64  `json:"applied_revision"`
	Verdict         string `json:"verdict"`
	Lagging         bool   `json:"lagging"`
}

// cfgTortureLagging is GET /api/v1/config/lagging.
type cfgTortureLagging struct {
	Count         int64 `json:"count"`
	NeverReported int64 `json:"never_reported"`
	Nodes         []struct {
		NodeID string `json:"node_id"`
	} `json:"nodes"`
}

// cfgTortureRig is the configuration torture's fleet: agents with the logging
// hook, the server, and the configure operations it accepted.
type cfgTortureRig struct {
	t      *testing.T
	s      *Server
	nodes  []string
	agents []*Agent
	logs   []string // the hook log of each node

	mu      sync.Mutex // guards the following
	codes   map[string]int
	replays int
	fleetOp []string // fleet.configure operation ids
	nodeOps []int    // node.configure operations accepted, by node
}

func newCfgTortureRig(t *testing.T, s *Server, n int) *cfgTortureRig {
	t.Helper()
	dir := t.TempDir()
	hook := filepath.Join(dir, "hook.sh")
	if err := os.WriteFile(hook, []byte(cfgTortureHook), 0o700); err != nil {
		t.Fatal(err)
	}
	r := &cfgTortureRig{t: t, s: s, codes: map[string]int{}, nodeOps: make([]int, n)}
	for i := range n {
		log := filepath.Join(dir, fmt.Sprintf("node-%d.log", i))
		_, b, a := enrolledAgent(t, s, fmt.Sprintf("torture-config-%d", i), AgentOptions{Name: fmt.Sprintf("agent-%d", i),
			Args: []string{"--runtime", "simulated", "--config-hook", hook + " " + log}})
		r.nodes, r.agents, r.logs = append(r.nodes, b.NodeID), append(r.agents, a), append(r.logs, log)
	}
	return r
}

// submit records a configure operation, retrying with the same request id
// until the API answers it (an answer lost to a killed server is recovered
// by the replay, never recorded twice); it answers the operation's id.
func (r *cfgTortureRig) submit(requestID, kind string, targets []any, operation map[string]any) (string, bool) {
	body := map[string]any{"request_id": requestID, "kind": kind, "targets": targets, "operation": operation}
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		status, raw, err := TryCall(r.s.URL, http.MethodPost, "/api/v1/operations", body, r.s.Token, nil)
		r.mu.Lock()
		switch {
		case err != nil:
			r.codes["transport_error"]++
		case status == http.StatusCreated || status == http.StatusOK:
			if status == http.StatusOK {
				r.replays++
			}
			r.mu.Unlock()
			var op struct {
				OperationID string `json:"operation_id"`
			}
			if err := json.Unmarshal(raw, &op); err != nil || op.OperationID == "" {
				r.t.Errorf("%s: answer without an operation id: %s", requestID, raw)
				return "", false
			}
			return op.OperationID, true
		case status >= 500 || status == http.StatusTooManyRequests:
			r.codes[fmt.Sprintf("%d %s", status, ProblemCode(raw))]++
		default:
			r.mu.Unlock()
			r.t.Errorf("%s %s: refused %d %s", kind, requestID, status, raw)
			return "", false
		}
		r.mu.Unlock()
		time.Sleep(100 * time.Millisecond) // retry pacing, not a wait for a condition
	}
	r.t.Errorf("%s %s: the API did not answer within 3 minutes", kind, requestID)
	return "", false
}

func (r *cfgTortureRig) configureNode(requestID string, i int, doc any) {
	if _, ok := r.submit(requestID, "node.configure", []any{map[string]any{"kind": "node", "id": r.nodes[i]}},
		map[string]any{"format": "torture/v1", "document": doc}); ok {
		r.mu.Lock()
		r.nodeOps[i]++
		r.mu.Unlock()
	}
}

func (r *cfgTortureRig) configureFleet(requestID string, doc any) string {
	id, ok := r.submit(requestID, "fleet.configure", []any{map[string]any{"kind": "fleet"}},
		map[string]any{"format": "torture/v1", "document": doc, "selector": map[string]any{}})
	if ok {
		r.mu.Lock()
		r.fleetOp = append(r.fleetOp, id)
		r.mu.Unlock()
	}
	return id
}

// config reads one node's configuration (ok false while the server is
// unreachable).
func (r *cfgTortureRig) config(node string) (cfgTortureNode, bool) {
	status, raw, err := TryCall(r.s.URL, http.MethodGet, "/api/v1/nodes/"+node+"/config", nil, r.s.Token, nil)
	if err != nil || status != http.StatusOK {
		return cfgTortureNode{}, false
	}
	var c cfgTortureNode
	if err := json.Unmarshal(raw, &c); err != nil {
		r.t.Fatalf("node config: %v: %s", err, raw)
	}
	return c, true
}

// converged reports whether the node applied its desired configuration.
func cfgConverged(c cfgTortureNode) bool {
	return c.Desired != nil && c.AppliedRevision == c.Desired.Revision && c.Verdict == "applied" && !c.Lagging &&
		c.Reported != nil && c.Reported.Hash == c.Desired.Hash
}

func (r *cfgTortureRig) waitConverged(what string, idx []int) {
	r.t.Helper()
	testwait.For(r.t, what, 3*time.Minute, func() bool {
		for _, i := range idx {
			if c, ok := r.config(r.nodes[i]); !ok || !cfgConverged(c) {
				return false
			}
		}
		return true
	}, func() string {
		var b strings.Builder
		for _, i := range idx {
			c, _ := r.config(r.nodes[i])
			raw, _ := json.Marshal(c)
			fmt.Fprintf(&b, "node %d: %s\n", i, raw)
		}
		return b.String()
	})
}

func (r *cfgTortureRig) lagging() cfgTortureLagging {
	r.t.Helper()
	var l cfgTortureLagging
	r.s.API(r.t, http.MethodGet, "/api/v1/config/lagging?limit=100", nil, http.StatusOK, &l)
	return l
}

// waitGauge waits for nodeward_config_lagging_nodes to read want: the
// server reads it from the database at most every
// metrics.StoreReadInterval, so a scrape may answer an earlier read's
// figure for that long.
func (r *cfgTortureRig) waitGauge(want float64, when string) {
	r.t.Helper()
	var got float64
	testwait.For(r.t, fmt.Sprintf("nodeward_config_lagging_nodes to read %v %s", want, when), 10*metrics.StoreReadInterval,
		func() bool { got = r.gauge(); return got == want },
		func() string { return fmt.Sprintf("it reads %v", got) })
}

// gauge reads nodeward_config_lagging_nodes, failing when it is absent.
func (r *cfgTortureRig) gauge() float64 {
	r.t.Helper()
	resp, err := http.Get(r.s.URL + "/metrics")
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "nodeward_config_lagging_nodes "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				r.t.Fatal(err)
			}
			return f
		}
	}
	r.t.Fatal("/metrics has no nodeward_config_lagging_nodes")
	return 0
}

func (r *cfgTortureRig) hookRuns(i int) []string {
	lines, err := readLines(r.logs[i])
	if err != nil {
		r.t.Fatal(err)
	}
	return lines
}

// TestTortureConfig: desired configuration under faults, on SQLite (see
// runConfigTorture).
func TestTortureConfig(t *testing.T) {
	t.Parallel()
	runConfigTorture(t, "desired configuration: agent kill -9 mid-apply, control plane kill -9 during fleet.configure (SQLite)", "")
}

// TestTortureConfigPostgres is TestTortureConfig on a private Postgres
// database.
func TestTortureConfigPostgres(t *testing.T) {
	t.Parallel()
	runConfigTorture(t, "desired configuration: agent kill -9 mid-apply, control plane kill -9 during fleet.configure (Postgres)", privateDatabase(t))
}

// runConfigTorture runs agents whose config hook logs every (revision, hash)
// it is run with and sleeps a random short time, under a stream of
// node.configure revisions (a different document each time). Each cycle
// kills one agent with SIGKILL — every other cycle right after its hook
// started, between writing the configuration and reporting it — and starts
// it again, then kills the control plane with SIGKILL while a
// fleet.configure is being submitted and fanned out, and starts it again.
// Afterwards, once every fleet.configure ended: each node's desired
// revision is exactly its accepted node.configure operations plus the
// fleet.configure children the ledger says recorded a revision for it;
// every node converged on its last revision (applied, not lagging); each
// hook log is in non-decreasing revision order, a revision
// run again only right after an interrupted run and at most once
// (DECISIONS §32), its last line the node's final revision and hash; the
// lagging count is exact at an intermediate point (one stopped node behind
// a fleet.configure, the gauge agreeing) and 0 at the end.
func runConfigTorture(t *testing.T, fault, dbURL string) {
	cycles := TortureCycles(2)
	s := StartServer(t, ServerOptions{DatabaseURL: dbURL})
	const n = 4
	r := newCfgTortureRig(t, s, n)
	fig := &Figures{Fault: fault, Cycles: cycles, Config: &ConfigFigures{Nodes: n}}
	all := []int{0, 1, 2, 3}

	// The stream: node.configure to each node in turn, a new document
	// every time, until stopped.
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(150 * time.Millisecond)
		defer tick.Stop()
		for seq := 0; ; seq++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			i := seq % n
			r.configureNode(fmt.Sprintf("cfgtorture-node-%05d", seq), i, map[string]any{"node": i, "seq": seq, "salt": rand.Int64()})
		}
	}()

	agentKills, serverKills, beforeAnswer := 0, 0, 0
	for c := range cycles {
		i := c % n
		a := r.agents[i]
		if c%2 == 0 {
			// Right after the hook started: the document is written, the
			// report not made yet.
			before := len(r.hookRuns(i))
			testwait.For(t, fmt.Sprintf("agent %d to run its hook", i), 2*time.Minute, func() bool { return len(r.hookRuns(i)) > before })
		} else {
			time.Sleep(time.Duration(100+rand.IntN(1200)) * time.Millisecond)
		}
		killed := time.Now()
		a.Kill(t)
		agentKills++
		a.Start(t)
		r.recovered(fig, killed)

		// The control plane, during a fleet.configure: the submit retries
		// with its request id through the kill; the kill lands before the
		// answer, during the fan-out, or just after.
		submitted := make(chan struct{})
		go func() {
			defer close(submitted)
			r.configureFleet(fmt.Sprintf("cfgtorture-fleet-%03d", c), map[string]any{"fleet": c, "salt": rand.Int64()})
		}()
		if c%2 == 0 {
			time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond) // most likely before the answer
		} else {
			time.Sleep(time.Duration(rand.IntN(250)) * time.Millisecond) // while children wait for their nodes
		}
		killed = time.Now()
		select {
		case <-submitted:
		default:
			beforeAnswer++
		}
		s.Stop(t, syscall.SIGKILL)
		serverKills++
		s.Start(t)
		<-submitted
		r.recovered(fig, killed)
	}
	close(stop)
	<-done

	// Every fleet.configure of the faults ends before anything is counted.
	// One a kill interrupted resumes only after the restart, and writes
	// its revisions then: children recorded held whose parent's advance
	// died with the process are released by the restarted replica's
	// fan-out sweep; on Postgres a parent claimed by the killed process
	// but not yet fanned out waits for that process's owner lease to
	// lapse. Counting before they end read one revision fewer on every
	// node (seen once in CI, both dialects).
	r.mu.Lock()
	faultOps := append([]string(nil), r.fleetOp...)
	r.mu.Unlock()
	r.fleetEnded(faultOps, true)
	r.waitConverged("every node to apply its revision once the fleet.configure operations ended", all)

	// An exact intermediate count: node 0 stopped, a fleet.configure
	// every other node applies: exactly node 0 lags, and the gauge agrees.
	r.agents[0].Stop(t)
	if c, _ := r.config(r.nodes[0]); c.Reported == nil {
		t.Fatalf("node 0 never reported a configuration during the faults")
	}
	before := r.desiredRevisions()
	held := r.configureFleet("cfgtorture-fleet-final", map[string]any{"final": true})
	// Every node converged already: wait for the final revision to be
	// written (the fan-out and its release come after the answer) before
	// waiting for it to be applied.
	testwait.For(t, "the final fleet.configure to write a revision for every node", 2*time.Minute, func() bool {
		now := r.desiredRevisions()
		for _, node := range r.nodes {
			if now[node] <= before[node] {
				return false
			}
		}
		return true
	})
	r.waitConverged("every running node to apply the final revision", all[1:])
	if c, _ := r.config(r.nodes[0]); !c.Lagging || c.Verdict == "applied" {
		t.Errorf("stopped node 0: %+v, want lagging", c)
	}
	l := r.lagging()
	if l.Count != 1 || l.NeverReported != 0 || len(l.Nodes) != 1 || l.Nodes[0].NodeID != r.nodes[0] {
		t.Errorf("lagging with node 0 stopped: %+v, want exactly node %s", l, r.nodes[0])
	}
	r.waitGauge(1, "with node 0 stopped")
	r.agents[0].Start(t)
	r.waitConverged("every node to apply the final revision", all)

	// Every node on its last revision, the lagging count exact.
	l = r.lagging()
	fig.Config.Lagging = int(l.Count)
	if l.Count != 0 || l.NeverReported != 0 || len(l.Nodes) != 0 {
		t.Errorf("lagging at the end: %+v, want none", l)
	}
	r.waitGauge(0, "at the end")

	// The hook logs: in order, re-runs only after an interrupted run,
	// the last line the final revision.
	r.mu.Lock()
	nodeOps, fleetOps := append([]int(nil), r.nodeOps...), append([]string(nil), r.fleetOp...)
	r.mu.Unlock()
	// Every fleet.configure ended (the final one too): what each child
	// did is settled, and so is every revision.
	states := r.fleetEnded(fleetOps, false)
	fleetRevs := r.fleetRevisions(fleetOps)
	for i, a := range r.agents {
		c, _ := r.config(r.nodes[i])
		fig.Config.Revisions += int(c.Desired.Revision)
		// Every document differs: each accepted node.configure of the
		// node, and each fleet.configure child the ledger says recorded
		// a revision for it, is exactly one revision — none lost to a
		// kill, none written twice by a replayed submit or a fan-out
		// resumed after a restart.
		if want := int64(nodeOps[i] + fleetRevs[r.nodes[i]]); c.Desired.Revision != want {
			t.Errorf("node %d: desired revision %d after %d node.configure and %d fleet.configure children that recorded a revision (%d fleet.configure), want %d",
				i, c.Desired.Revision, nodeOps[i], fleetRevs[r.nodes[i]], len(fleetOps), want)
		}
		runs := r.hookRuns(i)
		fig.Config.HookRuns += len(runs)
		resumed := len(a.Logs("configuration apply was interrupted; applying it once more (hooks must be idempotent)"))
		fig.Config.HooksKilled += len(a.Logs("config hook of the interrupted apply was still running; killed it"))
		fig.Config.GaveUp += len(a.Logs("configuration apply was interrupted again; not running the hook a third time"))
		repeats := 0
		var prevRev int64
		var prevHash string
		for k, line := range runs {
			revS, hash, _ := strings.Cut(line, " ")
			rev, err := strconv.ParseInt(revS, 10, 64)
			if err != nil || len(hash) != 64 {
				t.Errorf("node %d hook log line %d: %q", i, k+1, line)
				continue
			}
			switch {
			case rev < prevRev:
				fig.Config.OutOfOrder++
				t.Errorf("node %d: hook ran revision %d after %d (line %d): applied out of order", i, rev, prevRev, k+1)
			case rev == prevRev && hash != prevHash:
				t.Errorf("node %d: revision %d run with hashes %s and %s", i, rev, prevHash, hash)
			case rev == prevRev:
				repeats++
				if k >= 2 && runs[k-2] == line {
					t.Errorf("node %d: revision %d run three times", i, rev)
				}
			}
			prevRev, prevHash = rev, hash
		}
		// A resume killed again before its hook started leaves no line:
		// at most one re-run per resume, never one without.
		fig.Config.ReRuns += repeats
		if repeats > resumed {
			t.Errorf("node %d: %d revisions run again in the hook log, only %d applies resumed after a kill", i, repeats, resumed)
		}
		overlaps, err := readLines(r.logs[i] + ".overlaps")
		if err != nil {
			t.Fatal(err)
		}
		fig.Config.Overlaps += len(overlaps)
		if len(overlaps) > 0 {
			t.Errorf("node %d: hook runs of revisions %v started while an earlier run was still going", i, overlaps)
		}
		want := fmt.Sprintf("%d %s", c.Desired.Revision, c.Desired.Hash)
		if len(runs) == 0 || runs[len(runs)-1] != want {
			t.Errorf("node %d: the hook's last run is %q, want the final revision %q", i, lastLine(runs), want)
		}
	}

	// Every configure operation ended; none was lost to a kill.
	r.mu.Lock()
	for _, k := range r.nodeOps {
		fig.Config.NodeConfigures += k
	}
	fig.Config.FleetConfigures = len(fleetOps)
	fig.Codes = r.codes
	replays := r.replays
	r.mu.Unlock()
	var fin struct {
		State string `json:"state"`
	}
	r.s.API(t, http.MethodGet, "/api/v1/operations/"+held, nil, http.StatusOK, &fin)
	if fin.State != "succeeded" {
		t.Errorf("the final fleet.configure ended %s, want succeeded", fin.State)
	}
	fig.Notes = append(fig.Notes,
		fmt.Sprintf("%d nodes, %d agent kills (half right after the hook started), %d control-plane kills during a fleet.configure (%d before its answer)", n, agentKills, serverKills, beforeAnswer),
		fmt.Sprintf("fleet.configure outcomes %v (failed: superseded by the node.configure stream before the node reported)", states),
		fmt.Sprintf("%d answers lost to a kill were recovered by submitting the same request id again", replays),
		"lagging count exact with one node stopped behind a fleet.configure (1, gauge 1) and after convergence (0, gauge 0)")
	fig.Report(t)
}

// desiredRevisions reads every node's desired revision (0 for a node not
// configured, or while the server is unreachable).
func (r *cfgTortureRig) desiredRevisions() map[string]int64 {
	out := map[string]int64{}
	for _, node := range r.nodes {
		if c, ok := r.config(node); ok && c.Desired != nil {
			out[node] = c.Desired.Revision
		}
	}
	return out
}

// recovered waits until every node applied at least the revision desired
// for it now (or a newer one), and counts the time since the fault.
func (r *cfgTortureRig) recovered(fig *Figures, since time.Time) {
	r.t.Helper()
	want := map[string]int64{}
	testwait.For(r.t, "the desired revisions to be readable", time.Minute, func() bool {
		for _, node := range r.nodes {
			c, ok := r.config(node)
			if !ok {
				return false
			}
			if c.Desired != nil {
				want[node] = c.Desired.Revision
			}
		}
		return true
	})
	testwait.For(r.t, "every node to catch up after a kill", 3*time.Minute, func() bool {
		for node, rev := range want {
			if c, ok := r.config(node); !ok || c.AppliedRevision < rev {
				return false
			}
		}
		return true
	})
	fig.Recovered(time.Since(since))
}

func lastLine(lines []string) string {
	if len(lines) == 0 {
		return ""
	}
	return lines[len(lines)-1]
}

// cfgTortureOp is GET /api/v1/operations/{id} (and a listing's row), the
// parts the suite reads.
type cfgTortureOp struct {
	OperationID string `json:"operation_id"`
	State       string `json:"state"`
	Terminal    bool   `json:"terminal"`
	Targets     []struct {
		Kind string `json:"kind"`
		ID   string `json:"id"`
	} `json:"targets"`
	Counts *struct {
		Total     int `json:"total"`
		Pending   int `json:"pending"`
		Succeeded int `json:"succeeded"`
		Failed    int `json:"failed"`
		Cancelled int `json:"cancelled"`
	} `json:"counts"`
	Result *struct {
		Revision int64 `json:"revision"`
	} `json:"result"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func (o cfgTortureOp) code() string {
	if o.Error == nil {
		return ""
	}
	return o.Error.Code
}

// fleetEnded waits until every fleet.configure of ids ended and answers
// how many ended in each state; with logOpen it first logs those that had
// not (a fan-out or release a kill interrupted, still to resume).
func (r *cfgTortureRig) fleetEnded(ids []string, logOpen bool) map[string]int {
	r.t.Helper()
	states := map[string]int{}
	for _, id := range ids {
		var op cfgTortureOp
		r.s.API(r.t, http.MethodGet, "/api/v1/operations/"+id, nil, http.StatusOK, &op)
		if logOpen && !op.Terminal {
			counts := "not fanned out yet"
			if c := op.Counts; c != nil {
				counts = fmt.Sprintf("%d children, %d not ended", c.Total, c.Pending)
			}
			r.t.Logf("fleet.configure %s still %s when the faults stopped (%s)", id, op.State, counts)
		}
		testwait.For(r.t, "fleet.configure "+id+" to end", 2*time.Minute, func() bool {
			r.s.API(r.t, http.MethodGet, "/api/v1/operations/"+id, nil, http.StatusOK, &op)
			return op.Terminal
		})
		states[op.State]++
	}
	return states
}

// fleetRevisions answers, by node id, how many children of the ended
// fleet.configure operations ids recorded a revision for their node, as
// the ledger tells: a child that succeeded (its result names the
// revision) or was superseded (only a released child whose revision was
// written can be: a child refused at release ends then, with the
// refusal's code, and a held child is never superseded). Every node is
// ready throughout (its lease far outlasts a restart), so each fan-out
// has a child per node; any child that recorded nothing is logged and
// fails the test, with its state and code.
func (r *cfgTortureRig) fleetRevisions(ids []string) map[string]int {
	r.t.Helper()
	revs := map[string]int{}
	for _, id := range ids {
		var children struct {
			Operations []cfgTortureOp `json:"operations"`
		}
		r.s.API(r.t, http.MethodGet, "/api/v1/node-operations?limit=500&parent="+id, nil, http.StatusOK, &children)
		seen := map[string]bool{}
		for _, ch := range children.Operations {
			node := ""
			if len(ch.Targets) == 1 {
				node = ch.Targets[0].ID
			}
			if seen[node] {
				r.t.Errorf("fleet.configure %s: two children for node %q", id, node)
			}
			seen[node] = true
			switch {
			case ch.State == "succeeded" && ch.Result != nil && ch.Result.Revision > 0:
				revs[node]++
			case ch.State == "failed" && ch.code() == "superseded" && strings.Contains(ch.Error.Message, "submitted after this one"):
				// Released after a node.configure submitted later than
				// its parent had set the node's revision: submit order
				// wins, nothing recorded (fleet.ConfigureTx).
			case ch.State == "failed" && ch.code() == "superseded":
				revs[node]++
			default:
				r.t.Logf("fleet.configure %s: child %s for node %s ended %s %q: no revision recorded", id, ch.OperationID, node, ch.State, ch.code())
				r.t.Errorf("fleet.configure %s: child %s ended %s %q, want succeeded or failed superseded", id, ch.OperationID, ch.State, ch.code())
			}
		}
		for _, node := range r.nodes {
			if !seen[node] {
				r.t.Errorf("fleet.configure %s: no child for node %s (fanned out to %d of %d nodes)", id, node, len(children.Operations), len(r.nodes))
			}
		}
	}
	return revs
}
