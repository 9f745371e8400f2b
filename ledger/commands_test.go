package ledger_test

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/testwait"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

var rentalN int

// readyNode invites and enrolls a node and answers its id, session and
// enrollment answer's fencing token.
func (b *bundle) readyNode(t *testing.T) (string, fleet.Session) {
	t.Helper()
	rentalN++
	boot, err := b.fleet.Invite(ctx, "admin:test", fleet.Invite{RentalID: "rack-" + strconv.Itoa(rentalN) + "-" + b.replica, Generation: 1})
	require.NoError(t, err)
	resp, err := b.fleet.Enroll(ctx, enrollRequest(boot, b.clock.Now(), nil))
	require.NoError(t, err)
	sess, err := b.fleet.Authenticate(ctx, resp.SessionToken, fleet.DoorAsk)
	require.NoError(t, err)
	return boot.NodeID, sess
}

func enrollRequest(boot api.Bootstrap, at time.Time, unacked []api.Result) api.EnrollRequest {
	free := int64(1 << 30)
	return api.EnrollRequest{NodeID: boot.NodeID, Generation: boot.Generation, EnrollmentToken: boot.EnrollmentToken,
		AgentVersion: "1.0.0", UnacknowledgedResults: unacked,
		Facts: api.Facts{Hostname: "h", OS: "linux", Arch: "amd64", CPUs: 2, MemoryBytes: 1 << 30, DiskFreeBytes: &free,
			AgentVersion: "1.0.0", Runtimes: []string{"process"}, ObservedAt: at}}
}

func (b *bundle) command(t *testing.T, nodeID, kind, payload string) ledger.Operation {
	t.Helper()
	op, created, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: kind,
		Targets: []ledger.Target{{Kind: ledger.TargetNode, ID: nodeID}}, Operation: json.RawMessage(payload)})
	require.NoError(t, err)
	require.True(t, created)
	return op
}

const launch = `{"run_id":"r1","attempt_id":"a1","command":"/bin/true"}`
const prepare = `{"image":"busybox:1"}`

func (b *bundle) poll(t *testing.T, sess fleet.Session) []fleet.Command {
	t.Helper()
	cmds, err := b.fleet.Poll(ctx, sess, 0, "test")
	require.NoError(t, err)
	return cmds
}

func (b *bundle) settle(t *testing.T, sess fleet.Session, results ...api.Result) {
	t.Helper()
	_, err := b.fleet.Settle(ctx, sess, results)
	require.NoError(t, err)
}

