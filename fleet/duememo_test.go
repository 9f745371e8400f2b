package fleet_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/testwait"
	"github.com/nodeward/nodeward/keys"
	"github.com/nodeward/nodeward/metrics"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// reads answers the due-work reads and the skipped ones so far.
func reads(m *metrics.Metrics) (float64, float64) {
	return testutil.ToFloat64(m.PollStoreQueries), testutil.ToFloat64(m.PollReadsSkipped)
}

// requireReads holds one poll (a minute's wait) until its arrival check is
// done and found nothing to answer at once, ends it (the agent goes), and
// checks what the check cost: dr reads made, ds skipped.
func requireReads(t *testing.T, svc *fleet.Service, m *metrics.Metrics, sess fleet.Session, resume bool, dr, ds float64, msg string) {
	t.Helper()
	pollChecked(t, svc, m, sess, resume, false, dr, ds, msg)
}

// requireAnswer is requireReads for a poll answered at once: it answers
// the answer.
func requireAnswer(t *testing.T, svc *fleet.Service, m *metrics.Metrics, sess fleet.Session, resume bool, dr, ds float64, msg string) fleet.PollAnswer {
	t.Helper()
	return pollChecked(t, svc, m, sess, resume, true, dr, ds, msg)
}

func pollChecked(t *testing.T, svc *fleet.Service, m *metrics.Metrics, sess fleet.Session, resume, answered bool, dr, ds float64, msg string) fleet.PollAnswer {
	t.Helper()
	r0, s0 := reads(m)
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		a   fleet.PollAnswer
		err error
	}
	done := make(chan result, 1)
	go func() {
		a, err := svc.PollFor(pctx, sess, fleet.PollRequest{Wait: time.Minute, Resume: resume})
		done <- result{a, err}
	}()
	var got result
	if answered {
		got = <-done // a minute's wait: answered at once, or the test fails on it
		require.NoError(t, got.err, msg)
		require.True(t, len(got.a.Commands) > 0 || got.a.Config != nil, "%s: answered with work", msg)
	} else {
		testwait.For(t, msg+": the arrival check", testwait.Patience, func() bool {
			r, s := reads(m)
			return svc.Hub().HeldFor(sess.NodeID) == 1 && r+s > r0+s0
		})
		cancel()
		got = <-done
		require.ErrorIs(t, got.err, context.Canceled, "%s: held until the agent went", msg)
	}
	r1, s1 := reads(m)
	require.Equal(t, dr, r1-r0, "%s: due-work reads", msg)
	require.Equal(t, ds, s1-s0, "%s: reads skipped", msg)
	return got.a
}

