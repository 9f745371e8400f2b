package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// laneWatch sees, for every transaction that locks a fan-out's released
// children (Tx.LockOperations: its commands' recording), the route it ran
// under and the children it locked; with fail set, such a transaction
// routed to a lane fails instead (a replica stopping mid-recording).
type laneWatch struct {
	ledger.Store
	fail atomic.Bool
	// failed counts the transactions fail failed.
	failed atomic.Int64
	// failUnrecorded fails Tx.Unrecorded (a resumed recording's read).
	failUnrecorded atomic.Bool

	// hold, when set, holds every transaction routed to a node at its
	// start until it is closed (a recording waiting for its lanes); held
	// counts those waiting now. Nothing of the transaction has run, so on
	// SQLite too the one writer stays free meanwhile.
	hold atomic.Pointer[chan struct{}]
	held atomic.Int64

	mu    sync.Mutex // guards the following
	locks []laneLock
}

type laneLock struct {
	route  fleet.TxRoute
	routed bool
	ids    []string
}

var errInjected = errors.New("injected: the replica stopped")

func (s *laneWatch) Tx(ctx context.Context, fn func(ledger.Tx) error) error {
	route, routed := fleet.TxRouteOf(ctx)
	if h := s.hold.Load(); h != nil && route.Node != "" {
		s.held.Add(1)
		select {
		case <-*h:
		case <-ctx.Done():
		}
		s.held.Add(-1)
	}
	return s.Store.Tx(ctx, func(tx ledger.Tx) error { return fn(laneWatchTx{tx, s, route, routed}) })
}

func (s *laneWatch) recorded() []laneLock {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]laneLock(nil), s.locks...)
}

type laneWatchTx struct {
	ledger.Tx
	s      *laneWatch
	route  fleet.TxRoute
	routed bool
}

func (t laneWatchTx) Unrecorded(ctx context.Context, parentID string, kinds []string) ([]ledger.Operation, error) {
	if t.s.failUnrecorded.Load() {
		return nil, errInjected
	}
	return t.Tx.Unrecorded(ctx, parentID, kinds)
}

func (t laneWatchTx) LockOperations(ctx context.Context, ids []string) ([]ledger.Operation, error) {
	if t.routed && t.s.fail.Load() {
		t.s.failed.Add(1)
		return nil, errInjected
	}
	ops, err := t.Tx.LockOperations(ctx, ids)
	if err == nil {
		t.s.mu.Lock()
		t.s.locks = append(t.s.locks, laneLock{route: t.route, routed: t.routed, ids: append([]string(nil), ids...)})
		t.s.mu.Unlock()
	}
	return ops, err
}

// newLaneLedger is a ledger over db whose store is watched; on Postgres
// its group commit runs four write lanes.
func newLaneLedger(t *testing.T, db *models.DB, mutate ...func(*ledger.Settings)) (*bundle, *laneWatch) {
	t.Helper()
	w := &laneWatch{}
	b := newLedgerWrapped(t, db, newTestKinds(), newClock(), func(s ledger.Store) ledger.Store {
		w.Store = s
		return w
	}, mutate...)
	if db.Dialect == models.Postgres {
		b.fstore.SetWriteLanes(4)
	}
	return b, w
}

// cutShort submits a fan-out of kind k over n new ready nodes whose
// recording fails (w.fail): its children exist, none is recorded.
func (b *bundle) cutShort(t *testing.T, w *laneWatch, k fanOutKind, n int) (ledger.Operation, []string, map[string]fleet.Session) {
	t.Helper()
	ids, sessions := b.readyNodes(t, n)
	w.fail.Store(true)
	failed := w.failed.Load()
	parent := b.fanOut(t, k, ids)
	// The recording has failed (on a busy machine it may not have begun
	// when the children exist) and returned — every lane of it: until
	// then this replica's advances leave the parent to it — and nothing
	// was recorded meanwhile.
	require.Eventually(t, func() bool { return w.failed.Load() > failed && !b.svc.RecordingForTest(parent.ID) }, waitLong, tick)
	require.Zero(t, k.recorded(t, b, parent.ID))
	w.fail.Store(false)
	return parent, ids, sessions
}