func TestCommandOperations(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		t.Run("OneIdOneCommandToSuccess", func(t *testing.T) {
			node, sess := b.readyNode(t)
			op := b.command(t, node, ledger.KindNodeLaunchWorkload, launch)
			require.Equal(t, ledger.ChannelLongPoll, op.Channel)
			require.Equal(t, ledger.StatePending, op.State)
			c, err := b.fleet.Command(ctx, op.ID)
			require.NoError(t, err, "the command shares the operation's id")
			require.Equal(t, api.KindLaunchWorkload, c.Kind)
			require.JSONEq(t, launch, string(c.Payload))

			cmds := b.poll(t, sess)
			require.Len(t, cmds, 1)
			running, err := b.store.Operation(ctx, op.ID)
			require.NoError(t, err)
			require.Equal(t, ledger.StateRunning, running.State, "running once first delivered")
			require.NotNil(t, running.AcceptedAt)

			b.settle(t, sess, api.Result{OperationID: op.ID, Applied: true, Duplicate: true})
			done, err := b.store.Operation(ctx, op.ID)
			require.NoError(t, err)
			require.Equal(t, ledger.StateSucceeded, done.State)
			require.JSONEq(t, `{"applied":true,"duplicate":true}`, string(done.Result))
			require.Equal(t, []string{"submitted", "running", "succeeded"}, eventTypes(t, b, op.ID))
			// Settling again changes nothing.
			b.settle(t, sess, api.Result{OperationID: op.ID, Applied: true})
			require.Equal(t, []string{"submitted", "running", "succeeded"}, eventTypes(t, b, op.ID))
			require.Zero(t, dbtest.Count(t, b.db.DB, &models.NodeAudit{}, "action IN ?", []string{"command.issue", "command.settle"}),
				"who asked and what the node answered are the operation's events, not node audit rows")
		})
		t.Run("RefusalsAndRetryability", func(t *testing.T) {
			node, sess := b.readyNode(t)
			p := b.command(t, node, ledger.KindNodePrepareImage, prepare)
			l := b.command(t, node, ledger.KindNodeLaunchWorkload, launch)
			b.poll(t, sess)
			b.settle(t, sess, api.Result{OperationID: p.ID, Failure: "pull failed"}, api.Result{OperationID: l.ID, Failure: "exec failed"})
			pf, _ := b.store.Operation(ctx, p.ID)
			lf, _ := b.store.Operation(ctx, l.ID)
			require.Equal(t, ledger.StateFailed, pf.State)
			require.Equal(t, &ledger.Error{Code: "refused_by_node", Message: "pull failed", Retryable: true}, pf.Error)
			require.Equal(t, &ledger.Error{Code: "refused_by_node", Message: "exec failed", Retryable: false}, lf.Error)
		})
		t.Run("RefusedAtSubmitRecordsNothing", func(t *testing.T) {
			boot, err := b.fleet.Invite(ctx, "admin:test", fleet.Invite{RentalID: "enrolling-" + b.replica, Generation: 1})
			require.NoError(t, err)
			before := countOps(t, b)
			target := []ledger.Target{{Kind: ledger.TargetNode, ID: boot.NodeID}}
			_, _, err = b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindNodeLaunchWorkload, Targets: target, Operation: json.RawMessage(launch)})
			requireCode(t, err, errcode.NodeNotReady)
			_, _, err = b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindNodeLaunchWorkload,
				Targets: []ledger.Target{{Kind: ledger.TargetNode, ID: "ghost"}}, Operation: json.RawMessage(launch)})
			requireCode(t, err, errcode.NotFound)
			_, _, err = b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindNodeLaunchWorkload, Targets: target, Operation: json.RawMessage(`{"run_id":"r"}`)})
			requireCode(t, err, errcode.ValidationFailed)
			require.Equal(t, before, countOps(t, b))
			require.Zero(t, dbtest.Count(t, b.db.DB, &models.Command{}, "node_id = ?", boot.NodeID))
		})
		t.Run("CancelWithdrawsOnlyUndelivered", func(t *testing.T) {
			node, sess := b.readyNode(t)
			undelivered := b.command(t, node, ledger.KindNodePrepareImage, prepare)
			got, err := b.svc.Cancel(ctx, admin, undelivered.ID, "not needed")
			require.NoError(t, err)
			require.Equal(t, ledger.StateCancelled, got.State)
			c, _ := b.fleet.Command(ctx, undelivered.ID)
			require.Equal(t, fleet.CommandCancelled, c.State)
			require.Empty(t, b.poll(t, sess), "a withdrawn command is never delivered")

			delivered := b.command(t, node, ledger.KindNodeLaunchWorkload, launch)
			require.Len(t, b.poll(t, sess), 1)
			got, err = b.svc.Cancel(ctx, admin, delivered.ID, "too late")
			require.NoError(t, err)
			require.Equal(t, ledger.StateRunning, got.State, "once delivered, it ends with the node's answer")
			require.NotNil(t, got.CancelRequestedAt)
			b.settle(t, sess, api.Result{OperationID: delivered.ID, Applied: true})
			done, _ := b.store.Operation(ctx, delivered.ID)
			require.Equal(t, ledger.StateSucceeded, done.State)
		})
		t.Run("RetirementCancelsUndelivered", func(t *testing.T) {
			node, _ := b.readyNode(t)
			op := b.command(t, node, ledger.KindNodePrepareImage, prepare)
			_, err := b.fleet.Retire(ctx, "admin:test", node, "")
			require.NoError(t, err)
			done, _ := b.store.Operation(ctx, op.ID)
			require.Equal(t, ledger.StateCancelled, done.State)
			require.Equal(t, "node_retired", done.Error.Code)
		})
		t.Run("ReenrollmentEndsDeliveredLaunchOutcomeUnknown", func(t *testing.T) {
			rentalN++
			boot, err := b.fleet.Invite(ctx, "admin:test", fleet.Invite{RentalID: "re-" + strconv.Itoa(rentalN) + b.replica, Generation: 1})
			require.NoError(t, err)
			resp, err := b.fleet.Enroll(ctx, enrollRequest(boot, b.clock.Now(), nil))
			require.NoError(t, err)
			sess, err := b.fleet.Authenticate(ctx, resp.SessionToken, fleet.DoorAsk)
			require.NoError(t, err)
			op := b.command(t, boot.NodeID, ledger.KindNodeLaunchWorkload, launch)
			require.Len(t, b.poll(t, sess), 1)
			again, err := b.fleet.Reinvite(ctx, "admin:test", boot.NodeID, nil)
			require.NoError(t, err)
			_, err = b.fleet.Enroll(ctx, enrollRequest(again, b.clock.Now(), nil))
			require.NoError(t, err)
			done, _ := b.store.Operation(ctx, op.ID)
			require.Equal(t, ledger.StateFailed, done.State)
			require.Equal(t, &ledger.Error{Code: "outcome_unknown", Message: done.Error.Message, Retryable: false}, done.Error)
		})
		t.Run("NodeQuota", func(t *testing.T) {
			node, _ := b.readyNode(t)
			for i := range 32 {
				b.command(t, node, ledger.KindNodePrepareImage, `{"image":"img-`+strconv.Itoa(i)+`"}`)
			}
			before := countOps(t, b)
			_, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindNodePrepareImage,
				Targets: []ledger.Target{{Kind: ledger.TargetNode, ID: node}}, Operation: json.RawMessage(prepare)})
			requireCode(t, err, errcode.QuotaExceeded)
			require.Equal(t, before, countOps(t, b))
			_, _, err = b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindNodeRetire,
				Targets: []ledger.Target{{Kind: ledger.TargetNode, ID: node}}})
			require.NoError(t, err, "retirement is exempt from the node quota")
		})
		t.Run("CallerOperationIDs", func(t *testing.T) {
			node, _ := b.readyNode(t)
			sub := ledger.Submission{OperationID: "op-" + b.replica, RequestID: "op-" + b.replica, Kind: ledger.KindNodePrepareImage,
				Targets: []ledger.Target{{Kind: ledger.TargetNode, ID: node}}, Operation: json.RawMessage(prepare)}
			op, created, err := b.svc.Submit(ctx, admin, sub)
			require.NoError(t, err)
			require.True(t, created)
			require.Equal(t, sub.OperationID, op.ID)
			sub.RequestID = "another-request"
			_, _, err = b.svc.Submit(ctx, admin, sub)
			requireCode(t, err, errcode.OperationConflict)
		})
	})
}