// TestIdleRepollSkipsRead: a node's re-poll with nothing new since the last
// read costs no store read; every write that can make work due (an issue,
// a released answer, a configuration, a report that unsettles it, a
// re-enrollment) is heard and read again; a delivered command not yet
// settled keeps every poll reading (it falls due again by time alone), and
// a resuming one reads and has it resent, while one resuming on a quiet
// node has nothing to be resent and skips the read; and the knowledge
// ages out.
func TestIdleRepollSkipsRead(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		t.Run("QuietRepoll", func(t *testing.T) {
			_, sess, _ := b.readyNode(t)
			requireReads(t, b.svc, b.metrics, sess, false, 1, 0, "first poll")
			for i := range 3 {
				b.clock.Advance(25 * time.Second)
				requireReads(t, b.svc, b.metrics, sess, false, 0, 1, "re-poll "+itoa(i))
			}
			requireReads(t, b.svc, b.metrics, sess, true, 0, 1, "a resuming poll of a quiet node: nothing pending it could resend")
			// A poll that does not wait always reads: no wake-up would answer it.
			r0, s0 := reads(b.metrics)
			a, err := b.svc.PollFor(ctx, sess, fleet.PollRequest{})
			require.NoError(t, err)
			require.Empty(t, a.Commands)
			r1, s1 := reads(b.metrics)
			require.Equal(t, [2]float64{r0 + 1, s0}, [2]float64{r1, s1}, "a poll without a wait reads")
		})
		t.Run("IssueIsHeard", func(t *testing.T) {
			id, sess, _ := b.readyNode(t)
			requireReads(t, b.svc, b.metrics, sess, false, 1, 0, "first poll")
			requireReads(t, b.svc, b.metrics, sess, false, 0, 1, "quiet")
			b.issue(t, id, launch("memo-issue"))
			a := requireAnswer(t, b.svc, b.metrics, sess, false, 1, 0, "after an issue")
			require.Equal(t, []string{"memo-issue"}, ops(a.Commands))
			// Delivered, not settled: it falls due again by time alone, so
			// every poll reads until it is settled.
			requireReads(t, b.svc, b.metrics, sess, false, 1, 0, "unsettled 1")
			a = requireAnswer(t, b.svc, b.metrics, sess, true, 1, 0, "a resuming poll while it is unsettled")
			require.Equal(t, []string{"memo-issue"}, ops(a.Commands), "resent at once")
			b.clock.Advance(30 * time.Second)
			requireReads(t, b.svc, b.metrics, sess, false, 1, 0, "unsettled 2")
			b.clock.Advance(31 * time.Second)
			a = requireAnswer(t, b.svc, b.metrics, sess, false, 1, 0, "past the visibility timeout")
			require.Equal(t, []string{"memo-issue"}, ops(a.Commands), "redelivered")
			_, err := b.svc.Settle(ctx, sess, []api.Result{{OperationID: "memo-issue", Applied: true}})
			require.NoError(t, err)
			// The settlement left nothing pending: quiet without a read.
			requireReads(t, b.svc, b.metrics, sess, false, 0, 1, "settled")
			requireReads(t, b.svc, b.metrics, sess, false, 0, 1, "then quiet")
		})
		t.Run("SettlementLeavingWorkReads", func(t *testing.T) {
			id, sess, _ := b.readyNode(t)
			requireReads(t, b.svc, b.metrics, sess, false, 1, 0, "first poll")
			b.issue(t, id, launch("memo-s1"))
			b.issue(t, id, launch("memo-s2"))
			a := requireAnswer(t, b.svc, b.metrics, sess, false, 1, 0, "both delivered")
			require.Len(t, a.Commands, 2)
			_, err := b.svc.Settle(ctx, sess, []api.Result{{OperationID: "memo-s1", Applied: true}})
			require.NoError(t, err)
			requireReads(t, b.svc, b.metrics, sess, false, 1, 0, "one still unsettled: read")
			_, err = b.svc.Settle(ctx, sess, []api.Result{{OperationID: "memo-s2", Applied: true}})
			require.NoError(t, err)
			requireReads(t, b.svc, b.metrics, sess, false, 0, 1, "the last settled: quiet")
			_, err = b.svc.Settle(ctx, sess, []api.Result{{OperationID: "memo-s2", Applied: true}})
			require.NoError(t, err)
			requireReads(t, b.svc, b.metrics, sess, false, 0, 1, "settling again changes nothing")
		})
		t.Run("ReleaseIsHeard", func(t *testing.T) {
			id, sess, _ := b.readyNode(t)
			b.issue(t, id, launch("memo-release"))
			a := requireAnswer(t, b.svc, b.metrics, sess, false, 1, 0, "delivered")
			require.NoError(t, b.svc.Release(ctx, sess, a.Commands))
			a = requireAnswer(t, b.svc, b.metrics, sess, false, 1, 0, "released: due at once")
			require.Equal(t, []string{"memo-release"}, ops(a.Commands))
		})
		t.Run("ConfigurationIsHeard", func(t *testing.T) {
			id, sess, _ := b.readyNode(t)
			requireReads(t, b.svc, b.metrics, sess, false, 1, 0, "first poll")
			requireReads(t, b.svc, b.metrics, sess, false, 0, 1, "quiet")
			rev := b.configure(t, id, `{"a":1}`, false)
			a := requireAnswer(t, b.svc, b.metrics, sess, false, 1, 0, "after a configuration")
			require.NotNil(t, a.Config)
			require.Equal(t, rev.Revision, a.Config.Revision)
			// Delivered, not reported: rides along, so the poll reads.
			requireReads(t, b.svc, b.metrics, sess, false, 1, 0, "delivered, not reported")
			b.reportConfig(t, sess, rev.Revision, rev.Hash, api.ConfigApplied, "")
			requireReads(t, b.svc, b.metrics, sess, false, 1, 0, "reported: read once")
			requireReads(t, b.svc, b.metrics, sess, false, 0, 1, "then quiet")
			// A later report naming another revision unsettles it: heard
			// (past the visibility timeout, so it is answered at once
			// rather than riding along).
			b.clock.Advance(61 * time.Second)
			b.reportConfig(t, sess, rev.Revision+7, rev.Hash, api.ConfigApplied, "")
			a = requireAnswer(t, b.svc, b.metrics, sess, false, 1, 0, "unsettled by a report")
			require.NotNil(t, a.Config, "due again")
			// Forced again while quiet: heard.
			b.reportConfig(t, sess, rev.Revision, rev.Hash, api.ConfigFailed, "no")
			requireReads(t, b.svc, b.metrics, sess, false, 1, 0, "failed: read once")
			requireReads(t, b.svc, b.metrics, sess, false, 0, 1, "a failed report is quiet")
			b.configure(t, id, `{"a":1}`, true)
			a = requireAnswer(t, b.svc, b.metrics, sess, false, 1, 0, "forced")
			require.NotNil(t, a.Config)
		})
		t.Run("ReenrollmentReads", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			resp := b.enroll(t, boot)
			sess, err := b.svc.Authenticate(ctx, resp.SessionToken, fleet.DoorAsk)
			require.NoError(t, err)
			requireReads(t, b.svc, b.metrics, sess, false, 1, 0, "first poll")
			requireReads(t, b.svc, b.metrics, sess, false, 0, 1, "quiet")
			fresh, err := b.svc.Reinvite(ctx, "a", boot.NodeID, nil)
			require.NoError(t, err)
			resp = b.enroll(t, fresh)
			sess2, err := b.svc.Authenticate(ctx, resp.SessionToken, fleet.DoorAsk)
			require.NoError(t, err)
			require.NotEqual(t, sess.Fencing, sess2.Fencing)
			requireReads(t, b.svc, b.metrics, sess2, false, 1, 0, "a new fencing token reads")
		})
		t.Run("AgesOut", func(t *testing.T) {
			_, sess, _ := b.readyNode(t)
			requireReads(t, b.svc, b.metrics, sess, false, 1, 0, "first poll")
			b.clock.Advance(4 * time.Minute)
			requireReads(t, b.svc, b.metrics, sess, false, 0, 1, "within the bound")
			b.clock.Advance(time.Minute)
			requireReads(t, b.svc, b.metrics, sess, false, 1, 0, "five minutes on: read again")
		})
		t.Run("HeldPollWokenByIssue", func(t *testing.T) {
			id, sess, _ := b.readyNode(t)
			requireReads(t, b.svc, b.metrics, sess, false, 1, 0, "first poll")
			r0, s0 := reads(b.metrics)
			direct0 := testutil.ToFloat64(b.metrics.PollDirectClaims)
			res := b.pollAsync(sess, time.Minute)
			testwait.For(t, "poll to be held on a skipped read", testwait.Patience, func() bool {
				r, s := reads(b.metrics)
				return b.svc.Hub().HeldFor(id) == 1 && s == s0+1 && r == r0
			})
			b.issue(t, id, launch("memo-held"))
			r := <-res
			require.NoError(t, r.err)
			require.Equal(t, []string{"memo-held"}, ops(r.cmds))
			r1, _ := reads(b.metrics)
			require.Equal(t, r0, r1, "a command recorded here is claimed without a read")
			require.Equal(t, direct0+1, testutil.ToFloat64(b.metrics.PollDirectClaims))
		})
		t.Run("NotifierDownReads", func(t *testing.T) {
			_, sess, _ := b.readyNode(t)
			requireReads(t, b.svc, b.metrics, sess, false, 1, 0, "first poll")
			requireReads(t, b.svc, b.metrics, sess, false, 0, 1, "quiet")
			// What a listener does when its connection drops, then comes back.
			b.svc.SetNotifierHealthy(false)
			requireReads(t, b.svc, b.metrics, sess, false, 1, 0, "notifier down")
			requireReads(t, b.svc, b.metrics, sess, false, 1, 0, "still down: nothing kept")
			b.svc.Deliver([]fleet.Notification{{Kind: fleet.NotifyResync}}, "notify")
			b.svc.SetNotifierHealthy(true)
			requireReads(t, b.svc, b.metrics, sess, false, 1, 0, "reconnected")
			requireReads(t, b.svc, b.metrics, sess, false, 0, 1, "quiet again")
			// A resync alone (a reconnection) voids it too.
			b.svc.Deliver([]fleet.Notification{{Kind: fleet.NotifyResync}}, "notify")
			requireReads(t, b.svc, b.metrics, sess, false, 1, 0, "after a resync")
		})
	})
}