// fanOutKind is a fan-out kind whose children a fan-out records as it
// commits (Kind.RecordedTogether), with how a test sees them recorded and
// answers them.
type fanOutKind struct {
	name      string
	operation string
	// recorded counts the parent's children recorded for their nodes.
	recorded func(t *testing.T, b *bundle, parentID string) int64
	// answer has the sessions' agents answer what they are handed, as
	// applied, until the parent has ended.
	answer func(b *bundle, t *testing.T, parentID string, sessions map[string]fleet.Session)
}

var fanOutKinds = []fanOutKind{{
	name:      ledger.KindFleetCommand,
	operation: `{"kind":"node.prepare_image","payload":{"image":"lanes:1"}}`,
	recorded:  func(t *testing.T, b *bundle, parentID string) int64 { return b.handedOut(t, parentID) },
	answer:    (*bundle).settleAll,
}, {
	name:      ledger.KindFleetConfigure,
	operation: `{"format":"lanes/v1","document":{"lanes":1}}`,
	recorded:  func(t *testing.T, b *bundle, parentID string) int64 { return b.configuredBy(t, parentID) },
	answer:    (*bundle).applyAll,
}}

// configuredBy counts the nodes whose desired configuration a child of
// the parent wrote.
func (b *bundle) configuredBy(t *testing.T, parentID string) int64 {
	t.Helper()
	return dbtest.Count(t, b.db.DB, &models.NodeConfigRow{}, "operation_id IN (SELECT id FROM operations WHERE parent_id = ?)", parentID)
}

// applyAll reports every configuration the sessions are handed as
// applied until the parent has ended.
func (b *bundle) applyAll(t *testing.T, parentID string, sessions map[string]fleet.Session) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, sess := range sessions {
			a, err := b.fleet.PollWork(ctx, sess, 0, "test")
			require.NoError(t, err)
			if a.Config != nil {
				b.reportConfig(t, sess, a.Config.Revision, api.ConfigApplied, "")
			}
		}
		op, err := b.store.Operation(ctx, parentID)
		require.NoError(t, err)
		return op.Terminal()
	}, waitLong, tick, "the fan-out never ended")
}

// eachFanOutKind runs fn for each fan-out kind recorded as it commits.
func eachFanOutKind(t *testing.T, fn func(t *testing.T, k fanOutKind)) {
	for _, k := range fanOutKinds {
		t.Run(k.name, func(t *testing.T) { fn(t, k) })
	}
}

func (b *bundle) fanOut(t *testing.T, k fanOutKind, ids []string) ledger.Operation {
	t.Helper()
	parent, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: k.name,
		Targets: nodeTargets(ids...), Operation: json.RawMessage(k.operation)})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(b.children(t, parent.ID)) == len(ids) }, waitLong, tick)
	return parent
}

func (b *bundle) fanOutCommand(t *testing.T, ids []string) ledger.Operation {
	t.Helper()
	return b.fanOut(t, fanOutKinds[0], ids)
}