func TestUndeliveredCommandTimesOut(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		node, sess := b.readyNode(t)
		op := b.command(t, node, ledger.KindNodePrepareImage, prepare)
		b.clock.Advance(11 * time.Minute)
		b.start(t)
		done := b.waitState(t, op.ID, ledger.StateFailed)
		require.Equal(t, ledger.CodeTimedOut, done.Error.Code)
		require.Empty(t, b.poll(t, sess))
	}, func(s *ledger.Settings) { s.OwnerLease = 300 * time.Millisecond })
}

func TestPruneTakesSettledCommandsWithTheirOperations(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		node, sess := b.readyNode(t)
		settled := b.command(t, node, ledger.KindNodePrepareImage, prepare)
		open := b.command(t, node, ledger.KindNodeLaunchWorkload, launch)
		b.poll(t, sess)
		b.settle(t, sess, api.Result{OperationID: settled.ID, Applied: true})
		b.clock.Advance(91 * 24 * time.Hour)
		ops, _, err := b.svc.Prune(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, ops)
		_, err = b.fleet.Command(ctx, settled.ID)
		require.Error(t, err, "the settled command went with its operation")
		c, err := b.fleet.Command(ctx, open.ID)
		require.NoError(t, err, "an open command stays")
		require.Equal(t, fleet.CommandPending, c.State)
		rec, err := b.fleet.Reconcile(ctx, node)
		require.NoError(t, err)
		require.Equal(t, []string{open.ID}, rec.PendingOperationIDs)
	})
}

