package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
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
	"github.com/nodeward/nodeward/ledger/testkinds"
)

// testKindsTag builds a server that serves the kinds of ledger/testkinds.
const testKindsTag = "nodeward_testkinds"

// opView is the part of an operation these tests read.
type opView struct {
	OperationID string `json:"operation_id"`
	Kind        string `json:"kind"`
	State       string `json:"state"`
	Attempt     int    `json:"attempt"`
	Error       *struct {
		Code      string `json:"code"`
		Retryable bool   `json:"retryable"`
	} `json:"error"`
}

func (o opView) String() string {
	b, _ := json.Marshal(o)
	return string(b)
}

// startTestKindsServer starts a server built with the test kinds, its runs
// recorded under dir.
func startTestKindsServer(t *testing.T, dir string, o ServerOptions) *Server {
	t.Helper()
	o.Tags = testKindsTag
	o.Env = append(o.Env, testkinds.EnvDir+"="+dir)
	return StartServer(t, o)
}

func submitOp(t *testing.T, s *Server, kind, requestID string) opView {
	t.Helper()
	var op opView
	s.API(t, "POST", "/api/v1/operations", map[string]any{"request_id": requestID, "kind": kind}, http.StatusCreated, &op)
	return op
}

func getOp(t *testing.T, s *Server, id string) opView {
	t.Helper()
	var op opView
	s.API(t, "GET", "/api/v1/operations/"+id, nil, http.StatusOK, &op)
	return op
}

// awaitOp waits until the operation, read through s, is in state.
func awaitOp(t *testing.T, s *Server, id, state string, timeout time.Duration) opView {
	t.Helper()
	var op opView
	testwait.For(t, "operation "+id+" "+state, timeout, func() bool {
		op = getOp(t, s, id)
		return op.State == state
	}, func() string { return "last seen: " + op.String() })
	return op
}

// run is one line of a test-kinds record file: one execution.
type run struct {
	Kind, OperationID string
	Attempt           int
	Replica           string
}

// runs reads every execution recorded under dir, by every process.
func runs(t *testing.T, dir string) []run {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.runs"))
	if err != nil {
		t.Fatal(err)
	}
	var out []run
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n") {
			if line == "" {
				continue
			}
			fields := strings.Fields(line)
			if len(fields) != 4 {
				t.Fatalf("%s: malformed line %q", f, line)
			}
			attempt, err := strconv.Atoi(fields[2])
			if err != nil {
				t.Fatalf("%s: malformed line %q", f, line)
			}
			out = append(out, run{Kind: fields[0], OperationID: fields[1], Attempt: attempt, Replica: fields[3]})
		}
	}
	return out
}

func runsOf(t *testing.T, dir, id string) []run {
	t.Helper()
	var out []run
	for _, r := range runs(t, dir) {
		if r.OperationID == id {
			out = append(out, r)
		}
	}
	return out
}

func requireInterrupted(t *testing.T, op opView) {
	t.Helper()
	if op.State != "failed" || op.Error == nil || op.Error.Code != "interrupted" || !op.Error.Retryable {
		t.Fatalf("want failed, interrupted and retryable: %s", op)
	}
}

// TestTestKindsNotServedByNormalBuild: the normal server binary serves no
// test kind.
func TestTestKindsNotServedByNormalBuild(t *testing.T) {
	s := StartServer(t, ServerOptions{})
	status, raw := s.Call(t, "POST", "/api/v1/operations", map[string]any{"request_id": "noop-1", "kind": testkinds.KindNoop}, s.Token)
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(raw, &p)
	if status != http.StatusNotImplemented || p.Code != "kind_not_served" {
		t.Fatalf("submit test.noop to a normal build: %d %s", status, raw)
	}
}

// TestLedgerRecoveryAfterKill: a server killed with SIGKILL while it runs
// two operations is started again, under the same replica name, on the
// same database: the operation whose kind is not safe to repeat ends failed
// `interrupted` (retryable) without running again; the level-triggered one
// runs again (attempt 2) and succeeds. The new process is its
// predecessor's successor (one replica name), so it does not wait out the
// dead process's owner lease, and it recovers before it answers anything:
// the first read through it already finds the interrupted run ended.
func TestLedgerRecoveryAfterKill(t *testing.T) {
	for _, dialect := range []string{"sqlite", "postgres"} {
		t.Run(dialect, func(t *testing.T) {
			dir := t.TempDir()
			opts := ServerOptions{}
			if dialect == "postgres" {
				opts.DatabaseURL = pgURL(t)
			}
			s := startTestKindsServer(t, dir, opts)
			block := submitOp(t, s, testkinds.KindBlock, "block-1")
			level := submitOp(t, s, testkinds.KindLevel, "level-1")
			awaitOp(t, s, block.OperationID, "running", testwait.Patience)
			awaitOp(t, s, level.OperationID, "running", testwait.Patience)
			testwait.For(t, "both runs to start", testwait.Patience, func() bool {
				return len(runsOf(t, dir, block.OperationID)) == 1 && len(runsOf(t, dir, level.OperationID)) == 1
			})

			s.Stop(t, syscall.SIGKILL)
			s.Start(t)

			requireInterrupted(t, getOp(t, s, block.OperationID))
			got := awaitOp(t, s, level.OperationID, "succeeded", 60*time.Second)
			if got.Attempt != 2 {
				t.Fatalf("level-triggered operation after recovery: %s, want attempt 2", got)
			}
			if r := runsOf(t, dir, block.OperationID); len(r) != 1 {
				t.Fatalf("test.block ran %d times, want once (it is not safe to repeat): %+v", len(r), r)
			}
			if r := runsOf(t, dir, level.OperationID); len(r) != 2 || r[0].Attempt != 1 || r[1].Attempt != 2 {
				t.Fatalf("test.level runs: %+v, want attempts 1 then 2", r)
			}
		})
	}
}

