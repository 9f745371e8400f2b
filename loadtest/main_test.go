package main

import (
	"context"
	"os"
	"testing"
	"time"
)

// TestMain lets the test binary double as a worker process, as the tool's
// own binary does.
func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) == "1" {
		os.Exit(runWorker())
	}
	os.Exit(m.Run())
}

// TestSmoke runs the whole tool small (20 agents in two workers, 2 s) so it
// cannot rot. It asserts on counts, never on timings.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server and two worker processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Config{Agents: 20, AgentsPerWorker: 10, Rate: 40, Issuers: 4, Duration: 2 * time.Second,
		Wait: 5 * time.Second, Heartbeat: time.Second, Drain: time.Minute, Log: testLog{t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", rep)
	if rep.Workers != 2 || rep.Enrolled != 20 || rep.Held != 20 {
		t.Fatalf("workers %d, enrolled %d, held %d; want 2, 20, 20", rep.Workers, rep.Enrolled, rep.Held)
	}
	if rep.Issued == 0 || rep.IssueErrs != 0 {
		t.Fatalf("issued %d with %d errors", rep.Issued, rep.IssueErrs)
	}
	if rep.Received != rep.Issued || rep.Settled != rep.Issued {
		t.Fatalf("issued %d, received %d, settled %d: every command must arrive once and settle", rep.Issued, rep.Received, rep.Settled)
	}
	if rep.AgentErrs != 0 {
		t.Fatalf("%d agent errors, first: %s", rep.AgentErrs, rep.FirstErr)
	}
	if rep.Heartbeats == 0 {
		t.Fatal("no heartbeat was acknowledged")
	}
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Logf("%s", p)
	return len(p), nil
}

// TestLedgerSmoke runs the ledger scenario small, on SQLite and, when a
// test Postgres is configured, with two replicas sharing it. It asserts
// on counts, never on timings.
func TestLedgerSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts control planes")
	}
	runs := []LedgerConfig{{Ops: 60, Submitters: 4, Replicas: 1, LedgerWorkers: 4}}
	if url := os.Getenv("NODEWARD_TEST_DATABASE_URL"); url != "" {
		runs = append(runs, LedgerConfig{Ops: 60, Submitters: 4, Replicas: 2, LedgerWorkers: 4, DatabaseURL: url})
	}
	for _, cfg := range runs {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		cfg.Log = testLog{t}
		rep, err := RunLedger(ctx, cfg)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%+v", rep)
		if rep.SubmitErrors != 0 || rep.Ops != 60 || rep.Claims == 0 {
			t.Fatalf("submit errors %d, ops %d, claims %v", rep.SubmitErrors, rep.Ops, rep.Claims)
		}
	}
}