// replica is one control plane of a two-replica Postgres test: its own
// store, service, metrics and notification listener, on a shared clock.
type replica struct {
	svc     *fleet.Service
	store   *models.FleetStore
	metrics *metrics.Metrics
	sink    *countingSink
	listen  context.CancelFunc
	stopped chan struct{}
	db      *models.DB
	name    string
}

// countingSink passes a listener's calls to the service and counts its
// reconnections (healthy reported true).
type countingSink struct {
	svc   *fleet.Service
	mu    sync.Mutex
	up    int
	ok    bool
	heard map[string]bool // node ids of the notifications heard
}

func (c *countingSink) Deliver(n []fleet.Notification, source string) {
	c.svc.Deliver(n, source)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, x := range n {
		c.heard[x.NodeID] = true
	}
}

func (c *countingSink) hasHeard(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.heard[id]
}

// barrier sends a notification after everything committed so far and
// waits until r's listener hears it: NOTIFY is delivered in commit order,
// so r has then heard every earlier one.
func (r *replica) barrier(t *testing.T) {
	t.Helper()
	id := "barrier-" + randomSuffix()
	require.NoError(t, r.db.Exec("SELECT pg_notify(?, ?)", models.NotifyChannel(r.db),
		fleet.Notification{Kind: fleet.NotifyOperation, NodeID: id}.Encode("test-barrier")).Error)
	testwait.For(t, r.name+" to hear the barrier", testwait.Patience, func() bool { return r.sink.hasHeard(id) })
}