// TestLedgerTwoReplicas: two server processes on one Postgres schema.
// 2,000 no-op operations submitted through both replicas at once each run
// exactly once, some on each replica; and an operation running on a replica
// killed with SIGKILL is recovered by the survivor once the dead replica's
// owner lease lapsed.
func TestLedgerTwoReplicas(t *testing.T) {
	url := pgURL(t)
	dir := t.TempDir()
	a := startTestKindsServer(t, dir, ServerOptions{DatabaseURL: url, Replica: "replica-a"})
	b := startTestKindsServer(t, dir, ServerOptions{DatabaseURL: url, Replica: "replica-b", Token: a.Token})
	replicas := map[string]*Server{"replica-a": a, "replica-b": b}

	t.Run("EachOperationRunsOnce", func(t *testing.T) {
		const total, concurrency = 2000, 16
		ids, err := submitNoops(a, b, total, concurrency)
		if err != nil {
			t.Fatal(err)
		}
		// Each submit waited for its operation; one whose wait ran out is
		// read until it ended.
		for id, state := range ids {
			if state != "succeeded" {
				awaitOp(t, a, id, "succeeded", testwait.Patience)
			}
		}
		executions, perReplica := map[string]int{}, map[string]int{}
		for _, r := range runs(t, dir) {
			if r.Kind == testkinds.KindNoop {
				executions[r.OperationID]++
				perReplica[r.Replica]++
			}
		}
		for id := range ids {
			if executions[id] != 1 {
				t.Errorf("operation %s ran %d times, want once", id, executions[id])
			}
		}
		if len(executions) != total {
			t.Errorf("%d operations ran, want %d", len(executions), total)
		}
		if perReplica["replica-a"] == 0 || perReplica["replica-b"] == 0 {
			t.Errorf("runs per replica: %v, want some on each", perReplica)
		}
		t.Logf("runs per replica: %v", perReplica)
	})

	t.Run("SurvivorRecoversAKilledReplicasRun", func(t *testing.T) {
		block := submitOp(t, a, testkinds.KindBlock, "block-two-replicas")
		var owner string
		testwait.For(t, "test.block to start", testwait.Patience, func() bool {
			r := runsOf(t, dir, block.OperationID)
			if len(r) == 1 {
				owner = r[0].Replica
			}
			return owner != ""
		})
		survivor := a
		if owner == "replica-a" {
			survivor = b
		}
		replicas[owner].Stop(t, syscall.SIGKILL)
		// The owner lease is 15 s and renewed every 5 s; the survivor looks
		// for orphans as often.
		requireInterrupted(t, awaitOp(t, survivor, block.OperationID, "failed", 60*time.Second))
		if r := runsOf(t, dir, block.OperationID); len(r) != 1 {
			t.Fatalf("test.block ran %d times, want once: %+v", len(r), r)
		}
	})
}

// submitNoops submits total test.noop operations, alternately through a
// and b, at most concurrency at once, each waiting for its end; it answers
// each operation's id and the state its submit answered.
func submitNoops(a, b *Server, total, concurrency int) (map[string]string, error) {
	tr := &http.Transport{MaxIdleConnsPerHost: concurrency}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	var (
		mu    sync.Mutex
		ids   = map[string]string{}
		first error
	)
	work := make(chan int)
	var wg sync.WaitGroup
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				s := a
				if i%2 == 1 {
					s = b
				}
				op, err := submitNoop(hc, s, fmt.Sprintf("noop-%d", i))
				mu.Lock()
				if err != nil && first == nil {
					first = err
				}
				if err == nil {
					ids[op.OperationID] = op.State
				}
				mu.Unlock()
			}
		}()
	}
	for i := range total {
		work <- i
	}
	close(work)
	wg.Wait()
	return ids, first
}

func submitNoop(hc *http.Client, s *Server, requestID string) (opView, error) {
	body, _ := json.Marshal(map[string]any{"request_id": requestID, "kind": testkinds.KindNoop, "wait_timeout_ms": 30000})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", s.URL+"/api/v1/operations", bytes.NewReader(body))
	if err != nil {
		return opView{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+s.Token)
	resp, err := hc.Do(req)
	if err != nil {
		return opView{}, fmt.Errorf("submit %s to %s: %w", requestID, s.Replica, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var op opView
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(raw, &op) != nil || op.OperationID == "" {
		return opView{}, fmt.Errorf("submit %s to %s: %d %s", requestID, s.Replica, resp.StatusCode, raw)
	}
	return op, nil
}
