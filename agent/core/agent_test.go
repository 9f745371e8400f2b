package core

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/agent/client"
	"github.com/nodeward/nodeward/agent/runtime"
	"github.com/nodeward/nodeward/agent/state"
)

const patience = 20 * time.Second // ≥10× anything these tests wait for

// lockWait is how long a test's agent waits for its state directory's lock,
// as agent/main.go's does: a hook or workload another parallel test forks
// in this process holds a copy of every descriptor, the lock's included,
// until it execs.
const lockWait = 5 * time.Second

type bundle struct {
	t      *testing.T
	clk    *fakeClock
	cp     *fakeCP
	sim    *runtime.Simulated
	dir    string
	store  *state.Store
	agent  *Agent
	cancel context.CancelFunc
	done   chan error

	// What start gives the agents it runs: the config hook and its
	// timeout, the spool's cap (zero: the defaults).
	hook        []string
	hookTimeout time.Duration
	maxEvents   int
	// The long-poll wait asked and the jitter source (setup: 1 s, and 0
	// for every draw).
	pollWait time.Duration
	rand     func() float64

	logMu sync.Mutex
	logs  []string // every line the bundle's agents logged
}

func setup(t *testing.T) *bundle {
	t.Helper()
	clk := newFakeClock()
	b := &bundle{t: t, clk: clk, cp: newFakeCP(t, clk), sim: runtime.NewSimulated(), dir: t.TempDir(),
		pollWait: time.Second, rand: func() float64 { return 0 }}
	b.sim.Now = clk.Now
	t.Cleanup(func() {
		if b.cancel != nil {
			b.stop()
		}
	})
	return b
}

// start runs a new agent on the bundle's state dir (a restart when one ran
// before).
func (b *bundle) start(bs *api.Bootstrap) {
	b.t.Helper()
	st, err := state.Open(b.dir, state.Options{Now: b.clk.Now, MaxEvents: b.maxEvents, LockWait: lockWait})
	if err != nil {
		b.t.Fatal(err)
	}
	b.store = st
	a, err := New(Config{
		Store: st, Runtime: b.sim, Bootstrap: bs, AllowInsecureHTTP: true,
		Labels: map[string]string{"zone": "test"}, Version: "test", Clock: b.clk,
		Logger:   slog.New(slog.NewTextHandler(testWriter{b.t, &b.logMu, &b.logs}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		PollWait: b.pollWait, Rand: b.rand,
		ConfigHook: b.hook, ConfigHookTimeout: b.hookTimeout,
	})
	if err != nil {
		b.t.Fatal(err)
	}
	b.agent = a
	ctx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	b.done = make(chan error, 1)
	go func() { b.done <- a.Run(ctx) }()
}

// stop ends the agent as SIGTERM would and releases the state dir.
func (b *bundle) stop() error {
	b.t.Helper()
	b.cancel()
	b.cancel = nil
	err := b.wait()
	b.store.Close()
	// A poll the stopped agent abandoned must not swallow the next command
	// (a real server would redeliver it after its visibility timeout).
	b.eventually("the abandoned poll to end", 0, func() bool {
		var n int
		b.cp.with(func() { n = b.cp.activePolls })
		return n == 0
	})
	return err
}

// wait returns Run's result.
func (b *bundle) wait() error {
	b.t.Helper()
	select {
	case err := <-b.done:
		b.done <- err // keep it for a later stop
		return err
	case <-time.After(patience):
		b.t.Fatal("agent did not return")
		return nil
	}
}

// eventually polls cond, advancing the fake clock by step per round.
func (b *bundle) eventually(what string, step time.Duration, cond func() bool) {
	b.t.Helper()
	deadline := time.Now().Add(patience)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			b.t.Fatalf("timed out waiting for %s", what)
		}
		if step > 0 {
			b.clk.Advance(step)
		}
		<-tick.C
	}
}

// testWriter passes the agent's log to the test's, and keeps it for
// tests that read what an operator would.
type testWriter struct {
	t    *testing.T
	mu   *sync.Mutex
	kept *[]string
}

func (w testWriter) Write(p []byte) (int, error) {
	line := string(p[:len(p)-1])
	w.t.Log(line)
	w.mu.Lock()
	*w.kept = append(*w.kept, line)
	w.mu.Unlock()
	return len(p), nil
}