func (c *countingSink) SetNotifierHealthy(ok bool) {
	c.svc.SetNotifierHealthy(ok)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ok = ok
	if ok {
		c.up++
	}
}

func (c *countingSink) state() (int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.up, c.ok
}

// twoReplicas starts replicas prefix-a and prefix-b on one Postgres with
// one clock, and a bundle over B for making nodes and issuing work there.
func twoReplicas(t *testing.T, db *models.DB, prefix string) (a, b *replica, onB *bundle) {
	t.Helper()
	clk := newClock()
	a, b = newReplica(t, db, prefix+"-a", clk), newReplica(t, db, prefix+"-b", clk)
	return a, b, &bundle{db: db, svc: b.svc, clock: clk, metrics: b.metrics}
}

func newReplica(t *testing.T, db *models.DB, name string, clk *clock) *replica {
	t.Helper()
	return startReplica(t, db, name, clk, true)
}

// startReplica is newReplica; without run the service's loops (the
// publisher and its peer watch among them) are not started, and the test
// looks for peers itself (fleet.WatchPeers).
func startReplica(t *testing.T, db *models.DB, name string, clk *clock, run bool) *replica {
	t.Helper()
	r := &replica{metrics: metrics.New(nil), db: db, name: name}
	store := models.NewFleetStore(db, name, nil)
	r.store = store
	r.svc = fleet.New(fleet.Options{Store: store, Keys: keys.NewRing(testKey), Now: clk.Now, Metrics: r.metrics, CrossReplica: true,
		Logger: slog.New(slog.DiscardHandler), Settings: fleet.Settings{PublicURL: "https://cp.example", AgentVersion: "1.2.3",
			ReplicaID: name, LeaseFlushInterval: 5 * time.Millisecond, SkipWarmUp: true}})
	store.SetOnCommit(func(n []fleet.Notification) { r.svc.Deliver(n, "local") })
	r.sink = &countingSink{svc: r.svc, heard: map[string]bool{}}
	if run {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); r.svc.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	r.startListener(t)
	t.Cleanup(func() { r.stopListener() })
	return r
}