// TestFanOutRecordsLaneByLane: a fan-out's children are recorded for
// their nodes (a fleet.command's commands, a fleet.configure's
// configurations) by transactions routed to their write lane, each
// locking only that lane's children and at most ReleasePerAdvance of
// them, and the parent is let go once they all have; the parent's own
// transactions (creation, letting go, advances, its end) run in the lane
// of the parent. None strays into the exclusive lane, which holds every
// lane back.
func TestFanOutRecordsLaneByLane(t *testing.T) {
	const perTx = 3
	small := func(s *ledger.Settings) { s.ReleasePerAdvance = perTx }
	eachFanOutKind(t, func(t *testing.T, k fanOutKind) {
		dbtest.Each(t, func(t *testing.T, db *models.DB) {
			b, w := newLaneLedger(t, db, small)
			b.start(t)
			ids, sessions := b.readyNodes(t, 16)
			before := b.fstore.GroupStats()
			strays, exclusive := before.Strays, before.Exclusive
			parent := b.fanOut(t, k, ids)
			require.Eventually(t, func() bool { return k.recorded(t, b, parent.ID) == int64(len(ids)) }, waitLong, tick)

			lanes := map[int]int{}
			for _, id := range ids {
				lanes[b.store.WriteLane(id)]++
			}
			transactions := 0
			for _, n := range lanes {
				transactions += (n + perTx - 1) / perTx
			}
			// A batch run again (another request of it failed) locks the
			// same children again: each lane's recording counts once.
			seen := map[string]bool{}
			var recordings []laneLock
			for _, l := range w.recorded() {
				key := strings.Join(l.ids, ",")
				if !seen[key] {
					seen[key] = true
					recordings = append(recordings, l)
				}
			}
			locked := map[string]int{}
			for _, l := range recordings {
				require.True(t, l.routed, "a recording transaction ran unrouted: %v", l.ids)
				require.LessOrEqual(t, len(l.ids), perTx, "a recording transaction wrote more than ReleasePerAdvance")
				lane := b.store.WriteLane(l.route.Node)
				for _, id := range l.ids {
					locked[id]++
					ch, err := b.store.Operation(ctx, id)
					require.NoError(t, err)
					require.Equal(t, lane, b.store.WriteLane(ch.TargetID), "child %s of another lane", id)
				}
			}
			require.Len(t, recordings, transactions, "each lane's children in transactions of ReleasePerAdvance")
			require.Len(t, locked, len(ids))
			for id, n := range locked {
				require.Equal(t, 1, n, "child %s", id)
			}
			if db.Dialect == models.Postgres {
				require.Greater(t, len(lanes), 1, "16 nodes over 4 lanes")
			}

			require.Eventually(t, func() bool {
				op, err := b.store.Operation(ctx, parent.ID)
				require.NoError(t, err)
				return op.Owner == ""
			}, waitLong, tick, "the parent was not let go")
			k.answer(b, t, parent.ID, sessions)
			done := b.waitState(t, parent.ID, ledger.StateSucceeded)
			require.Equal(t, &ledger.Counts{Total: len(ids), Succeeded: len(ids)}, done.Counts)
			after := b.fstore.GroupStats()
			require.Equal(t, strays, after.Strays, "a transaction of the fan-out strayed from its lane")
			if db.Dialect == models.Postgres {
				// Creation, recording, the parent let go, its advances
				// and its end: none held every lane back.
				require.Equal(t, exclusive, after.Exclusive, "a transaction of the fan-out ran in the exclusive lane")
			}
		})
	})
}

// TestFanOutRecordingHoldsNoSlot: a fan-out whose commands wait for their
// write lanes holds no dispatcher slot meanwhile — with one worker, an
// operation submitted after it runs to its end while the recording still
// waits — and the recording completes once the lanes take it.
func TestFanOutRecordingHoldsNoSlot(t *testing.T) {
	oneWorker := func(s *ledger.Settings) { s.Workers = 1 }
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b, w := newLaneLedger(t, db, oneWorker)
		b.start(t)
		ids, sessions := b.readyNodes(t, 6)
		lanes := map[int]bool{}
		for _, id := range ids {
			lanes[b.store.WriteLane(id)] = true
		}
		release := make(chan struct{})
		w.hold.Store(&release)
		parent := b.fanOutCommand(t, ids)
		require.Eventually(t, func() bool { return w.held.Load() == int64(len(lanes)) }, waitLong, tick,
			"the recording's lane transactions never started")

		op := b.submit(t, admin, "test.noop", `{}`)
		b.waitState(t, op.ID, ledger.StateSucceeded)
		require.Zero(t, b.handedOut(t, parent.ID), "the recording went on while held")

		w.hold.Store(nil)
		close(release)
		require.Eventually(t, func() bool { return b.handedOut(t, parent.ID) == int64(len(ids)) }, waitLong, tick)
		b.settleAll(t, parent.ID, sessions)
		done := b.waitState(t, parent.ID, ledger.StateSucceeded)
		require.Equal(t, &ledger.Counts{Total: len(ids), Succeeded: len(ids)}, done.Counts)
	})
}