func TestRetirementEndsTheNodesOperations(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		b.start(t)
		node, sess := b.readyNode(t)
		delivered := b.command(t, node, ledger.KindNodeLaunchWorkload, launch)
		undelivered := b.command(t, node, ledger.KindNodePrepareImage, `{"image":"late"}`)
		due, err := b.fleet.Poll(ctx, sess, 0, "test")
		require.NoError(t, err)
		require.Len(t, due, 2)
		require.NoError(t, b.fleet.Release(ctx, sess, due[1:])) // only the launch was seen
		retire, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindNodeRetire,
			Targets: []ledger.Target{{Kind: ledger.TargetNode, ID: node}}, Wait: waitLong})
		require.NoError(t, err)
		require.Equal(t, ledger.StateSucceeded, retire.State, "%+v", retire.Error)

		d, _ := b.store.Operation(ctx, delivered.ID)
		require.Equal(t, ledger.StateFailed, d.State)
		require.Equal(t, "outcome_unknown", d.Error.Code)
		u, _ := b.store.Operation(ctx, undelivered.ID)
		require.Equal(t, ledger.StateFailed, u.State, "the released command had been delivered once: its outcome is unknown too")

		// A late answer still settles the command; the operation stays as
		// it ended.
		b.settle(t, sess, api.Result{OperationID: delivered.ID, Applied: true})
		c, _ := b.fleet.Command(ctx, delivered.ID)
		require.Equal(t, fleet.CommandApplied, c.State)
		d, _ = b.store.Operation(ctx, delivered.ID)
		require.Equal(t, ledger.StateFailed, d.State)
	})
}

// TestCommandReplays: a command's submit goes straight to recording and
// looks its request up only once refused; a replay still answers 200 when
// the node's quota has filled and after the node retired (DECISIONS.md
// §13), another body under the request id is request_conflict, and the
// operation id under another request is operation_conflict.
func TestCommandReplays(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		node, _ := b.readyNode(t)
		target := []ledger.Target{{Kind: ledger.TargetNode, ID: node}}
		sub := ledger.Submission{OperationID: "replayed-" + b.replica, RequestID: "replayed-" + b.replica,
			Kind: ledger.KindNodePrepareImage, Targets: target, Operation: json.RawMessage(prepare)}
		first, created, err := b.svc.Submit(ctx, admin, sub)
		require.NoError(t, err)
		require.True(t, created)
		replay := func() ledger.Operation {
			t.Helper()
			op, created, err := b.svc.Submit(ctx, admin, sub)
			require.NoError(t, err)
			require.False(t, created)
			require.Equal(t, first.ID, op.ID)
			return op
		}
		replay()
		require.Equal(t, []string{"submitted"}, eventTypes(t, b, first.ID))

		for i := range 31 {
			b.command(t, node, ledger.KindNodePrepareImage, `{"image":"fill-`+strconv.Itoa(i)+`"}`)
		}
		before := countOps(t, b)
		_, _, err = b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindNodePrepareImage,
			Targets: target, Operation: json.RawMessage(prepare)})
		requireCode(t, err, errcode.QuotaExceeded)
		require.Equal(t, ledger.StatePending, replay().State, "the quota is full")

		other := sub
		other.Operation = json.RawMessage(`{"image":"other"}`)
		_, _, err = b.svc.Submit(ctx, admin, other)
		requireCode(t, err, errcode.RequestConflict)
		other = sub
		other.RequestID = "another-" + b.replica
		_, _, err = b.svc.Submit(ctx, admin, other)
		requireCode(t, err, errcode.OperationConflict)
		require.Equal(t, before, countOps(t, b))

		_, err = b.fleet.Retire(ctx, "admin:test", node, "")
		require.NoError(t, err)
		require.Equal(t, ledger.StateCancelled, replay().State, "the node retired")
		_, _, err = b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindNodePrepareImage,
			Targets: target, Operation: json.RawMessage(prepare)})
		requireCode(t, err, errcode.NodeRetired)
		_, _, err = b.svc.Submit(ctx, admin, other)
		requireCode(t, err, errcode.OperationConflict)
		require.Equal(t, before, countOps(t, b))
		require.Equal(t, []string{"submitted", "cancelled"}, eventTypes(t, b, first.ID))
	})
}