func (r *replica) startListener(t *testing.T) {
	t.Helper()
	up, _ := r.sink.state()
	ctx, cancel := context.WithCancel(context.Background())
	r.listen, r.stopped = cancel, make(chan struct{})
	l := &models.Listener{URL: r.db.URL, Channel: models.NotifyChannel(r.db), Replica: r.name, Sink: r.sink,
		Log: slog.New(slog.DiscardHandler)}
	go func(done chan struct{}) { defer close(done); l.Run(ctx) }(r.stopped)
	testwait.For(t, r.name+"'s listener to connect", testwait.Patience, func() bool {
		n, ok := r.sink.state()
		return ok && n == up+1
	})
}

func (r *replica) stopListener() {
	if r.listen != nil {
		r.listen()
		<-r.stopped
		r.listen = nil
	}
}

// TestQuietAcrossReplicas (Postgres): a node polling replica A, quiet there,
// is answered at once with a command issued on replica B (B's NOTIFY voids
// A's knowledge and wakes the poll); while A's listener is stopped A reads
// on every poll (and so finds what B issued meanwhile, unheard); after its
// connection is cut and re-established, the next poll reads.
func TestQuietAcrossReplicas(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		if db.Dialect != models.Postgres {
			t.Skip("several replicas need Postgres (DECISIONS.md §23)")
		}
		a, bb, nb := twoReplicas(t, db, "memo")
		id, _, tok := nb.readyNode(t)
		sess, err := a.svc.Authenticate(ctx, tok, fleet.DoorAsk)
		require.NoError(t, err)
		a.barrier(t) // A has heard B's enrollment

		requireReads(t, a.svc, a.metrics, sess, false, 1, 0, "first poll on A")
		requireReads(t, a.svc, a.metrics, sess, false, 0, 1, "quiet on A")

		// Held on A on a skipped read; issued on B: answered at once.
		r0, s0 := reads(a.metrics)
		notified := testutil.ToFloat64(a.metrics.Wakeups.WithLabelValues("notify"))
		fallbacks := testutil.ToFloat64(a.metrics.Wakeups.WithLabelValues("poll"))
		res := make(chan pollResult, 1)
		go func() {
			cmds, err := a.svc.Poll(ctx, sess, time.Minute, "")
			res <- pollResult{cmds, err}
		}()
		testwait.For(t, "poll held on A on a skipped read", testwait.Patience, func() bool {
			r, s := reads(a.metrics)
			return a.svc.Hub().HeldFor(id) == 1 && s == s0+1 && r == r0
		})
		x1 := launch("memo-x1")
		x1.NodeID = id
		_, _, err = bb.svc.Issue(ctx, "admin:test", x1)
		require.NoError(t, err)
		got := <-res
		require.NoError(t, got.err)
		require.Equal(t, []string{"memo-x1"}, ops(got.cmds))
		require.Equal(t, notified+1, testutil.ToFloat64(a.metrics.Wakeups.WithLabelValues("notify")), "woken by B's notification")
		require.Equal(t, fallbacks, testutil.ToFloat64(a.metrics.Wakeups.WithLabelValues("poll")), "not by a fallback look")
		_, err = a.svc.Settle(ctx, sess, []api.Result{{OperationID: "memo-x1", Applied: true}})
		require.NoError(t, err)
		requireReads(t, a.svc, a.metrics, sess, false, 0, 1, "settled here with nothing left: quiet")

		// A's listener stops: A may miss B's notifications, so it reads, and
		// finds what B issued unheard.
		a.stopListener()
		_, ok := a.sink.state()
		require.False(t, ok)
		x2 := launch("memo-x2")
		x2.NodeID = id
		_, _, err = bb.svc.Issue(ctx, "admin:test", x2)
		require.NoError(t, err)
		ans := requireAnswer(t, a.svc, a.metrics, sess, false, 1, 0, "listener down")
		require.Equal(t, []string{"memo-x2"}, ops(ans.Commands))
		_, err = a.svc.Settle(ctx, sess, []api.Result{{OperationID: "memo-x2", Applied: true}})
		require.NoError(t, err)
		requireReads(t, a.svc, a.metrics, sess, false, 1, 0, "still down: nothing kept")
		a.startListener(t)
		requireReads(t, a.svc, a.metrics, sess, false, 1, 0, "reconnected")
		requireReads(t, a.svc, a.metrics, sess, false, 0, 1, "quiet again")

		// The listener's connection is cut under it: it reconnects by
		// itself, and the next poll reads.
		up, _ := a.sink.state()
		var killed int
		require.NoError(t, db.Raw(`SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE query LIKE 'LISTEN %' AND strpos(query, ?) > 0 AND pid <> pg_backend_pid()`, models.NotifyChannel(db)).Scan(&killed).Error)
		require.Equal(t, 2, killed, "both replicas' listeners")
		testwait.For(t, "A's listener to reconnect", testwait.Patience, func() bool {
			n, ok := a.sink.state()
			return ok && n > up
		})
		requireReads(t, a.svc, a.metrics, sess, false, 1, 0, "after the reconnection")
		requireReads(t, a.svc, a.metrics, sess, false, 0, 1, "quiet again")
	})
}