// TestFanOutRecordingResumes: a recording cut short — a lane's transaction
// failed, or the replica stopped between creating the children and
// recording them — is finished later, every child recorded once in effect
// (one command; one revision) and delivered as one run; a cancel asked
// meanwhile withdraws what was not yet recorded.
func TestFanOutRecordingResumes(t *testing.T) {
	hour := func(s *ledger.Settings) { s.OwnerLease = time.Hour } // no owner tick, no sweep
	eachFanOutKind(t, func(t *testing.T, k fanOutKind) {
		dbtest.Each(t, func(t *testing.T, db *models.DB) {
			t.Run("ByTheNextAdvance", func(t *testing.T) {
				b, w := newLaneLedger(t, db, hour)
				b.start(t)
				parent, ids, sessions := b.cutShort(t, w, k, 6)
				op, err := b.store.Operation(ctx, parent.ID)
				require.NoError(t, err)
				require.Equal(t, b.replica, op.Owner, "a parent whose recording failed stays owned")

				require.NoError(t, b.svc.AdvanceForTest(ctx, parent.ID))
				require.Equal(t, int64(len(ids)), k.recorded(t, b, parent.ID))
				op, err = b.store.Operation(ctx, parent.ID)
				require.NoError(t, err)
				require.Empty(t, op.Owner)
				k.answer(b, t, parent.ID, sessions)
				require.Equal(t, len(ids), b.waitState(t, parent.ID, ledger.StateSucceeded).Counts.Succeeded)
				b.requireRecordedOnce(t, parent.ID, ids)
			})
			t.Run("ByTheNextReplica", func(t *testing.T) {
				dead, w := newLaneLedger(t, db, hour)
				dead.start(t)
				parent, ids, sessions := dead.cutShort(t, w, k, 6)
				dead.stop()

				// The next replica's first try at resuming fails too: the
				// parent is left running, owned, for its next advance.
				next, nw := newLaneLedger(t, db, hour)
				nw.failUnrecorded.Store(true)
				next.start(t)
				require.Eventually(t, func() bool {
					op, err := next.store.Operation(ctx, parent.ID)
					require.NoError(t, err)
					return op.Owner == next.replica
				}, waitLong, tick, "the next replica never claimed the parent")
				require.Never(t, func() bool { return k.recorded(t, next, parent.ID) > 0 }, 100*time.Millisecond, 10*time.Millisecond)
				op, err := next.store.Operation(ctx, parent.ID)
				require.NoError(t, err)
				require.Equal(t, ledger.StateRunning, op.State, "a failed resume ended the parent")
				nw.failUnrecorded.Store(false)
				require.NoError(t, next.svc.AdvanceForTest(ctx, parent.ID))
				require.Equal(t, int64(len(ids)), k.recorded(t, next, parent.ID))
				require.Contains(t, eventTypes(t, next, parent.ID), ledger.EventRecovered)
				k.answer(next, t, parent.ID, sessions)
				done := next.waitState(t, parent.ID, ledger.StateSucceeded)
				require.Equal(t, &ledger.Counts{Total: len(ids), Succeeded: len(ids)}, done.Counts)
				next.requireRecordedOnce(t, parent.ID, ids)
			})
			t.Run("CancelledBeforeRecorded", func(t *testing.T) {
				b, w := newLaneLedger(t, db, hour)
				b.start(t)
				parent, ids, _ := b.cutShort(t, w, k, 4)
				_, err := b.svc.Cancel(ctx, admin, parent.ID, "changed my mind")
				require.NoError(t, err)
				require.NoError(t, b.svc.AdvanceForTest(ctx, parent.ID))
				require.Zero(t, k.recorded(t, b, parent.ID), "a cancelled child was recorded")
				done := b.waitState(t, parent.ID, ledger.StateCancelled)
				require.Equal(t, &ledger.Counts{Total: len(ids), Cancelled: len(ids)}, done.Counts)
			})
		})
	})
}

