package main

import (
	"context"
	"os"
	"path/filepath"
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
	allocs := filepath.Join(t.TempDir(), "allocs")
	rep, err := Run(ctx, Config{Agents: 20, AgentsPerWorker: 10, Rate: 40, Issuers: 4, Duration: 2 * time.Second,
		Wait: 5 * time.Second, Heartbeat: time.Second, Drain: time.Minute, Log: testLog{t}, AllocProfile: allocs})
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{allocs + ".base", allocs} {
		// A profile is gzipped protobuf: its first bytes say so.
		if b, err := os.ReadFile(path); err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Fatalf("allocations profile %s: %d bytes, %v", path, len(b), err)
		}
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
	if rep.PollsAnswered < 1 || rep.PollsEmpty > rep.PollsAnswered || rep.PollsTogether {
		t.Fatalf("polls answered %v, empty %v, together %v: the commands came in answered polls, first polls spread by default",
			rep.PollsAnswered, rep.PollsEmpty, rep.PollsTogether)
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

// TestHoldSmoke runs the hold scenario small (both servers built and run
// as processes, 20 agents, over TLS: the plain path is the same minus the
// certificate). It asserts on counts, never on memory or timings.
func TestHoldSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts the server and the bare waiter")
	}
	for _, tls := range []bool{true} {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		rep, err := RunHold(ctx, HoldConfig{Agents: 20, AgentsPerWorker: 10, Wait: 5 * time.Second, Settle: 100 * time.Millisecond,
			Sample: time.Second, Rate: 20, Duration: time.Second, TLS: tls, Log: testLog{t}})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%+v", rep)
		if rep.Bare.Held != 20 || rep.Server.Held != 20 {
			t.Fatalf("tls %v: held %d by the bare waiter and %d by the server; want 20 each", tls, rep.Bare.Held, rep.Server.Held)
		}
		if rep.Bare.HeldRSSKB == 0 || rep.Server.HeldRSSKB == 0 {
			t.Fatalf("tls %v: no RSS sampled: %+v %+v", tls, rep.Bare, rep.Server)
		}
		if d := rep.Deliver; d.Issued == 0 || d.Received != d.Issued || d.Settled != d.Issued || d.AgentErrs != 0 {
			t.Fatalf("tls %v: issued %d, received %d, settled %d, agent errors %d (%s)", tls, d.Issued, d.Received, d.Settled, d.AgentErrs, d.FirstErr)
		}
	}
}