// logged answers the lines the bundle's agents logged that hold every
// one of parts.
func (b *bundle) logged(parts ...string) []string {
	b.logMu.Lock()
	defer b.logMu.Unlock()
	var out []string
	for _, l := range b.logs {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			out = append(out, l)
		}
	}
	return out
}

func command(op, kind string, payload any) api.Command {
	b, _ := json.Marshal(payload)
	return api.Command{OperationID: op, NodeID: "node-1", Kind: kind, FencingToken: 1, Payload: b}
}

func launch(op, run, attempt, cmd string, args ...string) api.Command {
	return command(op, api.KindLaunchWorkload, api.LaunchWorkload{RunID: run, AttemptID: attempt, Command: cmd, Args: args})
}

// hasDuplicate reports whether some answer is applied:true, duplicate:true.
func hasDuplicate(rs []api.Result) bool {
	for _, r := range rs {
		if r.Applied && r.Duplicate {
			return true
		}
	}
	return false
}

func states(obs []api.WorkloadObservation) []string {
	var out []string
	for _, o := range obs {
		out = append(out, o.State)
	}
	return out
}

func TestAgent(t *testing.T) {
	t.Run("EnrollHeartbeatPollApplyResult", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.start(b.cp.bootstrap())
		b.eventually("a heartbeat right after enrolling", 0, func() bool { return len(b.cp.heartbeats()) > 0 })
		hb := b.cp.heartbeats()[0]
		if hb.Facts == nil || hb.Facts.Hostname == "" || hb.Facts.CPUs == 0 || hb.Facts.AgentVersion != "test" ||
			hb.Facts.Labels["zone"] != "test" || len(hb.Facts.Runtimes) != 1 || hb.Facts.Runtimes[0] != "simulated" || hb.Facts.ObservedAt.IsZero() {
			t.Fatalf("heartbeat facts %+v", hb.Facts)
		}
		if hb.Facts.DiskFreeBytes == nil {
			t.Fatal("disk free of the state dir not measured")
		}
		b.cp.with(func() {
			if len(b.cp.enrolls) != 1 || b.cp.enrolls[0].NodeID != "node-1" || b.cp.enrolls[0].AgentVersion != "test" {
				t.Fatalf("enrolls %+v", b.cp.enrolls)
			}
		})

		b.cp.push(launch("op-1", "run-1", "a1", "exit", "3"))
		b.eventually("the launch result", 0, func() bool { return len(b.cp.resultsFor("op-1")) == 1 })
		if r := b.cp.resultsFor("op-1")[0]; !r.Applied || r.Duplicate || r.Failure != "" {
			t.Fatalf("result %+v", r)
		}
		b.eventually("created, running, exited", 0, func() bool { return len(b.cp.workloadEvents("run-1", "a1")) == 3 })
		evs := b.cp.workloadEvents("run-1", "a1")
		if got := states(evs); got[0] != "created" || got[1] != "running" || got[2] != "exited" || *evs[2].ExitCode != 3 {
			t.Fatalf("events %v", got)
		}
		// A refused command answers applied:false with the reason.
		b.cp.push(launch("op-2", "run-2", "a1", "fail-start"))
		b.eventually("the refusal", 0, func() bool { return len(b.cp.resultsFor("op-2")) == 1 })
		if r := b.cp.resultsFor("op-2")[0]; r.Applied || r.Failure == "" {
			t.Fatalf("refusal %+v", r)
		}
		b.eventually("the result acknowledged", 0, func() bool { return len(b.store.UnackedResults()) == 0 })
		if err := b.stop(); err != nil {
			t.Fatalf("clean stop returned %v", err)
		}
	})

	t.Run("LostEnrollAnswerIsRetriedWithItsNonce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.cp.with(func() { b.cp.enrollCuts = 1 })
		b.start(b.cp.bootstrap())
		b.eventually("enrolled after the lost answer", 100*time.Millisecond, func() bool { return b.agent.Stats().Enrollments == 1 })
		b.cp.with(func() {
			if len(b.cp.enrolls) != 1 || len(b.cp.enrollTries) != 2 {
				t.Fatalf("committed %d of %d attempts", len(b.cp.enrolls), len(b.cp.enrollTries))
			}
			if n := b.cp.enrollTries[0].EnrollmentNonce; len(n) < 22 || b.cp.enrollTries[1].EnrollmentNonce != n {
				t.Fatalf("nonces %q then %q", n, b.cp.enrollTries[1].EnrollmentNonce)
			}
		})
		if s := b.agent.Session(); s.FencingToken != 1 {
			t.Fatalf("fencing token %d", s.FencingToken)
		}
		b.eventually("a poll on the session", 0, func() bool { return b.agent.Stats().Polls > 0 })
		if _, err := os.Stat(b.store.Path(nonceFile)); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("nonce kept after the session was stored: %v", err)
		}
	})

	// A body the server did not receive within its read timeout (a slow
	// link) is 408: nothing was judged, so the agent tries again rather
	// than stopping as if refused.
	t.Run("EnrollTimedOutReadingIsRetried", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.cp.with(func() { b.cp.enrollSlow = 2 })
		b.start(b.cp.bootstrap())
		b.eventually("enrolled after two slow attempts", 100*time.Millisecond, func() bool { return b.agent.Stats().Enrollments == 1 })
		b.cp.with(func() {
			if len(b.cp.enrolls) != 1 || len(b.cp.enrollTries) != 3 {
				t.Fatalf("committed %d of %d attempts; want 1 of 3", len(b.cp.enrolls), len(b.cp.enrollTries))
			}
		})
	})

	t.Run("RestartMidEnrollmentKeepsItsNonce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// Every attempt committed first is cut: the agent never learns it
		// enrolled before it is stopped.
		b.cp.with(func() { b.cp.enrollCuts = 1 << 30 })
		bs := b.cp.bootstrap()
		b.start(bs)
		b.eventually("the first attempt", 0, func() bool {
			var n int
			b.cp.with(func() { n = len(b.cp.enrollTries) })
			return n > 0
		})
		b.stop()
		b.cp.with(func() { b.cp.enrollCuts = 0 })
		b.start(bs)
		b.eventually("enrolled after the restart", 100*time.Millisecond, func() bool { return b.agent.Stats().Enrollments == 1 })
		b.cp.with(func() {
			tries := b.cp.enrollTries
			if len(b.cp.enrolls) != 1 || tries[len(tries)-1].EnrollmentNonce != tries[0].EnrollmentNonce {
				t.Fatalf("%d enrollments; first nonce %q, last %q", len(b.cp.enrolls), tries[0].EnrollmentNonce, tries[len(tries)-1].EnrollmentNonce)
			}
		})
	})

	t.Run("DuplicateRedeliveryAnsweredDuplicate", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.start(b.cp.bootstrap())
		cmd := launch("op-1", "run-1", "a1", "sleep")
		b.cp.push(cmd)
		b.eventually("the result", 0, func() bool { return len(b.cp.resultsFor("op-1")) == 1 })
		b.cp.push(cmd)
		b.eventually("the duplicate answer", 0, func() bool { return hasDuplicate(b.cp.resultsFor("op-1")) })
		if n := b.sim.Calls("launch"); n != 1 {
			t.Fatalf("launched %d times", n)
		}
	})

	t.Run("RestartDoesNotReapply", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		bs := b.cp.bootstrap()
		b.start(bs)
		cmd := launch("op-1", "run-1", "a1", "sleep")
		b.cp.push(cmd)
		b.eventually("the result", 0, func() bool { return len(b.cp.resultsFor("op-1")) == 1 })
		b.eventually("the running event", 0, func() bool { return len(b.cp.workloadEvents("run-1", "a1")) == 2 })
		if err := b.stop(); err != nil {
			t.Fatal(err)
		}

		// Same state dir, same (spent) bootstrap: the stored session is used.
		b.start(bs)
		b.cp.push(cmd)
		// (The original answer may be sent again first, when the stopped
		// agent had not yet seen it acknowledged.)
		b.eventually("the duplicate answer", 0, func() bool { return hasDuplicate(b.cp.resultsFor("op-1")) })
		if n := b.sim.Calls("launch"); n != 1 {
			t.Fatalf("launched %d times", n)
		}
		b.cp.with(func() {
			if len(b.cp.enrolls) != 1 {
				t.Fatalf("enrolled %d times", len(b.cp.enrolls))
			}
		})
		// Without a bootstrap at all, too.
		b.stop()
		b.start(nil)
		b.eventually("a poll", 0, func() bool { return b.agent.Stats().Polls > 0 })
		// A workload that exited while the agent was down is reported.
		b.stop()
		b.sim.Exit("run-1", "a1", 9)
		b.start(nil)
		b.eventually("the exit", 0, func() bool { return len(b.cp.workloadEvents("run-1", "a1")) == 3 })
		if ev := b.cp.workloadEvents("run-1", "a1")[2]; ev.State != "exited" || *ev.ExitCode != 9 {
			t.Fatalf("exit event %+v", ev)
		}
	})

	t.Run("CrashBetweenEffectAndRecordIsResolvedNotReapplied", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.start(b.cp.bootstrap())
		b.eventually("a poll", 0, func() bool { return b.agent.Stats().Polls > 0 })
		b.stop()
		// The previous run recorded the intent and the launch happened, then
		// the process died before recording the result.
		st, err := state.Open(b.dir, state.Options{LockWait: lockWait})
		if err != nil {
			t.Fatal(err)
		}
		crashed := launch("op-x", "run-x", "a1", "sleep")
		if _, err := st.BeginOp(crashed); err != nil {
			t.Fatal(err)
		}
		st.Close()
		if err := b.sim.Launch(context.Background(), api.LaunchWorkload{RunID: "run-x", AttemptID: "a1", Command: "sleep"}); err != nil {
			t.Fatal(err)
		}
		// And one whose launch never got as far as the runtime.
		st, _ = state.Open(b.dir, state.Options{LockWait: lockWait})
		notYet := launch("op-y", "run-y", "a1", "sleep")
		st.BeginOp(notYet)
		st.Close()

		b.start(nil)
		b.eventually("both resolved and reported", 0, func() bool {
			return len(b.cp.resultsFor("op-x")) == 1 && len(b.cp.resultsFor("op-y")) == 1
		})
		if r := b.cp.resultsFor("op-x")[0]; !r.Applied {
			t.Fatalf("op-x %+v", r)
		}
		if r := b.cp.resultsFor("op-y")[0]; !r.Applied {
			t.Fatalf("op-y %+v", r)
		}
		if got := b.sim.Workloads(); len(got) != 2 {
			t.Fatalf("workloads %v: a launch was repeated or lost", got)
		}
	})

	t.Run("UnacknowledgedResultsRideTheEnrollment", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		st, err := state.Open(b.dir, state.Options{LockWait: lockWait})
		if err != nil {
			t.Fatal(err)
		}
		st.BeginOp(launch("op-old", "r", "a", "sleep"))
		st.FinishOp("op-old", api.Result{Applied: true})
		st.Close()
		b.start(b.cp.bootstrap())
		b.eventually("enrollment", 0, func() bool { return b.agent.Stats().Enrollments == 1 })
		b.cp.with(func() {
			u := b.cp.enrolls[0].UnacknowledgedResults
			if len(u) != 1 || u[0].OperationID != "op-old" || !u[0].Applied {
				t.Fatalf("unacknowledged_results %+v", u)
			}
		})
		if n := len(b.store.UnackedResults()); n != 0 {
			t.Fatalf("%d results still owed after the enrollment settled them", n)
		}
	})

	t.Run("Fenced", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.start(b.cp.bootstrap())
		b.eventually("a poll", 0, func() bool { return b.agent.Stats().Polls > 0 })
		b.cp.with(func() { b.cp.fencing++ }) // someone enrolled after us
		err := b.wait()
		var fe *FatalError
		if !errors.As(err, &fe) || fe.Code != client.CodeFenced {
			t.Fatalf("Run = %v, want fenced", err)
		}
		b.stop()
		if _, err := os.Stat(b.dir + "/fatal.json"); err != nil {
			t.Fatalf("fatal state not recorded: %v", err)
		}
		// Restarting without a new bootstrap fails fast with the same reason.
		b.start(nil)
		if err := b.wait(); !errors.As(err, &fe) || fe.Code != client.CodeFenced {
			t.Fatalf("restart = %v", err)
		}
	})

	t.Run("SessionExpiredWhileAwaySaysWhy", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.cp.with(func() { b.cp.ttl, b.cp.enforceExpiry = 60, true })
		b.start(b.cp.bootstrap())
		b.eventually("a poll", 0, func() bool { return b.agent.Stats().Polls > 0 })
		if err := b.stop(); err != nil {
			t.Fatal(err)
		}
		// The machine was off for longer than the session lifetime.
		b.clk.Advance(2 * time.Minute)
		b.start(nil)
		var fe *FatalError
		err := b.wait()
		if !errors.As(err, &fe) || fe.Code != client.CodeSessionInvalid {
			t.Fatalf("Run = %v, want session_invalid", err)
		}
		if !strings.Contains(err.Error(), "session expired at") || !strings.Contains(err.Error(), "reinvite") {
			t.Fatalf("the refusal does not say the session expired: %v", err)
		}
		b.stop()
		var fr fatalRecord
		if err := state.ReadJSON(b.dir+"/fatal.json", &fr); err != nil || !strings.Contains(fr.Detail, "session expired at") {
			t.Fatalf("fatal.json = %+v, %v", fr, err)
		}
		// Each start without a new bootstrap fails fast with the same
		// reason, which is not rewritten (nor nested) by the restarts.
		for range 2 {
			b.start(nil)
			if err := b.wait(); !errors.As(err, &fe) || fe.Code != client.CodeSessionInvalid || !strings.Contains(err.Error(), "session expired at") {
				t.Fatalf("restart = %v", err)
			}
			b.stop()
		}
		var again fatalRecord
		if err := state.ReadJSON(b.dir+"/fatal.json", &again); err != nil || again != fr {
			t.Fatalf("fatal.json rewritten by a restart: %+v, was %+v (%v)", again, fr, err)
		}
	})

	t.Run("RenewalFailingNearExpiryIsAnError", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.cp.with(func() { b.cp.ttl = 400; b.cp.renewDown = true })
		b.start(b.cp.bootstrap())
		b.eventually("a poll", 0, func() bool { return b.agent.Stats().Polls > 0 })
		// Rand 0: the first renewal at 200 s; it fails and is retried
		// with backoff. Past 300 s (the last quarter) each failure is an
		// error naming the expiry; past 400 s one saying it expired.
		b.eventually("a warning while time is left", time.Second, func() bool {
			return len(b.logged("level=WARN", "session renewal failed; retrying", "session_expires_at=")) > 0
		})
		if n := len(b.logged("level=ERROR")); n != 0 {
			t.Fatalf("%d errors logged with more than a quarter of the session left", n)
		}
		b.eventually("an error in the last quarter", time.Second, func() bool {
			return len(b.logged("level=ERROR", "session renewal keeps failing", "session_expires_at=", "needs a reinvite")) > 0
		})
		b.eventually("an error once expired", time.Second, func() bool {
			return len(b.logged("level=ERROR", "the session expired before it could be renewed")) > 0
		})
	})

	t.Run("StoppedWhileEnrollingIsACleanStop", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.cp.with(func() { b.cp.enrollCuts = 1 << 30 })
		b.start(b.cp.bootstrap())
		b.eventually("an attempt", 0, func() bool {
			var n int
			b.cp.with(func() { n = len(b.cp.enrollTries) })
			return n > 0
		})
		if err := b.stop(); err != nil {
			t.Fatalf("SIGTERM while enrolling: Run = %v, want nil (exit 0)", err)
		}
	})

	t.Run("EnrollmentSpent", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.cp.with(func() { b.cp.spent = true })
		b.start(b.cp.bootstrap())
		var fe *FatalError
		if err := b.wait(); !errors.As(err, &fe) || fe.Code != client.CodeEnrollmentSpent {
			t.Fatalf("Run = %v", err)
		}
	})

	t.Run("RetiredStopsWorkloadsAndDeliversEverything", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.start(b.cp.bootstrap())
		b.cp.push(launch("op-1", "run-1", "a1", "sleep"))
		b.eventually("running", 0, func() bool { return len(b.cp.workloadEvents("run-1", "a1")) == 2 })
		b.cp.with(func() { b.cp.retired = true })
		b.cp.push() // wake the held poll
		if err := b.wait(); !errors.Is(err, ErrRetired) {
			t.Fatalf("Run = %v, want ErrRetired", err)
		}
		if b.sim.Calls("stop") != 1 {
			t.Fatal("workload not stopped")
		}
		evs := b.cp.workloadEvents("run-1", "a1")
		if len(evs) != 3 || evs[2].State != "exited" || *evs[2].ExitCode != 143 {
			t.Fatalf("exit not delivered: %+v", evs)
		}
		if n := len(b.store.UnackedResults()); n != 0 {
			t.Fatalf("%d results undelivered", n)
		}
		if n, _ := b.store.SpoolStats(); n != 0 {
			t.Fatalf("%d events undelivered", n)
		}
	})

	t.Run("BackoffGrowsAndResets", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		fail := func(w http.ResponseWriter) { problem(w, 500, "internal") }
		ok := func(w http.ResponseWriter) { writeJSON(w, api.CommandsResponse{}) }
		b.cp.script(fail, fail, fail, ok, fail)
		b.start(b.cp.bootstrap())
		b.eventually("four backoffs", 100*time.Millisecond, func() bool { return len(b.agent.Stats().Backoffs) >= 4 })
		// Rand is 0: each delay is half its ceiling, so the sequence is exact.
		got := b.agent.Stats().Backoffs[:4]
		want := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 500 * time.Millisecond}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("backoffs %v, want %v", got, want)
			}
		}
	})

	t.Run("PollAfterFailureResumes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		fail := func(w http.ResponseWriter) { problem(w, 500, "internal") }
		ok := func(w http.ResponseWriter) { writeJSON(w, api.CommandsResponse{}) }
		b.cp.script(ok, cutAnswer, fail, ok)
		b.start(b.cp.bootstrap())
		var got []bool
		b.eventually("five polls", 100*time.Millisecond, func() bool {
			b.cp.with(func() { got = append([]bool(nil), b.cp.pollResumes...) })
			return len(got) >= 5
		})
		// The first poll of the process resumes (a previous one may have
		// lost an answer); a success clears it; a cut connection and a 500
		// set it for the poll after them.
		want := []bool{true, false, true, true, false}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("resume flags %v, want %v first", got, want)
			}
		}
		if s := b.agent.Stats(); s.ResumePolls < 3 || s.PollErrors != 2 {
			t.Fatalf("stats %+v", s)
		}
	})

	t.Run("ResumedRedeliveryAnsweredFromJournal", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.start(b.cp.bootstrap())
		cmd := launch("op-1", "run-1", "a1", "sleep")
		b.cp.push(cmd)
		b.eventually("the result", 0, func() bool { return len(b.cp.resultsFor("op-1")) == 1 })
		// The server restarts under the held poll; it holds op-1 as
		// delivered and unsettled, and hands it out again to the poll that
		// resumes.
		b.cp.with(func() { b.cp.onResume = []api.Command{cmd} })
		b.cp.script(cutAnswer)
		b.eventually("the duplicate answer", 100*time.Millisecond, func() bool { return hasDuplicate(b.cp.resultsFor("op-1")) })
		if n := b.sim.Calls("launch"); n != 1 {
			t.Fatalf("launched %d times", n)
		}
		if s := b.agent.Stats(); s.Duplicates != 1 || s.Applied != 1 {
			t.Fatalf("stats %+v", s)
		}
	})

	t.Run("LostConnectionRetryCapped", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		d := cutAnswer
		b.cp.script(d, d, d, d, d, d, d)
		b.start(b.cp.bootstrap())
		b.eventually("seven backoffs", 100*time.Millisecond, func() bool { return len(b.agent.Stats().Backoffs) >= 7 })
		// Rand is 0: half the ceiling, which doubles from 1 s but stops at
		// 5 s while the server's process is gone (a 500 goes on to 60 s).
		got := b.agent.Stats().Backoffs[:7]
		want := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 2500 * time.Millisecond,
			2500 * time.Millisecond, 2500 * time.Millisecond, 2500 * time.Millisecond}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("backoffs %v, want %v", got, want)
			}
		}
	})

	t.Run("DrainingRetryAfterHonoured", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.cp.script(func(w http.ResponseWriter) {
			w.Header().Set("Retry-After", "7")
			problem(w, 503, "draining")
		})
		b.start(b.cp.bootstrap())
		b.eventually("the poll after draining", 250*time.Millisecond, func() bool {
			var n int
			b.cp.with(func() { n = len(b.cp.pollTimes) })
			return n >= 2
		})
		b.cp.with(func() {
			if gap := b.cp.pollTimes[1].Sub(b.cp.pollTimes[0]); gap < 7*time.Second {
				t.Fatalf("polled again after %s, before Retry-After 7s", gap)
			}
		})
	})

	t.Run("SpoolReplayedAfterReconnect", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// An event spooled by a previous run, never delivered.
		st, err := state.Open(b.dir, state.Options{LockWait: lockWait})
		if err != nil {
			t.Fatal(err)
		}
		old := api.Event{ID: "11111111-1111-1111-1111-111111111111", Kind: api.EventWorkload, ObservedAt: b.clk.Now(),
			Workload: &api.WorkloadObservation{RunID: "r0", AttemptID: "a0", State: "exited", ExitCode: new(int), ObservedAt: b.clk.Now()}}
		st.AppendEvent(old)
		st.Close()
		b.cp.with(func() { b.cp.eventsDown = 3 })
		b.start(b.cp.bootstrap())
		b.cp.push(launch("op-1", "run-1", "a1", "exit", "0"))
		b.eventually("the spool to drain through the outage", 500*time.Millisecond, func() bool {
			return len(b.cp.workloadEvents("r0", "a0")) == 1 && len(b.cp.workloadEvents("run-1", "a1")) == 3
		})
		if n, _ := b.store.SpoolStats(); n != 0 {
			b.eventually("empty spool", 0, func() bool { n, _ := b.store.SpoolStats(); return n == 0 })
		}
	})

	t.Run("RenewsBeforeExpiry", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.cp.with(func() { b.cp.ttl = 60 })
		b.start(b.cp.bootstrap())
		b.eventually("a poll", 0, func() bool { return b.agent.Stats().Polls > 0 })
		start := b.clk.Now()
		b.eventually("a renewal", time.Second, func() bool { return b.agent.Stats().Renewals > 0 })
		// Rand is 0: renewal at 50% of the TTL, well before expiry.
		if el := b.clk.Now().Sub(start); el > 45*time.Second {
			t.Fatalf("renewed %s into a 60s session", el)
		}
		tok := b.agent.Session().SessionToken
		if tok != "session-1-r1" {
			t.Fatalf("session token %q", tok)
		}
		b.eventually("a poll with the renewed token", 0, func() bool {
			found := false
			b.cp.with(func() {
				for _, pt := range b.cp.pollTokens {
					found = found || pt == tok
				}
			})
			return found
		})
		sess, err := b.store.Session()
		if err != nil || sess.SessionToken != tok {
			t.Fatalf("renewed session not stored: %v", err)
		}
	})
}

