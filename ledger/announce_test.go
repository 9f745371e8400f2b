package ledger_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/testwait"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// ledgerSink hands what a Listener hears to a replica's ledger, counting
// the operations' notifications.
type ledgerSink struct {
	svc *ledger.Service
	mu  sync.Mutex
	ok  bool
	ops map[string]int
}

func (s *ledgerSink) Deliver(notes []fleet.Notification, _ string) {
	for _, n := range notes {
		if n.Kind == fleet.NotifyOperation {
			s.mu.Lock()
			s.ops[n.NodeID]++
			s.mu.Unlock()
			s.svc.Changed(ctx, n.NodeID)
		}
	}
}

func (s *ledgerSink) SetNotifierHealthy(ok bool) {
	s.mu.Lock()
	s.ok = ok
	s.mu.Unlock()
	s.svc.SetNotifierHealthy(ok)
}

func (s *ledgerSink) heard(id string) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ops[id], s.ok
}

// waitOn starts b's Wait for id and answers the operation it returns.
func waitOn(b *bundle, id string) <-chan ledger.Operation {
	got := make(chan ledger.Operation, 1)
	go func() {
		op, _ := b.svc.Wait(ctx, id, testwait.Patience)
		got <- op
	}()
	return got
}

func ended(t *testing.T, got <-chan ledger.Operation) ledger.Operation {
	t.Helper()
	select {
	case op := <-got:
		return op
	case <-time.After(testwait.Patience + 10*time.Second):
		t.Fatal("the wait did not return")
		return ledger.Operation{}
	}
}

// On Postgres a command operation's start and end reach the other
// replicas through the announcer, once the claim's and the settlement's
// transactions have committed (those transactions notify nobody
// themselves: a notification inside them would be heard twice), and a
// waiter there wakes on them. A waiter whose announcement never comes —
// its replica died between the commit and the send — sees the end at its
// re-check, as does a watch.
func TestCommandOperationChangesReachOtherReplicas(t *testing.T) {
	dbtest.Dialects(t) // under CI a missing Postgres fails, never skips
	db := dbtest.Open(t, models.Postgres)

	t.Run("AnnouncedAfterCommit", func(t *testing.T) {
		noRecheck := func(s *ledger.Settings) { s.Recheck = time.Hour }
		a := newLedger(t, db, newTestKinds(), newClock(), noRecheck)
		b := newLedger(t, db, newTestKinds(), newClock(), noRecheck)
		sink := &ledgerSink{svc: b.svc, ops: map[string]int{}}
		lctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		l := &models.Listener{URL: db.URL, Channel: models.NotifyChannel(db), Replica: b.replica, Sink: sink}
		go func() { defer close(done); l.Run(lctx) }()
		t.Cleanup(func() { cancel(); <-done })
		testwait.For(t, "the listener to listen", testwait.Patience, func() bool { _, ok := sink.heard(""); return ok })

		node, sess := a.readyNode(t)
		op := a.command(t, node, ledger.KindNodePrepareImage, prepare)
		got := waitOn(b, op.ID)
		before := a.fstore.AnnounceStats()
		require.Len(t, a.poll(t, sess), 1)
		// Heard before the end is announced: Postgres folds identical
		// payloads of one statement into one notification, and the start
		// and the end of one operation announce the same payload.
		testwait.For(t, "the start heard", testwait.Patience, func() bool { n, _ := sink.heard(op.ID); return n >= 1 })
		a.settle(t, sess, api.Result{OperationID: op.ID, Applied: true})

		require.Equal(t, ledger.StateSucceeded, ended(t, got).State, "the waiter on the other replica woke on the end")
		testwait.For(t, "the start and the end heard", testwait.Patience, func() bool { n, _ := sink.heard(op.ID); return n >= 2 })
		// The start and the end, announced after their commits (with the
		// node's own wake-ups: work due, NotifyIssued and NotifyCommands).
		// The announcer counts a statement once it returns, which may be
		// after the listener has heard it: wait for the count.
		testwait.For(t, "the start and the end counted as announced", testwait.Patience, func() bool {
			return a.fstore.AnnounceStats().Payloads-before.Payloads >= 2
		})
		require.Zero(t, a.fstore.AnnounceStats().Failures)
		n, _ := sink.heard(op.ID)
		require.Equal(t, 2, n, "each heard once: their transactions notified nobody")
	})

	t.Run("LostAnnouncementSeenAtTheRecheck", func(t *testing.T) {
		a := newLedger(t, db, newTestKinds(), newClock())
		// b listens to nothing yet believes notifications flow: every
		// announcement it should have heard is lost.
		b := newLedger(t, db, newTestKinds(), newClock(), func(s *ledger.Settings) { s.Recheck = 100 * time.Millisecond })
		b.svc.SetNotifierHealthy(true)

		node, sess := a.readyNode(t)
		op := a.command(t, node, ledger.KindNodePrepareImage, prepare)
		got := waitOn(b, op.ID)
		watched := make(chan error, 1)
		go func() {
			wctx, cancel := context.WithTimeout(ctx, testwait.Patience)
			defer cancel()
			watched <- b.svc.Watch(wctx, admin, op.ID, 0, func(ledger.Event) error { return nil })
		}()
		require.Len(t, a.poll(t, sess), 1)
		a.settle(t, sess, api.Result{OperationID: op.ID, Applied: true})

		require.Equal(t, ledger.StateSucceeded, ended(t, got).State, "the waiter saw the end at its re-check")
		select {
		case err := <-watched:
			require.NoError(t, err, "the watch ended with the operation")
		case <-time.After(testwait.Patience + 10*time.Second):
			t.Fatal("the watch did not end")
		}
	})
}