// TestFanOutRecordersRaceOnce: two replicas recording the same children
// at once, again and again (a recovered parent's new owner beside an old
// owner that had not stopped after all), before and after the children
// were delivered, record each child once in effect and end nothing twice.
func TestFanOutRecordersRaceOnce(t *testing.T) {
	hour := func(s *ledger.Settings) { s.OwnerLease = time.Hour }
	eachFanOutKind(t, func(t *testing.T, k fanOutKind) {
		dbtest.Each(t, func(t *testing.T, db *models.DB) {
			a, w := newLaneLedger(t, db, hour)
			a.start(t)
			parent, ids, sessions := a.cutShort(t, w, k, 8)
			bb := newLedger(t, db, a.tk, a.clock, hour)
			var children []string
			for _, ch := range a.children(t, parent.ID) {
				children = append(children, ch.ID)
			}
			race := func() {
				var wg sync.WaitGroup
				errs := make([]error, 2)
				for i, svc := range []*ledger.Service{a.svc, bb.svc} {
					wg.Add(1)
					go func() {
						defer wg.Done()
						errs[i] = svc.RecordForTest(ctx, append([]string(nil), children...))
					}()
				}
				wg.Wait()
				require.NoError(t, errors.Join(errs...))
			}
			for range 5 {
				race()
			}
			require.Equal(t, int64(len(ids)), k.recorded(t, a, parent.ID))
			// Delivered, the children run; a late recorder leaves them be.
			for _, sess := range sessions {
				_, err := a.fleet.PollWork(ctx, sess, 0, "test")
				require.NoError(t, err)
			}
			race()
			// Past the visibility timeout, answered on their next poll.
			a.clock.Advance(61 * time.Second)
			require.NoError(t, a.svc.AdvanceForTest(ctx, parent.ID))
			k.answer(a, t, parent.ID, sessions)
			done := a.waitState(t, parent.ID, ledger.StateSucceeded)
			require.Equal(t, &ledger.Counts{Total: len(ids), Succeeded: len(ids)}, done.Counts)
			a.requireRecordedOnce(t, parent.ID, ids)
		})
	})
}

// requireRecordedOnce checks that each child of the parent ran once (one
// running event) and, for a configure, that its node's configuration is
// at revision 1, the child's own.
func (b *bundle) requireRecordedOnce(t *testing.T, parentID string, ids []string) {
	t.Helper()
	children := b.children(t, parentID)
	require.Len(t, children, len(ids))
	for _, ch := range children {
		require.Equal(t, 1, count(eventTypes(t, b, ch.ID), ledger.EventRunning), "child %s delivered as one run", ch.ID)
		if ch.Kind != ledger.KindNodeConfigure {
			continue
		}
		c, err := b.fleet.NodeConfig(ctx, ch.TargetID)
		require.NoError(t, err)
		require.NotNil(t, c.Desired)
		require.Equal(t, int64(1), c.Desired.Revision, "node %s: its child's document is one revision", ch.TargetID)
		require.Equal(t, ch.ID, c.Desired.OperationID)
	}
}

func count(xs []string, x string) int {
	n := 0
	for _, y := range xs {
		if y == x {
			n++
		}
	}
	return n
}