// TestCommandSubmitConcurrentSameRequestIsOneOperation: submits of one
// command request at once record one operation and one command; every
// other answers it as a replay.
func TestCommandSubmitConcurrentSameRequestIsOneOperation(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		node, _ := b.readyNode(t)
		sub := ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindNodePrepareImage,
			Targets: []ledger.Target{{Kind: ledger.TargetNode, ID: node}}, Operation: json.RawMessage(prepare)}
		submitAtOnce(t, b, sub)
		require.Equal(t, int64(1), dbtest.Count(t, b.db.DB, &models.Operation{}, "request_id = ?", sub.RequestID))
		require.Equal(t, int64(1), dbtest.Count(t, b.db.DB, &models.Command{}, "node_id = ?", node))
	})
}

// The per-node quota is exact under concurrent submits from two replicas.
// On Postgres the count rides the command's insert (models: issueSQL), and
// an insert that waited for the node's lock while the other replica's
// batch held it must still count what that batch committed.
func TestNodeQuotaHoldsAcrossReplicas(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		other := newLedger(t, b.db, b.tk, b.clock)
		node, _ := b.readyNode(t)
		quota := b.svc.Settings().NodeQuota
		const submitters, per = 32, 4 // 128 attempts, half through each replica
		var created, refused atomic.Int64
		var wg sync.WaitGroup
		for i := range submitters {
			svc := b.svc
			if i%2 == 1 {
				svc = other.svc
			}
			wg.Go(func() {
				for range per {
					_, _, err := svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindNodePrepareImage,
						Targets: []ledger.Target{{Kind: ledger.TargetNode, ID: node}}, Operation: json.RawMessage(prepare)})
					switch {
					case err == nil:
						created.Add(1)
					case errcode.Of(err) == errcode.QuotaExceeded:
						refused.Add(1)
					default:
						t.Errorf("submit: %v", err)
					}
				}
			})
		}
		wg.Wait()
		require.Equal(t, int64(quota), created.Load(), "operations recorded")
		require.Equal(t, int64(submitters*per-quota), refused.Load(), "quota refusals")
		require.Equal(t, int64(quota), dbtest.Count(t, b.db.DB, &models.Command{}, "node_id = ?", node))
	})
}