// TestGreetingEndsALoneReplicasSilence (Postgres): replica A looked for
// peers and found none, so what it commits is announced to nobody. Replica
// B's listener greets the others when it connects: A then makes every
// replica resync (B reads what A did not announce) and announces again, so
// a command A records for a node held on B wakes B's poll by notification,
// not at B's fallback.
func TestGreetingEndsALoneReplicasSilence(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		if db.Dialect != models.Postgres {
			t.Skip("several replicas need Postgres (DECISIONS.md §23)")
		}
		clk := newClock()
		a := startReplica(t, db, "greet-a", clk, false)
		fleet.WatchPeers(a.svc, clk.Now())
		onA := &bundle{db: db, svc: a.svc, clock: clk, metrics: a.metrics}
		id, _, tok := onA.readyNode(t)
		x0 := launch("greet-x0")
		x0.NodeID = id
		unsent := a.store.AnnounceStats().Unsent
		_, _, err := a.svc.Issue(ctx, "admin:test", x0)
		require.NoError(t, err)
		require.Greater(t, a.store.AnnounceStats().Unsent, unsent, "alone: announced to nobody")

		sent := a.store.AnnounceStats().Statements
		b := newReplica(t, db, "greet-b", clk)
		testwait.For(t, "A's resync after B's greeting", testwait.Patience, func() bool {
			return a.store.AnnounceStats().Statements > sent
		})
		sess, err := b.svc.Authenticate(ctx, tok, fleet.DoorAsk)
		require.NoError(t, err)
		ans, err := b.svc.Poll(ctx, sess, time.Minute, "")
		require.NoError(t, err)
		require.Equal(t, []string{"greet-x0"}, ops(ans))
		_, err = b.svc.Settle(ctx, sess, []api.Result{{OperationID: "greet-x0", Applied: true}})
		require.NoError(t, err)

		notified := testutil.ToFloat64(b.metrics.Wakeups.WithLabelValues("notify"))
		res := make(chan pollResult, 1)
		go func() {
			cmds, err := b.svc.Poll(ctx, sess, time.Minute, "")
			res <- pollResult{cmds, err}
		}()
		testwait.For(t, "poll held on B", testwait.Patience, func() bool { return b.svc.Hub().HeldFor(id) == 1 })
		x1 := launch("greet-x1")
		x1.NodeID = id
		_, _, err = a.svc.Issue(ctx, "admin:test", x1)
		require.NoError(t, err)
		got := <-res
		require.NoError(t, got.err)
		require.Equal(t, []string{"greet-x1"}, ops(got.cmds))
		require.Equal(t, notified+1, testutil.ToFloat64(b.metrics.Wakeups.WithLabelValues("notify")), "woken by A's announcement")
	})
}
