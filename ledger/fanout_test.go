package ledger_test

import (
	"context"
	"encoding/json"
	"sort"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

func nodeTargets(ids ...string) []ledger.Target {
	out := make([]ledger.Target, len(ids))
	for i, id := range ids {
		out[i] = ledger.Target{Kind: ledger.TargetNode, ID: id}
	}
	return out
}

func (b *bundle) children(t *testing.T, parentID string) []ledger.Operation {
	t.Helper()
	ops, err := b.store.List(ctx, ledger.Filter{ParentID: parentID, Limit: 500})
	require.NoError(t, err)
	return ops
}

// handedOut counts a parent's children whose command exists.
func (b *bundle) handedOut(t *testing.T, parentID string) int64 {
	t.Helper()
	return dbtest.Count(t, b.db.DB, &models.Command{}, "operation_id IN (SELECT id FROM operations WHERE parent_id = ?)", parentID)
}

const (
	waitLong = 20 * time.Second
	tick     = 5 * time.Millisecond
)

// settleAll answers every command the sessions are handed as applied
// until the parent has ended.
func (b *bundle) settleAll(t *testing.T, parentID string, sessions map[string]fleet.Session) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, sess := range sessions {
			for _, c := range b.poll(t, sess) {
				b.settle(t, sess, api.Result{OperationID: c.OperationID, Applied: true})
			}
		}
		op, err := b.store.Operation(ctx, parentID)
		require.NoError(t, err)
		return op.Terminal()
	}, waitLong, tick, "the fan-out never ended")
}

// readyNodes makes n ready nodes, answering their ids in order and their
// sessions by id.
func (b *bundle) readyNodes(t *testing.T, n int) ([]string, map[string]fleet.Session) {
	t.Helper()
	ids := make([]string, 0, n)
	sessions := map[string]fleet.Session{}
	for range n {
		id, sess := b.readyNode(t)
		ids = append(ids, id)
		sessions[id] = sess
	}
	return ids, sessions
}

func (b *bundle) readyNodeOfClass(t *testing.T, class string) (string, fleet.Session) {
	t.Helper()
	rentalN++
	boot, err := b.fleet.Invite(ctx, "admin:test", fleet.Invite{RentalID: "class-" + strconv.Itoa(rentalN) + "-" + b.replica, Generation: 1,
		Purchase: &fleet.PurchaseTerms{EligibleClasses: []string{class}}})
	require.NoError(t, err)
	resp, err := b.fleet.Enroll(ctx, enrollRequest(boot, b.clock.Now(), nil))
	require.NoError(t, err)
	sess, err := b.fleet.Authenticate(ctx, resp.SessionToken, fleet.DoorAsk)
	require.NoError(t, err)
	return boot.NodeID, sess
}