// TestFleetConfigureChildNotYetRecordedIsLeftAlone: while a recording of
// a fleet.configure's children is cut short, what happens on their nodes
// does not decide them — a report of the node's current, older revision
// does not end a child succeeded, a node.configure submitted after the
// fan-out does not end it as if it had recorded a revision. Once recorded,
// each child is judged as submitted: a new revision for the first node,
// superseded by the later submission for the second.
func TestFleetConfigureChildNotYetRecordedIsLeftAlone(t *testing.T) {
	hour := func(s *ledger.Settings) { s.OwnerLease = time.Hour }
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b, w := newLaneLedger(t, db, hour)
		b.start(t)
		ids, sessions := b.readyNodes(t, 2)
		for _, id := range ids {
			b.configureOp(t, id, `{"format":"f/v1","document":{"first":true}}`)
			b.reportConfig(t, sessions[id], 1, api.ConfigApplied, "")
		}
		w.fail.Store(true)
		failed := w.failed.Load()
		parent := b.fanOut(t, fanOutKinds[1], ids)
		require.Eventually(t, func() bool { return w.failed.Load() > failed && !b.svc.RecordingForTest(parent.ID) }, waitLong, tick)
		w.fail.Store(false)

		b.reportConfig(t, sessions[ids[0]], 1, api.ConfigApplied, "")
		later := b.configureOp(t, ids[1], `{"format":"f/v1","document":{"later":true}}`)
		for _, ch := range b.children(t, parent.ID) {
			got := b.op(t, ch.ID)
			require.Equal(t, ledger.StatePending, got.State, "child %s for node %s decided before it was recorded", ch.ID, ch.TargetID)
			require.True(t, got.Held, "child %s not yet recorded", ch.ID)
		}

		require.NoError(t, b.svc.AdvanceForTest(ctx, parent.ID))
		byNode := map[string]ledger.Operation{}
		for _, ch := range b.children(t, parent.ID) {
			byNode[ch.TargetID] = ch
		}
		c, err := b.fleet.NodeConfig(ctx, ids[0])
		require.NoError(t, err)
		require.Equal(t, int64(2), c.Desired.Revision)
		require.Equal(t, byNode[ids[0]].ID, c.Desired.OperationID)
		require.Equal(t, ledger.StatePending, byNode[ids[0]].State)

		got := b.waitState(t, byNode[ids[1]].ID, ledger.StateFailed)
		require.Equal(t, ledger.CodeSuperseded, got.Error.Code)
		require.Contains(t, got.Error.Message, later.ID, "superseded by the configure submitted after it")
		c, err = b.fleet.NodeConfig(ctx, ids[1])
		require.NoError(t, err)
		require.Equal(t, later.ID, c.Desired.OperationID)
		require.Equal(t, int64(2), c.Desired.Revision)
	})
}

// TestRollingFanOutReleasesALargeOperationTogether: a fan-out whose
// children record their operation once (a fleet.command's payload, a
// fleet.configure's document) fills every free slot in one advance,
// however large that operation. Bounded by its bytes (1 MiB a recording),
// a 200 KB one went five an advance, and 10,000 nodes at max_concurrency
// 50 took about five times as long as with a small payload (BENCHMARKS.md,
// forty-fifth sitting). The first six children end while no ledger runs,
// so the next ledger's first advance finds six slots free and six held.
func TestRollingFanOutReleasesALargeOperationTogether(t *testing.T) {
	pad := strings.Repeat("large ", 200_000/6)
	operations := map[string]string{
		ledger.KindFleetCommand: `{"kind":"node.launch_workload","payload":{"run_id":"rolling","attempt_id":"1","command":"true",` +
			`"env":{"PAD":"` + pad + `"}},"max_concurrency":6}`,
		ledger.KindFleetConfigure: `{"format":"rolling/v1","document":{"pad":"` + pad + `"},"max_concurrency":6}`,
	}
	eachFanOutKind(t, func(t *testing.T, k fanOutKind) {
		dbtest.Each(t, func(t *testing.T, db *models.DB) {
			tk, c := newTestKinds(), newClock()
			first := newLedger(t, db, tk, c)
			first.start(t)
			ids, sessions := first.readyNodes(t, 12)
			parent := first.submitRolling(t, k, ids, operations[k.name], 6)
			first.stop()

			require.Equal(t, 6, first.answerHanded(t, k, sessions), "six children were handed out")

			second := newLedger(t, db, tk, c)
			second.start(t)
			require.Eventually(t, func() bool { return k.recorded(t, second, parent.ID) == 12 }, waitLong, tick,
				"the held children were not released")
			continued := testutil.ToFloat64(second.metrics.FanOutAdvances.WithLabelValues("continued"))
			require.Zero(t, continued, "the six held children went in one advance")
			k.answer(second, t, parent.ID, sessions)
			done := second.waitState(t, parent.ID, ledger.StateSucceeded)
			require.Equal(t, &ledger.Counts{Total: 12, Succeeded: 12}, done.Counts)
		})
	})
}