// heldPoll starts a long-poll of sess and answers what it returns, once
// the hub holds it; resume: the poll asks to resume (an agent's first).
func (b *bundle) heldPoll(t *testing.T, pollCtx context.Context, sess fleet.Session, resume ...bool) <-chan pollAnswer {
	t.Helper()
	held := b.fleet.Hub().HeldFor(sess.NodeID)
	got := make(chan pollAnswer, 1)
	go func() {
		a, err := b.fleet.PollFor(pollCtx, sess, fleet.PollRequest{Wait: 30 * time.Second, Remote: "test", Resume: len(resume) > 0 && resume[0]})
		got <- pollAnswer{a.Commands, err}
	}()
	testwait.For(t, "the poll held", testwait.Patience, func() bool { return b.fleet.Hub().HeldFor(sess.NodeID) > held })
	return got
}

type pollAnswer struct {
	cmds []fleet.Command
	err  error
}

func receive(t *testing.T, got <-chan pollAnswer) pollAnswer {
	t.Helper()
	select {
	case a := <-got:
		return a
	case <-time.After(testwait.Patience):
		t.Fatal("the long-poll was not answered")
		return pollAnswer{}
	}
}

// A command submitted while its node's agent holds a long-poll on this
// replica is recorded delivered to that poll by the submitting transaction
// and handed to it on commit: the submit answers the operation running,
// and the poll runs no claim (nor read) of its own.
func TestCommandHandedToTheHeldPoll(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		for _, resume := range []bool{false, true} {
			t.Run(map[bool]string{false: "Plain", true: "Resuming"}[resume], func(t *testing.T) {
				handedToTheHeldPoll(t, b, resume)
			})
		}
	})
}

func handedToTheHeldPoll(t *testing.T, b *bundle, resume bool) {
	t.Helper()
	node, sess := b.readyNode(t)
	require.Empty(t, b.poll(t, sess)) // the read that finds the node quiet
	reads, direct := testutil.ToFloat64(b.metrics.PollStoreQueries), testutil.ToFloat64(b.metrics.PollDirectClaims)
	handoffs := testutil.ToFloat64(b.metrics.PollHandoffs)

	got := b.heldPoll(t, ctx, sess, resume)
	op := b.command(t, node, ledger.KindNodePrepareImage, prepare)
	require.Equal(t, ledger.StateRunning, op.State, "answered as it stands: delivered")
	require.NotNil(t, op.AcceptedAt)
	a := receive(t, got)
	require.NoError(t, a.err)
	require.Len(t, a.cmds, 1)
	require.Equal(t, op.ID, a.cmds[0].OperationID)
	require.Equal(t, 1, a.cmds[0].DeliveryCount)
	require.Equal(t, handoffs+1, testutil.ToFloat64(b.metrics.PollHandoffs))
	require.Equal(t, reads, testutil.ToFloat64(b.metrics.PollStoreQueries), "the held poll read nothing")
	require.Equal(t, direct, testutil.ToFloat64(b.metrics.PollDirectClaims), "the held poll claimed nothing")
	stored, err := b.store.Operation(ctx, op.ID)
	require.NoError(t, err)
	require.Equal(t, ledger.StateRunning, stored.State)
	require.Equal(t, []string{"submitted", "running"}, eventTypes(t, b, op.ID))
	require.Empty(t, b.poll(t, sess), "delivered once, not again within the visibility timeout")

	settled, err := b.fleet.Settle(ctx, sess, []api.Result{{OperationID: op.ID, Applied: true}})
	require.NoError(t, err)
	require.Equal(t, "applied", settled[0].State)
	done, err := b.store.Operation(ctx, op.ID)
	require.NoError(t, err)
	require.Equal(t, ledger.StateSucceeded, done.State)
}