func TestFleetCommand(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		b.start(t)
		t.Run("MixedChildrenUnderMaxConcurrency", func(t *testing.T) {
			ids, sessions := b.readyNodes(t, 4)
			enrolling, err := b.fleet.Invite(ctx, "admin:test", fleet.Invite{RentalID: "fan-enrolling-" + b.replica, Generation: 1})
			require.NoError(t, err)
			ids = append(ids, enrolling.NodeID)

			parent, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindFleetCommand,
				Targets:   nodeTargets(ids...),
				Operation: json.RawMessage(`{"kind":"node.prepare_image","payload":{"image":"busybox:1"},"max_concurrency":2}`)})
			require.NoError(t, err)
			b.waitState(t, parent.ID, ledger.StateRunning)
			require.Eventually(t, func() bool { return len(b.children(t, parent.ID)) == 5 }, waitLong, tick)

			// At most two children are handed out at once (the child of the
			// node that is not ready fails at release, without a command).
			require.Eventually(t, func() bool { return b.handedOut(t, parent.ID) == 2 }, waitLong, tick)
			require.Never(t, func() bool { return b.handedOut(t, parent.ID) > 2 }, 100*time.Millisecond, 10*time.Millisecond)
			b.settleAll(t, parent.ID, sessions)
			done := b.waitState(t, parent.ID, ledger.StateFailed)
			require.Equal(t, ledger.CodeChildrenFailed, done.Error.Code)
			require.Equal(t, &ledger.Counts{Total: 5, Succeeded: 4, Failed: 1}, done.Counts)
			for _, ch := range b.children(t, parent.ID) {
				require.Equal(t, parent.ID, ch.ParentID)
				require.Equal(t, "commands", ch.Family)
				if ch.TargetID == enrolling.NodeID {
					require.Equal(t, ledger.StateFailed, ch.State)
					require.Equal(t, string(errcode.NodeNotReady), ch.Error.Code)
				} else {
					require.Equal(t, ledger.StateSucceeded, ch.State)
				}
			}
		})
		t.Run("AllSucceedBySelector", func(t *testing.T) {
			sessions := map[string]fleet.Session{}
			for range 3 {
				id, sess := b.readyNodeOfClass(t, "gpu-"+b.replica)
				sessions[id] = sess
			}
			b.readyNode(t) // not of the class: not picked
			parent, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindFleetCommand,
				Targets:   []ledger.Target{{Kind: ledger.TargetFleet}},
				Operation: json.RawMessage(`{"kind":"node.prepare_image","payload":{"image":"x"},"selector":{"class":"gpu-` + b.replica + `"}}`)})
			require.NoError(t, err)
			b.settleAll(t, parent.ID, sessions)
			done := b.waitState(t, parent.ID, ledger.StateSucceeded)
			require.Equal(t, &ledger.Counts{Total: 3, Succeeded: 3}, done.Counts)
		})
		t.Run("CancelParentCancelsChildren", func(t *testing.T) {
			id1, s1 := b.readyNode(t)
			id2, _ := b.readyNode(t)
			id3, _ := b.readyNode(t)
			parent, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindFleetCommand,
				Targets:   nodeTargets(id1, id2, id3),
				Operation: json.RawMessage(`{"kind":"node.launch_workload","payload":{"run_id":"r","attempt_id":"a","command":"x"},"max_concurrency":2}`)})
			require.NoError(t, err)
			require.Eventually(t, func() bool { return b.handedOut(t, parent.ID) == 2 }, waitLong, tick)
			delivered := b.poll(t, s1)
			require.Len(t, delivered, 1)
			_, err = b.svc.Cancel(ctx, admin, parent.ID, "stop")
			require.NoError(t, err)
			// The undelivered and the held child end at once; the delivered
			// one ends with its node's answer, and then the parent.
			got, _ := b.store.Operation(ctx, parent.ID)
			require.Equal(t, ledger.StateRunning, got.State)
			b.settle(t, s1, api.Result{OperationID: delivered[0].OperationID, Applied: true})
			done := b.waitState(t, parent.ID, ledger.StateCancelled)
			require.Equal(t, &ledger.Counts{Total: 3, Succeeded: 1, Cancelled: 2}, done.Counts)
			require.Equal(t, int64(2), b.handedOut(t, parent.ID), "the held child was never handed out")
		})
		t.Run("RefusedChildrenFailAloneInOneRelease", func(t *testing.T) {
			// All five are released together (the batch, in the fan-out's
			// own transaction); exactly the three refused children end
			// failed with their codes, nothing of theirs written, and the
			// others are handed out once each.
			ok1, s1 := b.readyNode(t)
			ok2, s2 := b.readyNode(t)
			retired, _ := b.readyNode(t)
			_, err := b.fleet.Retire(ctx, "admin:test", retired, "")
			require.NoError(t, err)
			_, lacking := b.nodeWith(t, []string{api.CapConfig})
			full, sFull := b.readyNode(t)
			for i := range 32 {
				b.command(t, full, ledger.KindNodePrepareImage, `{"image":"fill-`+strconv.Itoa(i)+`"}`)
			}
			parent, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindFleetCommand,
				Targets:   nodeTargets(ok1, retired, lacking.NodeID, full, ok2),
				Operation: json.RawMessage(`{"kind":"node.prepare_image","payload":{"image":"batch:1"}}`)})
			require.NoError(t, err)
			// Released before any agent settles (which would free the full
			// node's quota).
			require.Eventually(t, func() bool {
				failed := 0
				for _, ch := range b.children(t, parent.ID) {
					if ch.State == ledger.StateFailed {
						failed++
					}
				}
				return failed == 3 && b.handedOut(t, parent.ID) == 2
			}, waitLong, tick)
			b.settleAll(t, parent.ID, map[string]fleet.Session{ok1: s1, ok2: s2, lacking.NodeID: lacking, full: sFull})
			done := b.waitState(t, parent.ID, ledger.StateFailed)
			require.Equal(t, &ledger.Counts{Total: 5, Succeeded: 2, Failed: 3, CapabilityMissing: 1}, done.Counts)
			want := map[string]string{retired: string(errcode.NodeRetired), lacking.NodeID: string(errcode.CapabilityMissing),
				full: string(errcode.QuotaExceeded)}
			for _, ch := range b.children(t, parent.ID) {
				if code, refused := want[ch.TargetID]; refused {
					require.Equal(t, ledger.StateFailed, ch.State, ch.TargetID)
					require.Equal(t, code, ch.Error.Code, ch.TargetID)
					_, err := b.fleet.Command(ctx, ch.ID)
					require.ErrorIs(t, err, fleet.ErrCommandNotFound, "no command was recorded for %s", code)
				} else {
					require.Equal(t, ledger.StateSucceeded, ch.State)
				}
				released := 0
				events, err := b.store.Events(ctx, ch.ID, 0, 100)
				require.NoError(t, err)
				for _, e := range events {
					if e.Type == ledger.EventReleased {
						released++
					}
				}
				require.Equal(t, 1, released, "one released event for %s", ch.TargetID)
			}
			require.Equal(t, int64(2), b.handedOut(t, parent.ID), "a command for each accepted child, once")
		})
		t.Run("WideReleaseInOneAdvance", func(t *testing.T) {
			// More children than one multi-row statement takes (500),
			// released at once (as they are created): the 600 for absent
			// nodes end not_found,
			// the two real ones are handed out.
			ok1, s1 := b.readyNode(t)
			ok2, s2 := b.readyNode(t)
			ids := []string{ok1, ok2}
			for i := range 600 {
				ids = append(ids, "ghost-"+strconv.Itoa(i))
			}
			parent, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindFleetCommand,
				Targets:   nodeTargets(ids...),
				Operation: json.RawMessage(`{"kind":"node.prepare_image","payload":{"image":"wide:1"},"max_concurrency":2000}`)})
			require.NoError(t, err)
			// 600 refusals end one by one: seconds on SQLite under -race.
			require.Eventually(t, func() bool {
				return dbtest.Count(t, b.db.DB, &models.Operation{}, "parent_id = ? AND state = ?", parent.ID, ledger.StateFailed) == 600
			}, 10*waitLong, 100*time.Millisecond)
			b.settleAll(t, parent.ID, map[string]fleet.Session{ok1: s1, ok2: s2})
			done := b.waitState(t, parent.ID, ledger.StateFailed)
			require.Equal(t, &ledger.Counts{Total: 602, Succeeded: 2, Failed: 600}, done.Counts)
			require.Equal(t, int64(2), b.handedOut(t, parent.ID))
			require.Equal(t, int64(602), dbtest.Count(t, b.db.DB, &models.OperationEvent{},
				"type = ? AND operation_id IN (SELECT id FROM operations WHERE parent_id = ?)", ledger.EventReleased, parent.ID))
		})
		t.Run("BadOperationsRecordNothing", func(t *testing.T) {
			before := countOps(t, b)
			for _, c := range []struct {
				targets []ledger.Target
				op      string
				code    errcode.Code
			}{
				{nodeTargets("a"), `{"kind":"node.teleport","payload":{}}`, errcode.ValidationFailed},
				{nodeTargets("a"), `{"kind":"node.prepare_image","payload":{}}`, errcode.ValidationFailed},
				{nil, `{"kind":"node.prepare_image","payload":{"image":"x"}}`, errcode.ValidationFailed},
				{[]ledger.Target{{Kind: ledger.TargetFleet}}, `{"kind":"node.prepare_image","payload":{"image":"x"}}`, errcode.ValidationFailed},
				{nodeTargets("a", "a"), `{"kind":"node.prepare_image","payload":{"image":"x"}}`, errcode.ValidationFailed},
				{nodeTargets("a"), `{"kind":"node.prepare_image","payload":{"image":"x"},"max_concurrency":-1}`, errcode.ValidationFailed},
				{nodeTargets("a"), `{"kind":"node.prepare_image","payload":{"image":"x"},"surprise":1}`, errcode.InvalidJSON},
			} {
				_, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindFleetCommand,
					Targets: c.targets, Operation: json.RawMessage(c.op)})
				requireCode(t, err, c.code)
			}
			require.Equal(t, before, countOps(t, b))
		})
	})
}

