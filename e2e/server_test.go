package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/agent/client"
	"github.com/nodeward/nodeward/internal/testwait"
	"github.com/nodeward/nodeward/models/dbtest"
)

// enrollNode invites a node through s and enrolls it with the agent client.
func enrollNode(t *testing.T, s *Server) (api.Bootstrap, *client.Client) {
	t.Helper()
	var boot api.Bootstrap
	s.API(t, "POST", "/api/v1/nodes/invitations", map[string]any{"rental_id": fmt.Sprintf("rent-%d", time.Now().UnixNano()), "generation": 1}, 201, &boot)
	c := newAgentClient(t, s.URL)
	resp, err := c.Enroll(context.Background(), api.EnrollRequest{NodeID: boot.NodeID, Generation: 1, EnrollmentToken: boot.EnrollmentToken,
		AgentVersion: "e2e", Facts: api.Facts{Hostname: "e2e", OS: "linux", Arch: "amd64", CPUs: 1, Runtimes: []string{}, ObservedAt: time.Now().UTC()}})
	if err != nil {
		t.Fatalf("enroll: %v", err)
	}
	c.SetSessionToken(resp.SessionToken)
	return boot, c
}

func newAgentClient(t *testing.T, baseURL string) *client.Client {
	t.Helper()
	c, err := client.New(client.Options{BaseURL: baseURL, AllowInsecureHTTP: true, RequestTimeout: 90 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// asClient returns a client for the same session pointed at another replica.
func asClient(t *testing.T, baseURL string, from *client.Client) *client.Client {
	c := newAgentClient(t, baseURL)
	c.SetSessionToken(from.SessionToken())
	return c
}

func issue(t *testing.T, s *Server, node, op string) {
	t.Helper()
	s.API(t, "POST", "/api/v1/nodes/"+node+"/commands", map[string]any{"kind": "stop_workload", "operation_id": op,
		"payload": map[string]any{"run_id": "r-" + op, "attempt_id": "1", "grace_seconds": 1}}, 201, nil)
}

// metric reads one sample from the server's /metrics.
func metric(t *testing.T, s *Server, name string) float64 {
	t.Helper()
	resp, err := http.Get(s.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+" ") {
			v, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimPrefix(line, name)), 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	return 0
}

type pollOutcome struct {
	resp *api.CommandsResponse
	err  error
}

func pollAsync(c *client.Client, wait time.Duration) <-chan pollOutcome {
	ch := make(chan pollOutcome, 1)
	go func() {
		r, err := c.Commands(context.Background(), wait)
		ch <- pollOutcome{r, err}
	}()
	return ch
}

func awaitPoll(t *testing.T, ch <-chan pollOutcome) pollOutcome {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(30 * time.Second):
		t.Fatal("long-poll was not answered")
		return pollOutcome{}
	}
}

func pgURL(t *testing.T) string {
	if os.Getenv(dbtest.EnvURL) == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set: CI must run the Postgres suite", dbtest.EnvURL)
		}
		t.Skipf("PostgreSQL not configured: set %s to run this test", dbtest.EnvURL)
	}
	return dbtest.NewSchema(t)
}

// TestTwoReplicas: two server processes share one Postgres; a command
// recorded on A wakes the long-poll held by B through NOTIFY, B's poll is
// listed by A, and a retirement on A ends B's poll.
func TestTwoReplicas(t *testing.T) {
	url := pgURL(t)
	a := StartServer(t, ServerOptions{DatabaseURL: url, Replica: "replica-a"})
	b := StartServer(t, ServerOptions{DatabaseURL: url, Replica: "replica-b", Token: a.Token})

	boot, viaA := enrollNode(t, a)
	viaB := asClient(t, b.URL, viaA)

	notifyBefore := metric(t, b, `nodeward_long_poll_wakeups_total{source="notify"}`)
	pollBefore := metric(t, b, `nodeward_long_poll_wakeups_total{source="poll"}`)
	held := pollAsync(viaB, 50*time.Second)
	testwait.For(t, "B to hold the poll", 20*time.Second, func() bool { return metric(t, b, "nodeward_open_long_polls") == 1 })

	// A lists the poll B holds (replicas publish what they hold).
	testwait.For(t, "A to list B's session", 30*time.Second, func() bool {
		var live struct {
			Sessions []struct {
				NodeID  string `json:"node_id"`
				Replica string `json:"replica"`
			} `json:"sessions"`
		}
		a.API(t, "GET", "/api/v1/sessions", nil, 200, &live)
		for _, s := range live.Sessions {
			if s.NodeID == boot.NodeID && s.Replica == "replica-b" {
				return true
			}
		}
		return false
	})

	directBefore := metric(t, b, "nodeward_long_poll_direct_claims_total")
	readsBefore := metric(t, b, "nodeward_long_poll_store_queries_total")
	issue(t, a, boot.NodeID, "cross-replica-1")
	got := awaitPoll(t, held)
	if got.err != nil || len(got.resp.Commands) != 1 || got.resp.Commands[0].OperationID != "cross-replica-1" {
		t.Fatalf("poll on B: %+v %v", got.resp, got.err)
	}
	if n := metric(t, b, `nodeward_long_poll_wakeups_total{source="notify"}`); n < notifyBefore+1 {
		t.Fatalf("B was not woken by a notification (notify wake-ups %v -> %v)", notifyBefore, n)
	}
	if n := metric(t, b, `nodeward_long_poll_wakeups_total{source="poll"}`); n != pollBefore {
		t.Fatalf("B fell back to polling (%v -> %v) although notifications flow", pollBefore, n)
	}
	// Woken by a command another replica recorded, B's poll claims it at
	// once, without reading first.
	if n := metric(t, b, "nodeward_long_poll_direct_claims_total"); n != directBefore+1 {
		t.Fatalf("B's poll did not claim directly (direct claims %v -> %v)", directBefore, n)
	}
	if n := metric(t, b, "nodeward_long_poll_store_queries_total"); n != readsBefore {
		t.Fatalf("B's poll read before it claimed (store queries %v -> %v)", readsBefore, n)
	}

	// Results reported to A settle a command B delivered.
	res, err := viaA.Results(context.Background(), []api.Result{{OperationID: "cross-replica-1", Applied: true}})
	if err != nil || res.Settled[0].State != "applied" {
		t.Fatalf("settle via A: %+v %v", res, err)
	}

	// Retiring on A ends the poll held on B.
	held = pollAsync(viaB, 50*time.Second)
	testwait.For(t, "B to hold the poll again", 20*time.Second, func() bool { return metric(t, b, "nodeward_open_long_polls") == 1 })
	a.API(t, "POST", "/api/v1/nodes/"+boot.NodeID+"/retire", nil, 200, nil)
	got = awaitPoll(t, held)
	if client.CodeOf(got.err) != "node_retired" {
		t.Fatalf("held poll on B after retirement on A: %v", got.err)
	}
}