// TestConfigSmoke runs the config scenario small (30 agents in two
// workers, then 500 seeded configured nodes), on SQLite and, when a test
// Postgres is configured, on it. It asserts on counts, never on timings.
func TestConfigSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts control planes and worker processes")
	}
	dbs := []string{""}
	if url := os.Getenv("NODEWARD_TEST_DATABASE_URL"); url != "" {
		dbs = append(dbs, url)
	}
	const agents, seeded = 30, 500
	for _, db := range dbs {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		rep, err := RunConfig(ctx, ConfigLoad{Config: Config{Agents: agents, AgentsPerWorker: 15, Wait: 5 * time.Second,
			Drain: 2 * time.Minute, DatabaseURL: db, Log: testLog{t}}, LaggingNodes: seeded, LaggingSamples: 3, ProbeRate: 50})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%+v", rep)
		if rep.Enrolled != agents || rep.Held != agents {
			t.Fatalf("%s: enrolled %d, held %d; want %d", rep.Database, rep.Enrolled, rep.Held, agents)
		}
		if rep.ParentState != "succeeded" || rep.Total != agents || rep.Succeeded != agents || rep.Failed != 0 {
			t.Fatalf("%s: parent %s with %d children, %d succeeded, %d failed; want succeeded, %d each", rep.Database,
				rep.ParentState, rep.Total, rep.Succeeded, rep.Failed, agents)
		}
		if rep.Received < agents || rep.Reported < agents || rep.AgentErrs != 0 {
			t.Fatalf("%s: received %d, reported %d, agent errors %d (%s)", rep.Database, rep.Received, rep.Reported, rep.AgentErrs, rep.FirstErr)
		}
		if rep.AllAppliedSeconds <= 0 || rep.ParentEndedSeconds <= 0 {
			t.Fatalf("%s: no convergence time measured: %+v", rep.Database, rep)
		}
		if len(rep.Timeline) == 0 || rep.Timeline[0].Pending+rep.Timeline[0].Succeeded+rep.Timeline[0].Failed != agents {
			t.Fatalf("%s: the timeline does not count the parent's %d children: %+v", rep.Database, agents, rep.Timeline)
		}
		for _, tick := range rep.Timeline {
			if tick.Delivered-tick.Applied > rep.MaxUnreported {
				t.Fatalf("%s: %d delivered, not applied at %.0fs, more than the most reported (%d)", rep.Database, tick.Delivered-tick.Applied, tick.Seconds, rep.MaxUnreported)
			}
			if tick.Written > int64(agents) || tick.Applied > tick.Written || tick.Delivered > tick.Written {
				t.Fatalf("%s: a tick counts configurations the fleet does not have: %+v", rep.Database, tick)
			}
		}
		if rep.ProbeSubmits < 1 || rep.ProbeErrors != 0 || rep.ProbeP50 <= 0 || rep.ProbeMax < rep.ProbeP99 || rep.ProbeP99 < rep.ProbeP50 {
			t.Fatalf("%s: the probe's submits: %d, errors %d, ms p50 %.2f p99 %.2f max %.2f", rep.Database,
				rep.ProbeSubmits, rep.ProbeErrors, rep.ProbeP50, rep.ProbeP99, rep.ProbeMax)
		}
		if rep.Database == "postgres" && rep.PGCommits <= 0 {
			t.Fatalf("postgres: no commits counted")
		}
		lagging, never := seededLagging(seeded)
		if rep.LaggingCount != lagging || rep.NeverReported != never {
			t.Fatalf("%s: lagging %d, never reported %d; want %d, %d (the seeded rows; the agents applied theirs)",
				rep.Database, rep.LaggingCount, rep.NeverReported, lagging, never)
		}
	}
}