// A poll that took another answer before the submitting transaction's
// commit handed it the command (here: its agent left) is handed nothing:
// the hand-off is undone (fleet.Service.Unclaim), the command due again
// at once, and the next poll gets it as its first delivery.
func TestCommandHandedToAPollThatLeftIsReleased(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		node, sess := b.readyNode(t)
		require.Empty(t, b.poll(t, sess))
		pollCtx, leave := context.WithCancel(ctx)
		got := b.heldPoll(t, pollCtx, sess)
		var left pollAnswer
		b.fstore.SetOnCommit(func(notes []fleet.Notification) {
			for _, n := range notes {
				if n.Kind == fleet.NotifyHanded {
					leave() // the agent goes away between the commit and the hand-off
					left = receive(t, got)
				}
			}
			b.fleet.Deliver(notes, "local")
		})
		op := b.command(t, node, ledger.KindNodePrepareImage, prepare)
		require.ErrorIs(t, left.err, context.Canceled)
		require.Empty(t, left.cmds)
		require.Equal(t, 0.0, testutil.ToFloat64(b.metrics.PollHandoffs))

		var again []fleet.Command
		testwait.For(t, "the command released and due again", testwait.Patience, func() bool {
			again = b.poll(t, sess)
			return len(again) > 0
		})
		require.Equal(t, op.ID, again[0].OperationID)
		require.Equal(t, 1, again[0].DeliveryCount, "the node never saw the hand-off")
	})
}

// A fan-out's children whose agents hold long-polls here are recorded
// delivered to those polls (fleet: handToHeldPolls): each poll is handed
// its child's command, reads and claims nothing, and the child is running
// from the transaction that recorded it. A child whose node holds no
// poll is recorded undelivered, for the node's next poll to claim.
func TestFanOutChildrenHandedToHeldPolls(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		b.start(t)
		ids, sessions := b.readyNodes(t, 4)
		idle := ids[3] // holds no poll
		polls := map[string]<-chan pollAnswer{}
		for _, id := range ids[:3] {
			require.Empty(t, b.poll(t, sessions[id])) // the read that finds the node quiet
			polls[id] = b.heldPoll(t, ctx, sessions[id])
		}
		reads, direct := testutil.ToFloat64(b.metrics.PollStoreQueries), testutil.ToFloat64(b.metrics.PollDirectClaims)
		handoffs := testutil.ToFloat64(b.metrics.PollHandoffs)

		parent := b.fanOutCommand(t, ids)
		byNode := map[string]ledger.Operation{}
		for _, ch := range b.children(t, parent.ID) {
			byNode[ch.TargetID] = ch
		}
		for _, id := range ids[:3] {
			a := receive(t, polls[id])
			require.NoError(t, a.err)
			require.Len(t, a.cmds, 1)
			require.Equal(t, byNode[id].ID, a.cmds[0].OperationID)
			require.Equal(t, 1, a.cmds[0].DeliveryCount)
			require.Equal(t, []string{"submitted", "released", "running"}, eventTypes(t, b, a.cmds[0].OperationID))
			ch, err := b.store.Operation(ctx, a.cmds[0].OperationID)
			require.NoError(t, err)
			require.Equal(t, ledger.StateRunning, ch.State)
			require.NotNil(t, ch.AcceptedAt)
		}
		require.Equal(t, handoffs+3, testutil.ToFloat64(b.metrics.PollHandoffs))
		require.Equal(t, reads, testutil.ToFloat64(b.metrics.PollStoreQueries), "the held polls read nothing")
		require.Equal(t, direct, testutil.ToFloat64(b.metrics.PollDirectClaims), "the held polls claimed nothing")
		for _, id := range ids[:3] {
			require.Empty(t, b.poll(t, sessions[id]), "delivered once, not again within the visibility timeout")
			b.settle(t, sessions[id], api.Result{OperationID: byNode[id].ID, Applied: true})
		}

		c, err := b.fleet.Command(ctx, byNode[idle].ID)
		require.NoError(t, err)
		require.Equal(t, 0, c.DeliveryCount, "no poll held: recorded undelivered")
		require.Equal(t, ledger.StatePending, b.op(t, byNode[idle].ID).State)

		b.settleAll(t, parent.ID, sessions)
		done := b.waitState(t, parent.ID, ledger.StateSucceeded)
		require.Equal(t, &ledger.Counts{Total: 4, Succeeded: 4}, done.Counts)
	})
}