// TestRestartRecordsChildrenAtOnce: a replica killed after its fan-out
// committed but before it recorded the children leaves each configure's
// revision not yet written. The replica that starts next records them at
// once, not at its first owner-lease tick (a third of the lease later):
// until then the fleet.configure has written nothing, and a reader
// counting revisions meanwhile counted one fewer on every node.
func TestRestartRecordsChildrenAtOnce(t *testing.T) {
	hour := func(s *ledger.Settings) { s.OwnerLease = time.Hour } // no owner tick during the test
	each(t, func(t *testing.T, b *bundle) {
		var ids []string
		for range 3 {
			id, _ := b.readyNode(t)
			ids = append(ids, id)
		}
		// The killed replica: its fan-out commits, its recording never
		// does (the process died before the lanes took it).
		w := &laneWatch{}
		w.fail.Store(true)
		dead := newLedgerWrapped(t, b.db, b.tk, b.clock, func(s ledger.Store) ledger.Store {
			w.Store = s
			return w
		}, hour)
		dead.start(t)
		parent, _, err := dead.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindFleetConfigure,
			Targets: nodeTargets(ids...), Operation: json.RawMessage(`{"format":"f/v1","document":{"restart":true}}`)})
		require.NoError(t, err)
		require.Eventually(t, func() bool { return w.failed.Load() > 0 }, waitLong, tick, "the recording never ran")
		dead.stop()
		require.Len(t, b.children(t, parent.ID), len(ids))
		for _, id := range ids {
			c, err := b.fleet.NodeConfig(ctx, id)
			require.NoError(t, err)
			require.Nil(t, c.Desired, "node %s configured before its child was recorded", id)
		}

		// The next replica records them as it starts.
		b.start(t)
		require.Eventually(t, func() bool {
			for _, id := range ids {
				c, err := b.fleet.NodeConfig(ctx, id)
				require.NoError(t, err)
				if c.Desired == nil {
					return false
				}
				require.Equal(t, int64(1), c.Desired.Revision)
			}
			return true
		}, waitLong, tick, "children not recorded by the restarted replica")
	}, hour)
}