// TestFanOutSmoke runs deliver with -fanout and -max-concurrency:
// fleet.command operations over 5 nodes each, 2 handed out at once (the
// rest released as others end), reach every node once and settle. Counts
// only.
func TestFanOutSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server and two worker processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Config{Agents: 20, AgentsPerWorker: 10, Rate: 5, FanOut: 5, MaxConcurrency: 2, Issuers: 4, Duration: 2 * time.Second,
		Wait: 5 * time.Second, Drain: time.Minute, Log: testLog{t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", rep)
	if rep.IssuedOps == 0 || rep.IssueErrs != 0 || rep.Issued != 5*rep.IssuedOps {
		t.Fatalf("%d operations (%d commands), %d errors: want operations of 5 commands each", rep.IssuedOps, rep.Issued, rep.IssueErrs)
	}
	if rep.Received != rep.Issued || rep.Settled != rep.Issued || rep.AgentErrs != 0 {
		t.Fatalf("issued %d, received %d, settled %d, agent errors %d (%s)", rep.Issued, rep.Received, rep.Settled, rep.AgentErrs, rep.FirstErr)
	}
	// Each fan-out released its last three children by advances, which
	// the wave's counters (window and drain) saw.
	if v := rep.Wave; v == nil || v.ChildEnds == 0 || v.Advances["prompt"]+v.Advances["interval"]+v.Advances["continued"]+v.Advances["sweep"] == 0 {
		t.Fatalf("wave counters %+v: want the child ends and the parents' advances", v)
	}
}

// TestFanOutClosedLoopSmoke runs saturation fan-out (-rate 0): closed-loop,
// each issuer's fan-out ended before its next, so nearly every fan-out
// issued ended inside the window (at most one per issuer still open when
// it closed) and every command settles once. Counts only.
func TestFanOutClosedLoopSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server and two worker processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Config{Agents: 20, AgentsPerWorker: 10, Rate: 0, FanOut: 5, Issuers: 2, Duration: 2 * time.Second,
		Wait: 5 * time.Second, Drain: time.Minute, Log: testLog{t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", rep)
	if rep.IssuedOps == 0 || rep.IssueErrs != 0 || rep.Issued != 5*rep.IssuedOps {
		t.Fatalf("%d operations (%d commands), %d errors: want operations of 5 commands each", rep.IssuedOps, rep.Issued, rep.IssueErrs)
	}
	if rep.EndedOps == 0 || rep.IssuedOps-rep.EndedOps > 2 {
		t.Fatalf("%d fan-outs issued, %d ended in the window: want all but at most one per issuer", rep.IssuedOps, rep.EndedOps)
	}
	if rep.Received != rep.Issued || rep.Settled != rep.Issued || rep.AgentErrs != 0 {
		t.Fatalf("issued %d, received %d, settled %d, agent errors %d (%s)", rep.Issued, rep.Received, rep.Settled, rep.AgentErrs, rep.FirstErr)
	}
}

// TestEnrollSmoke runs the enroll scenario in-process and against the real
// binary, on SQLite (and the binary on Postgres when configured). Counts
// only.
func TestEnrollSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts servers and worker processes")
	}
	runs := []EnrollConfig{{Agents: 30, AgentsPerWorker: 15, Concurrency: 8}, {Agents: 30, AgentsPerWorker: 15, Concurrency: 8, Binary: true}}
	if url := os.Getenv("NODEWARD_TEST_DATABASE_URL"); url != "" {
		runs = append(runs, EnrollConfig{Agents: 30, AgentsPerWorker: 15, Concurrency: 8, Binary: true, Replicas: 2, DatabaseURL: url})
	}
	for _, cfg := range runs {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		cfg.Log = testLog{t}
		rep, err := RunEnroll(ctx, cfg)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%+v", rep)
		if rep.Enrolled != 30 || rep.Failed != 0 || rep.Workers != 2 || rep.Latency.Max == 0 {
			t.Fatalf("%+v: want 30 enrolled by 2 workers, none failed, latencies taken", rep)
		}
		if cfg.Binary && len(rep.Servers) != max(1, cfg.Replicas) {
			t.Fatalf("%d replicas sampled, want %d", len(rep.Servers), max(1, cfg.Replicas))
		}
	}
}

// TestStormSmoke restarts the real binary (SQLite, SIGKILL) under 20 held
// agents right after a burst of 200 commands: every agent comes back,
// every recorded command settles, none is lost or applied twice. Counts
// only: the recovery's seconds are reported, never asserted.
func TestStormSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and restarts the server")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := RunStorm(ctx, StormConfig{Agents: 20, AgentsPerWorker: 10, Commands: 200, Issuers: 8,
		Wait: 5 * time.Second, Recover: 3 * time.Minute, Log: testLog{t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", rep)
	if rep.Issued != 200 || rep.IssueErrs != 0 {
		t.Fatalf("burst: %d recorded, %d errors; want 200, 0", rep.Issued, rep.IssueErrs)
	}
	if rep.AllHeldSeconds < 0 || rep.AllSettledSeconds < 0 {
		t.Fatalf("after the restart not every agent held a poll (%v) or not every command settled (%v)", rep.AllHeldSeconds, rep.AllSettledSeconds)
	}
	if rep.Lost != 0 || rep.AppliedTwice != 0 {
		t.Fatalf("lost %d, applied twice %d; want 0, 0", rep.Lost, rep.AppliedTwice)
	}
	if len(rep.Servers) != 1 || rep.Servers[0].PID == 0 {
		t.Fatalf("replicas after the restart: %+v; want the one restarted", rep.Servers)
	}
	// The timeline starts at the restart and only moves forward: time, the
	// restarted replica's resuming polls and the settled commands.
	if len(rep.Timeline) == 0 {
		t.Fatal("no recovery timeline")
	}
	for i, smp := range rep.Timeline[1:] {
		prev := rep.Timeline[i]
		if smp.Seconds <= prev.Seconds || smp.Resumed < prev.Resumed || smp.Settled < prev.Settled || smp.Settled > rep.Issued {
			t.Fatalf("timeline goes back or past the burst at sample %d: %+v after %+v", i+1, smp, prev)
		}
	}
}