// TestCommandSurvivesServerRestart: a command recorded before a restart is
// delivered after it.
func TestCommandSurvivesServerRestart(t *testing.T) {
	for _, dialect := range []string{"sqlite", "postgres"} {
		t.Run(dialect, func(t *testing.T) {
			opts := ServerOptions{}
			if dialect == "postgres" {
				opts.DatabaseURL = pgURL(t)
			}
			s := StartServer(t, opts)
			boot, c := enrollNode(t, s)
			issue(t, s, boot.NodeID, "before-restart")
			s.Stop(t, syscall.SIGTERM)
			if code := s.ExitCode(); code != 0 {
				t.Fatalf("server exited %d on SIGTERM", code)
			}
			s.Start(t)
			resp, err := c.Commands(context.Background(), 5*time.Second)
			if err != nil || len(resp.Commands) != 1 || resp.Commands[0].OperationID != "before-restart" {
				t.Fatalf("after restart: %+v %v", resp, err)
			}
		})
	}
}

// TestDeadPollerClaimsNothing: a long-poll whose client vanished leaves no
// claim behind; the next poll gets the command at once.
func TestDeadPollerClaimsNothing(t *testing.T) {
	s := StartServer(t, ServerOptions{})
	boot, c := enrollNode(t, s)
	conn, err := net.Dial("tcp", s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "GET /agent/v1/commands?wait=50 HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n\r\n", s.Addr, c.SessionToken())
	testwait.For(t, "poll held", 20*time.Second, func() bool { return metric(t, s, "nodeward_open_long_polls") == 1 })
	_ = conn.(*net.TCPConn).SetLinger(0)
	_ = conn.Close()
	testwait.For(t, "dead poll released", 20*time.Second, func() bool { return metric(t, s, "nodeward_open_long_polls") == 0 })
	issue(t, s, boot.NodeID, "after-death")
	resp, err := c.Commands(context.Background(), 0)
	if err != nil || len(resp.Commands) != 1 {
		t.Fatalf("next poll: %+v %v", resp, err)
	}
}

// TestDrainThousandPolls: SIGTERM with 1,000 held long-polls answers every
// one 503 draining at once, and the process exits cleanly inside its grace.
func TestDrainThousandPolls(t *testing.T) {
	s := StartServer(t, ServerOptions{})
	const nodes, perNode = 10, 100
	tr := &http.Transport{MaxConnsPerHost: 0, MaxIdleConnsPerHost: nodes * perNode}
	hc := &http.Client{Transport: tr}
	defer tr.CloseIdleConnections()
	var tokens []string
	for range nodes {
		_, c := enrollNode(t, s)
		tokens = append(tokens, c.SessionToken())
	}
	var wg sync.WaitGroup
	statuses := make(chan string, nodes*perNode)
	for _, tok := range tokens {
		for range perNode {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequest("GET", s.URL+"/agent/v1/commands?wait=60", nil)
				req.Header.Set("Authorization", "Bearer "+tok)
				resp, err := hc.Do(req)
				if err != nil {
					statuses <- "error: " + err.Error()
					return
				}
				defer resp.Body.Close()
				var p struct {
					Code string `json:"code"`
				}
				raw, _ := io.ReadAll(resp.Body)
				_ = json.Unmarshal(raw, &p)
				statuses <- fmt.Sprintf("%d %s retry-after=%s", resp.StatusCode, p.Code, resp.Header.Get("Retry-After"))
			}()
		}
	}
	testwait.For(t, "1,000 polls held", 60*time.Second, func() bool { return metric(t, s, "nodeward_open_long_polls") == nodes*perNode })
	s.Stop(t, syscall.SIGTERM)
	wg.Wait()
	close(statuses)
	counts := map[string]int{}
	for st := range statuses {
		counts[st]++
	}
	if counts["503 draining retry-after=5"] != nodes*perNode {
		t.Fatalf("answers: %v", counts)
	}
	if code := s.ExitCode(); code != 0 {
		t.Fatalf("server exited %d", code)
	}
	log := s.Log()
	if strings.Contains(log, "grace period ended") || !strings.Contains(log, `"msg":"stopped"`) {
		t.Fatalf("server did not drain cleanly inside its grace:\n%s", lastLines(log, 5))
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