// releaseCounter counts the children released after their creation: by
// an advance (Tx.ReleaseHeld), or by the write lanes a rolling advance
// hands them to (Tx.ReleaseChildren); both statements rewrite held
// children.
type releaseCounter struct {
	ledger.Store
	released atomic.Int64
}

func (s *releaseCounter) Tx(ctx context.Context, fn func(ledger.Tx) error) error {
	return s.Store.Tx(ctx, func(tx ledger.Tx) error { return fn(releaseCountingTx{tx, s}) })
}

type releaseCountingTx struct {
	ledger.Tx
	s *releaseCounter
}

func (t releaseCountingTx) ReleaseHeld(ctx context.Context, parentID string, limit int, now time.Time) ([]ledger.Operation, error) {
	ops, err := t.Tx.ReleaseHeld(ctx, parentID, limit, now)
	t.s.released.Add(int64(len(ops)))
	return ops, err
}

// ReleaseChildren is how a rolling advance's picks are released, by their
// write lanes.
func (t releaseCountingTx) ReleaseChildren(ctx context.Context, ids []string, now time.Time) ([]ledger.Operation, error) {
	ops, err := t.Tx.ReleaseChildren(ctx, ids, now)
	t.s.released.Add(int64(len(ops)))
	return ops, err
}

// TestFanOutReleasesAtCreation: the children of a fleet.command that fit
// its max_concurrency are released by the transaction that creates them —
// inserted not held, their released event written before the parent's
// fanned_out event (so in that transaction), their commands recorded
// right after, lane by lane — and no release rewrites them; only those
// beyond the slots are held and released by the advance as slots free.
func TestFanOutReleasesAtCreation(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		counter := &releaseCounter{}
		b := newLedgerWrapped(t, db, newTestKinds(), newClock(), func(s ledger.Store) ledger.Store {
			counter.Store = s
			return counter
		})
		b.start(t)
		fanOut := func(t *testing.T, ids []string, op string) (ledger.Operation, []ledger.Operation) {
			t.Helper()
			parent, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindFleetCommand,
				Targets: nodeTargets(ids...), Operation: json.RawMessage(op)})
			require.NoError(t, err)
			var children []ledger.Operation
			require.Eventually(t, func() bool {
				children = b.children(t, parent.ID)
				return len(children) == len(ids)
			}, waitLong, tick)
			sort.Slice(children, func(i, j int) bool { return children[i].Cursor < children[j].Cursor })
			return parent, children
		}
		// fannedOut answers the cursor of the parent's fanned_out event.
		fannedOut := func(t *testing.T, parentID string) int64 {
			t.Helper()
			evs, err := b.store.Events(ctx, parentID, 0, 100)
			require.NoError(t, err)
			for _, e := range evs {
				if e.Type == ledger.EventFannedOut {
					return e.Cursor
				}
			}
			t.Fatalf("parent %s has no fanned_out event", parentID)
			return 0
		}
		// releasedAtCreation requires the child's first events to be
		// submitted then released, and answers whether the release was
		// written before the parent's fanned_out event.
		releasedAtCreation := func(t *testing.T, ch ledger.Operation, fanned int64) bool {
			t.Helper()
			evs, err := b.store.Events(ctx, ch.ID, 0, 100)
			require.NoError(t, err)
			require.GreaterOrEqual(t, len(evs), 2, "child %s: %v", ch.ID, eventTypes(t, b, ch.ID))
			require.Equal(t, []string{ledger.EventSubmitted, ledger.EventReleased}, []string{evs[0].Type, evs[1].Type})
			return evs[1].Cursor < fanned
		}

		t.Run("AllWithinSlots", func(t *testing.T) {
			before := counter.released.Load()
			ids, sessions := b.readyNodes(t, 3)
			parent, children := fanOut(t, ids, `{"kind":"node.prepare_image","payload":{"image":"now:1"}}`)
			// Their commands follow the children, one transaction per write
			// lane.
			require.Eventually(t, func() bool { return b.handedOut(t, parent.ID) == 3 }, waitLong, tick)
			fanned := fannedOut(t, parent.ID)
			for _, ch := range children {
				require.False(t, ch.Held)
				require.True(t, releasedAtCreation(t, ch, fanned), "child %s released after the fan-out committed", ch.ID)
			}
			b.settleAll(t, parent.ID, sessions)
			done := b.waitState(t, parent.ID, ledger.StateSucceeded)
			require.Equal(t, &ledger.Counts{Total: 3, Succeeded: 3}, done.Counts)
			require.Equal(t, before, counter.released.Load(), "no child released by an advance")
			for _, ch := range children {
				require.Equal(t, []string{ledger.EventSubmitted, ledger.EventReleased, ledger.EventRunning, ledger.EventSucceeded},
					eventTypes(t, b, ch.ID))
			}
		})
		t.Run("BeyondSlotsHeld", func(t *testing.T) {
			before := counter.released.Load()
			ids, sessions := b.readyNodes(t, 5)
			parent, children := fanOut(t, ids, `{"kind":"node.prepare_image","payload":{"image":"slots:1"},"max_concurrency":2}`)
			require.Eventually(t, func() bool { return b.handedOut(t, parent.ID) == 2 }, waitLong, tick)
			fanned := fannedOut(t, parent.ID)
			for i, ch := range children {
				if i < 2 {
					require.False(t, ch.Held, "child %d", i)
					require.True(t, releasedAtCreation(t, ch, fanned), "child %d", i)
				} else {
					require.True(t, ch.Held, "child %d", i)
					require.Equal(t, []string{ledger.EventSubmitted}, eventTypes(t, b, ch.ID))
				}
			}
			require.Never(t, func() bool { return b.handedOut(t, parent.ID) > 2 }, 100*time.Millisecond, 10*time.Millisecond)
			b.settleAll(t, parent.ID, sessions)
			done := b.waitState(t, parent.ID, ledger.StateSucceeded)
			require.Equal(t, &ledger.Counts{Total: 5, Succeeded: 5}, done.Counts)
			require.Equal(t, before+3, counter.released.Load(), "the three held children released by advances")
			for _, ch := range children[2:] {
				require.False(t, releasedAtCreation(t, ch, fanned), "held child %s released at creation", ch.ID)
			}
		})
		t.Run("AllRefusedEndsAtOnce", func(t *testing.T) {
			before := counter.released.Load()
			ids := []string{"ghost-a-" + b.replica, "ghost-b-" + b.replica}
			parent, children := fanOut(t, ids, `{"kind":"node.prepare_image","payload":{"image":"none:1"}}`)
			done := b.waitState(t, parent.ID, ledger.StateFailed)
			require.Equal(t, ledger.CodeChildrenFailed, done.Error.Code)
			require.Equal(t, &ledger.Counts{Total: 2, Failed: 2}, done.Counts)
			fanned := fannedOut(t, parent.ID)
			for _, ch := range children {
				require.True(t, releasedAtCreation(t, ch, fanned))
				require.Equal(t, []string{ledger.EventSubmitted, ledger.EventReleased, ledger.EventFailed}, eventTypes(t, b, ch.ID))
				got, err := b.store.Operation(ctx, ch.ID)
				require.NoError(t, err)
				require.Equal(t, string(errcode.NotFound), got.Error.Code)
			}
			require.Equal(t, int64(0), b.handedOut(t, parent.ID))
			require.Equal(t, before, counter.released.Load())
		})
	})
}