// TestServedFanOutKindsNameTheirChildren: every served fan-out kind names
// the kinds of its children (Kind.ChildKinds), each served, recorded
// together and recording its operation once, so a rolling wave of any of
// them is released by its children's write lanes, by count, not by its
// operation's bytes.
func TestServedFanOutKindsNameTheirChildren(t *testing.T) {
	ks := append(ledger.ServedKinds(nil), ledger.ConfigKinds(nil, nil)...)
	reg := ledger.NewRegistry(ks...)
	fanOuts := 0
	for _, k := range reg.Kinds() {
		if k.FanOut == nil {
			continue
		}
		fanOuts++
		require.NotEmpty(t, k.ChildKinds, k.Name)
		for _, name := range k.ChildKinds {
			ck, ok := reg.Kind(name)
			require.True(t, ok, "%s: child kind %s is served", k.Name, name)
			require.True(t, ck.RecordsOperationOnce, "%s: child kind %s records its operation once", k.Name, name)
			require.True(t, ck.RecordedTogether, "%s: child kind %s is recorded together", k.Name, name)
		}
	}
	require.Equal(t, 3, fanOuts, "fleet.command, fleet.configure, fleet.diagnose")
}

// answerHanded has each session's agent poll once and answer, as applied,
// what it is handed (a command, or a configuration); it answers how many
// it answered.
func (b *bundle) answerHanded(t *testing.T, k fanOutKind, sessions map[string]fleet.Session) int {
	t.Helper()
	answered := 0
	for _, sess := range sessions {
		if k.name == ledger.KindFleetConfigure {
			a, err := b.fleet.PollWork(ctx, sess, 0, "test")
			require.NoError(t, err)
			if a.Config != nil {
				b.reportConfig(t, sess, a.Config.Revision, api.ConfigApplied, "")
				answered++
			}
			continue
		}
		for _, cmd := range b.poll(t, sess) {
			b.settle(t, sess, api.Result{OperationID: cmd.OperationID, Applied: true})
			answered++
		}
	}
	return answered
}

// submitRolling submits a fan-out of kind k over ids with operation and
// waits until its first slots' children (slots of them) are recorded and
// the parent let go.
func (b *bundle) submitRolling(t *testing.T, k fanOutKind, ids []string, operation string, slots int64) ledger.Operation {
	t.Helper()
	parent, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: k.name,
		Targets: nodeTargets(ids...), Operation: json.RawMessage(operation)})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		op, err := b.store.Operation(ctx, parent.ID)
		require.NoError(t, err)
		return op.Counts != nil && op.Owner == "" && k.recorded(t, b, parent.ID) == slots
	}, waitLong, tick, "the children of the first slots were not recorded")
	return parent
}

// rolling is k's operation with max_concurrency set.
func (k fanOutKind) rolling(maxConcurrency int) string {
	return strings.TrimSuffix(k.operation, "}") + `,"max_concurrency":` + strconv.Itoa(maxConcurrency) + "}"
}