// Agents brought up together must not re-poll together forever: each poll
// asks a wait drawn from the last fifth below the configured one.
func TestPollWaitsSpread(t *testing.T) {
	b := setup(t)
	b.pollWait = 25 * time.Second
	var mu sync.Mutex
	draw := 0.0
	b.rand = func() float64 { // every draw another value in [0, 1)
		mu.Lock()
		defer mu.Unlock()
		draw = math.Mod(draw+0.37, 1)
		return draw
	}
	b.start(b.cp.bootstrap())
	b.eventually("six polls", 0, func() bool {
		var n int
		b.cp.with(func() { n = len(b.cp.pollWaits) })
		return n >= 6
	})
	seen := map[string]bool{}
	b.cp.with(func() {
		for _, w := range b.cp.pollWaits {
			if n, err := strconv.Atoi(w); err != nil || n < 20 || n > 25 {
				t.Fatalf("asked wait=%q, want 20–25", w)
			}
			seen[w] = true
		}
	})
	if len(seen) < 2 {
		t.Fatalf("every poll asked the same wait %v", seen)
	}
	if got := pollWait(3*time.Second, func() float64 { return 0 }); got != 3*time.Second {
		t.Fatalf("a short wait is asked as it is, got %s", got)
	}
}

func TestBackoff(t *testing.T) {
	b := newBackoff(time.Second, 8*time.Second, func() float64 { return 0.999 })
	var got []time.Duration
	for range 6 {
		got = append(got, b.next())
	}
	for i, d := range got {
		ceil := min(time.Second<<i, 8*time.Second)
		if d < ceil/2 || d >= ceil {
			t.Fatalf("delay %d = %s, want in [%s, %s)", i, d, ceil/2, ceil)
		}
	}
	b.reset()
	if d := b.next(); d >= time.Second {
		t.Fatalf("after reset %s", d)
	}
}
