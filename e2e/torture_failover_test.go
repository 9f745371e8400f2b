package e2e

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodeward/nodeward/internal/testwait"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// privateDatabase creates a database of its own on the test Postgres
// (dropped when the test ends) and answers its URL: the fault suite's
// replicas share it and nothing else does. Without a test Postgres the test
// skips, except under CI=true.
func privateDatabase(t testing.TB) string {
	t.Helper()
	base := os.Getenv(dbtest.EnvURL)
	if base == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set: CI must run the Postgres suite", dbtest.EnvURL)
		}
		t.Skipf("PostgreSQL not configured: set %s to run this test", dbtest.EnvURL)
	}
	admin, err := models.Open(context.Background(), models.Options{URL: base, MaxOpenConns: 1})
	if err != nil {
		t.Fatalf("connect to test postgres: %v", err)
	}
	var b [6]byte
	_, _ = crand.Read(b[:])
	name := "nwtorture_" + hex.EncodeToString(b[:])
	if err := admin.Exec("CREATE DATABASE " + name).Error; err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		_ = admin.Exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)").Error
		_ = admin.Close()
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// TestTortureReplicaFailover runs two replicas on one Postgres behind a
// round-robin TCP proxy (the load balancer an operator puts in front of
// them); agents and the API client reach the control plane only through
// it. Each cycle kills one replica with SIGKILL while commands stream:
// its agents reconnect to the survivor within one lease (their nodes never
// go lost), nothing is lost or applied twice, invitations (the dispatcher)
// keep succeeding on the survivor, and the survivor's lease sweeper marks a
// node whose agent died lost.
func TestTortureReplicaFailover(t *testing.T) {
	t.Parallel()
	dbURL := privateDatabase(t)
	cycles := TortureCycles(2)
	const lease = 10 * time.Second
	fig := &Figures{Fault: "replica failover (2 replicas, Postgres, TCP proxy)", Cycles: cycles}
	fig.Notes = append(fig.Notes, fmt.Sprintf("lease %s; no node lapsed (no node.lost in any node audit) across the failovers", lease))

	// The proxy comes first: the replicas advertise its URL to agents.
	proxy := StartProxy(t)
	env := []string{"NODEWARD_PUBLIC_URL=" + proxy.URL, "NODEWARD_LEASE=" + lease.String()}
	a := StartServer(t, ServerOptions{DatabaseURL: dbURL, Replica: "replica-a", Env: env})
	b := StartServer(t, ServerOptions{DatabaseURL: dbURL, Replica: "replica-b", Token: a.Token, Env: env})
	replicas := []*Server{a, b}
	proxy.SetBackends(a.Addr, b.Addr)
	front := &Server{URL: proxy.URL, Token: a.Token, t: t} // API calls through the balancer

	var agents []*Agent
	stateDirs := map[string]string{}
	var nodes []string
	for i := range 3 {
		_, bt, ag := enrolledAgent(t, front, fmt.Sprintf("torture-ha-%d", i), AgentOptions{Name: fmt.Sprintf("agent-%d", i), Args: []string{"--runtime", "simulated"}})
		agents = append(agents, ag)
		nodes = append(nodes, bt.NodeID)
		stateDirs[bt.NodeID] = ag.StateDir
	}
	f := fleetAPI{t: t, s: front}
	st := &stream{t: t, base: func() string { return proxy.URL }, token: a.Token, nodes: nodes, prefix: "failover", payload: simulatedLaunch, pace: 50 * time.Millisecond}
	began := time.Now()
	st.start()
	for c := range cycles {
		time.Sleep(time.Duration(300+rand.IntN(1500)) * time.Millisecond)
		victim := replicas[c%len(replicas)]
		killed := time.Now()
		victim.Stop(t, syscall.SIGKILL)
		// Every node's agent gets a command through the survivor.
		var worst time.Duration
		for i, node := range nodes {
			if d := st.probe(fmt.Sprintf("failover-probe-%03d-%d", c, i), node, killed); d > worst {
				worst = d
			}
		}
		fig.Recovered(worst)
		// The dispatcher carries on on the survivor: an invitation ends.
		status, raw, err := TryCall(proxy.URL, http.MethodPost, "/api/v1/nodes/invitations",
			map[string]any{"rental_id": fmt.Sprintf("torture-ha-invite-%d", c), "generation": 1}, a.Token, nil)
		if err != nil || status != http.StatusCreated {
			t.Errorf("cycle %d: invitation with one replica dead: %d %v %s", c, status, err, raw)
		}
		victim.Start(t)
	}
	ops := st.finish()
	t.Logf("cycles done after %s", time.Since(began).Round(time.Second))
	verifyExactlyOnce(t, fig, proxy.URL, a.Token, ops, stateDirs, launchCounts(agents...))
	// Every agent reconnected within its lease: no replica's sweeper ever
	// marked a node lost (the audit keeps what any replica did).
	for _, node := range nodes {
		if n := f.node(node); n.State != "ready" {
			t.Errorf("node %s: state %s after failovers, want ready", node, n.State)
		}
		status, raw, err := TryCall(proxy.URL, http.MethodGet, "/api/v1/nodes/"+node+"/audit", nil, a.Token, nil)
		if err != nil || status != http.StatusOK {
			t.Fatalf("audit of %s: %d %v %s", node, status, err, raw)
		}
		if strings.Contains(string(raw), `"node.lost"`) {
			t.Errorf("node %s lapsed during the failovers (its agent did not reconnect within one lease): %s", node, raw)
		}
	}

	// The sweepers run on a survivor: with one replica dead, a node whose
	// agent died is marked lost when its lease lapses.
	a.Stop(t, syscall.SIGKILL)
	agents[0].Kill(t)
	lapseFrom := time.Now()
	testwait.For(t, "the survivor to mark the dead agent's node lost", 10*lease, func() bool {
		status, raw, err := TryCall(proxy.URL, http.MethodGet, "/api/v1/nodes/"+nodes[0], nil, a.Token, nil)
		return err == nil && status == http.StatusOK && ProblemCode(raw) == "" && containsState(raw, "lost")
	})
	fig.Notes = append(fig.Notes, fmt.Sprintf("with replica A dead, the survivor marked a node whose agent died lost %s after the kill (lease %s)", time.Since(lapseFrom).Round(time.Second), lease))
	if _, raw, _ := TryCall(proxy.URL, http.MethodGet, "/api/v1/nodes/"+nodes[0]+"/audit", nil, a.Token, nil); !strings.Contains(string(raw), `"node.lost"`) {
		t.Errorf("the lapse is not in the node's audit, so the check above proves nothing: %s", raw)
	}
	conns := proxy.Connections()
	fig.Notes = append(fig.Notes, fmt.Sprintf("the proxy handed out %d connections to replica A and %d to replica B", conns[a.Addr], conns[b.Addr]))
	st.mu.Lock()
	fig.Codes = st.codes
	for _, r := range st.rejected {
		t.Errorf("refused: %s", r)
	}
	st.mu.Unlock()
	fig.Report(t)
}

func containsState(raw []byte, state string) bool {
	var n struct {
		State string `json:"state"`
	}
	return json.Unmarshal(raw, &n) == nil && n.State == state
}