// TestRollingFanOutReleasesLaneByLane: a rolling fan-out (max_concurrency
// below its children) releases its held children through their write
// lanes — the advance picks them in the parent's lane, each lane releases
// and records its own — so on Postgres none of its transactions runs in
// the exclusive lane, which holds every node's writes back, and none
// strays there; it never has more children out than max_concurrency, and
// each child runs once.
func TestRollingFanOutReleasesLaneByLane(t *testing.T) {
	eachFanOutKind(t, func(t *testing.T, k fanOutKind) {
		dbtest.Each(t, func(t *testing.T, db *models.DB) {
			if db.Dialect != models.Postgres {
				t.Skip("write lanes are Postgres's: SQLite's one writer releases in the advance's transaction")
			}
			b, w := newLaneLedger(t, db)
			b.start(t)
			ids, sessions := b.readyNodes(t, 16)
			before := b.fstore.GroupStats()
			parent, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: k.name,
				Targets: nodeTargets(ids...), Operation: json.RawMessage(k.rolling(4))})
			require.NoError(t, err)
			answered := 0
			require.Eventually(t, func() bool {
				require.LessOrEqual(t, k.recorded(t, b, parent.ID)-int64(answered), int64(4), "more than max_concurrency out")
				answered += b.answerHanded(t, k, sessions)
				return answered == len(ids)
			}, waitLong, tick, "the rolling fan-out never handed every child out")
			done := b.waitState(t, parent.ID, ledger.StateSucceeded)
			require.Equal(t, &ledger.Counts{Total: len(ids), Succeeded: len(ids)}, done.Counts)
			b.requireRecordedOnce(t, parent.ID, ids)
			released := 0
			for _, l := range w.recorded() {
				if l.routed && l.route.Node != "" {
					released += len(l.ids)
				}
			}
			require.GreaterOrEqual(t, released, len(ids), "every child locked by its node's lane")
			after := b.fstore.GroupStats()
			require.Equal(t, before.Strays, after.Strays, "a transaction of the rolling fan-out strayed from its lane")
			require.Equal(t, before.Exclusive, after.Exclusive, "a transaction of the rolling fan-out ran in the exclusive lane")
		})
	})
}

// TestRollingFanOutReleaseResumes: a rolling advance's release that its
// lanes fail to record (the replica stopping part-way) leaves the parent
// owned here and the picked children held; the next advance takes the
// parent back and releases them, each child running once.
func TestRollingFanOutReleaseResumes(t *testing.T) {
	hour := func(s *ledger.Settings) { s.OwnerLease = time.Hour } // no owner tick, no sweep
	eachFanOutKind(t, func(t *testing.T, k fanOutKind) {
		dbtest.Each(t, func(t *testing.T, db *models.DB) {
			if db.Dialect != models.Postgres {
				t.Skip("write lanes are Postgres's: SQLite's one writer releases in the advance's transaction")
			}
			b, w := newLaneLedger(t, db, hour)
			b.start(t)
			ids, sessions := b.readyNodes(t, 6)
			parent := b.submitRolling(t, k, ids, k.rolling(2), 2)

			failed := w.failed.Load()
			w.fail.Store(true)
			require.Equal(t, 2, b.answerHanded(t, k, sessions))
			require.Eventually(t, func() bool { return w.failed.Load() > failed && !b.svc.RecordingForTest(parent.ID) }, waitLong, tick,
				"the release after the first two ended never failed")
			// Still failing, so an advance queued meanwhile fails alike.
			op, err := b.store.Operation(ctx, parent.ID)
			require.NoError(t, err)
			require.Equal(t, b.replica, op.Owner, "a parent whose release failed stays owned")
			require.Equal(t, int64(2), k.recorded(t, b, parent.ID))
			held := 0
			for _, ch := range b.children(t, parent.ID) {
				if ch.Held {
					held++
				}
			}
			require.Equal(t, 4, held, "the picked children stay held")
			w.fail.Store(false)

			// Its own, or one a notice of the parent queued meanwhile.
			require.NoError(t, b.svc.AdvanceForTest(ctx, parent.ID))
			require.Eventually(t, func() bool {
				op, err := b.store.Operation(ctx, parent.ID)
				require.NoError(t, err)
				return op.Owner == "" && k.recorded(t, b, parent.ID) == 4
			}, waitLong, tick, "the next advance did not release two more and let the parent go")
			k.answer(b, t, parent.ID, sessions)
			done := b.waitState(t, parent.ID, ledger.StateSucceeded)
			require.Equal(t, &ledger.Counts{Total: len(ids), Succeeded: len(ids)}, done.Counts)
			b.requireRecordedOnce(t, parent.ID, ids)
		})
	})
}