// TestStormFanOutSmoke is TestStormSmoke with the burst as fleet.command
// fan-outs (20 of 10 agents each): the stop lands while fan-outs are
// created and their commands recorded; every fan-out ends after the
// restart with all its children, none lost or applied twice.
func TestStormFanOutSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and restarts the server")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := RunStorm(ctx, StormConfig{Agents: 20, AgentsPerWorker: 10, Commands: 200, FanOut: 10, Issuers: 8,
		Wait: 5 * time.Second, Recover: 3 * time.Minute, Log: testLog{t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", rep)
	if rep.FanOuts != 20 || rep.Issued != 200 || rep.IssueErrs != 0 {
		t.Fatalf("burst: %d fan-outs, %d children, %d errors; want 20, 200, 0", rep.FanOuts, rep.Issued, rep.IssueErrs)
	}
	if rep.AllHeldSeconds < 0 || rep.AllSettledSeconds < 0 || rep.FanOutsEnded != rep.FanOuts {
		t.Fatalf("after the restart: held %v, settled %v, fan-outs ended %d of %d", rep.AllHeldSeconds, rep.AllSettledSeconds, rep.FanOutsEnded, rep.FanOuts)
	}
	if rep.Lost != 0 || rep.AppliedTwice != 0 {
		t.Fatalf("lost %d, applied twice %d; want 0, 0", rep.Lost, rep.AppliedTwice)
	}
}

// TestFloorSmoke runs deliver against the floor (cmd/barewaiter -deliver):
// single commands over two floor processes, each issued where its node's
// agent polls, and closed-loop fan-outs over one. Every command arrives
// once and settles, or the floor measures something other than the run it
// stands beside. Counts only.
func TestFloorSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the floor and starts worker processes")
	}
	for _, tc := range []struct {
		name      string
		processes int
		cfg       Config
	}{
		{"SinglesOnTwoProcesses", 2, Config{Agents: 20, AgentsPerWorker: 5, Rate: 40, Issuers: 4}},
		{"FanOutsClosedLoop", 1, Config{Agents: 20, AgentsPerWorker: 10, Rate: 0, FanOut: 5, Issuers: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cfg := tc.cfg
			cfg.Duration, cfg.Wait, cfg.Drain, cfg.Log = 2*time.Second, 5*time.Second, time.Minute, testLog{t}
			rep, err := runDeliverFloor(ctx, cfg, tc.processes)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%+v", rep)
			if rep.Database != "floor" || len(rep.Replicas) != tc.processes || rep.Enrolled != 20 {
				t.Fatalf("database %q, %d processes sampled, %d enrolled; want floor, %d, 20", rep.Database, len(rep.Replicas), rep.Enrolled, tc.processes)
			}
			if rep.Issued == 0 || rep.IssueErrs != 0 {
				t.Fatalf("issued %d with %d errors", rep.Issued, rep.IssueErrs)
			}
			if rep.Received != rep.Issued || rep.Settled != rep.Issued || rep.AgentErrs != 0 {
				t.Fatalf("issued %d, received %d, settled %d, agent errors %d (%s): every command must arrive once and settle",
					rep.Issued, rep.Received, rep.Settled, rep.AgentErrs, rep.FirstErr)
			}
			if rep.SettledPS <= 0 {
				t.Fatal("the floor's settled counter did not move: the report would read no rate")
			}
		})
	}
}
