package ledger_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/ledger"
)

// node.configure and fleet.configure through the ledger (DECISIONS.md §32).

func (b *bundle) configureOp(t *testing.T, nodeID, op string) ledger.Operation {
	t.Helper()
	got, created, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindNodeConfigure,
		Targets: nodeTargets(nodeID), Operation: json.RawMessage(op)})
	require.NoError(t, err)
	require.True(t, created)
	return got
}

func (b *bundle) reportConfig(t *testing.T, sess fleet.Session, rev int64, state, msg string) {
	t.Helper()
	c, err := b.fleet.NodeConfig(ctx, sess.NodeID)
	require.NoError(t, err)
	_, err = b.fleet.RecordEvents(ctx, sess, []api.Event{{ID: newRequestID(), Kind: api.EventConfig, ObservedAt: b.clock.Now(),
		Config: &api.ConfigReport{Revision: rev, Hash: c.Desired.Hash, State: state, Message: msg}}})
	require.NoError(t, err)
}

// reportEach polls every node until each was handed its configuration,
// and reports on it the state and message judge answers (judge may
// also check what the node was handed).
func (b *bundle) reportEach(t *testing.T, ids []string, sessions map[string]fleet.Session,
	judge func(i int, handed *api.ConfigDelivery) (state, message string)) {
	t.Helper()
	reported := map[string]bool{}
	require.Eventually(t, func() bool {
		for i, id := range ids {
			if reported[id] {
				continue
			}
			a, err := b.fleet.PollWork(ctx, sessions[id], 0, "")
			require.NoError(t, err)
			if a.Config == nil {
				continue
			}
			state, msg := judge(i, a.Config)
			b.reportConfig(t, sessions[id], a.Config.Revision, state, msg)
			reported[id] = true
		}
		return len(reported) == len(ids)
	}, waitLong, tick)
}

func lastEvent(t *testing.T, b *bundle, id string) ledger.Event {
	t.Helper()
	evs, err := b.store.Events(ctx, id, 0, 100)
	require.NoError(t, err)
	require.NotEmpty(t, evs)
	return evs[len(evs)-1]
}

func (b *bundle) op(t *testing.T, id string) ledger.Operation {
	t.Helper()
	op, err := b.store.Operation(ctx, id)
	require.NoError(t, err)
	return op
}

func TestNodeConfigure(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		t.Run("EndsWithTheNodesReport", func(t *testing.T) {
			node, sess := b.readyNode(t)
			op := b.configureOp(t, node, `{"format":"nginx.site/v1","document":{"port":80}}`)
			require.Equal(t, ledger.ChannelLongPoll, op.Channel)
			require.Equal(t, ledger.StatePending, op.State)
			a, err := b.fleet.PollWork(ctx, sess, 0, "")
			require.NoError(t, err)
			require.NotNil(t, a.Config)
			running := b.op(t, op.ID)
			require.Equal(t, ledger.StateRunning, running.State, "running once its revision was delivered")
			require.NotNil(t, running.AcceptedAt)
			require.Equal(t, ledger.ChannelLongPoll, running.Channel)
			// Delivered again (the visibility timeout passed): still one
			// running event.
			b.clock.Advance(2 * time.Minute)
			again, err := b.fleet.PollWork(ctx, sess, 0, "")
			require.NoError(t, err)
			require.NotNil(t, again.Config)
			require.Equal(t, []string{ledger.EventSubmitted, ledger.EventRunning}, eventTypes(t, b, op.ID))
			b.reportConfig(t, sess, 1, api.ConfigApplied, "")
			got := b.op(t, op.ID)
			require.Equal(t, ledger.StateSucceeded, got.State, "ended in the report's transaction")
			require.Equal(t, []string{ledger.EventSubmitted, ledger.EventRunning, string(ledger.StateSucceeded)}, eventTypes(t, b, op.ID))
			require.JSONEq(t, `{"revision":1,"hash":"`+a.Config.Hash+`","state":"applied"}`, string(got.Result))
			require.JSONEq(t, `{"from":"running"}`, string(lastEvent(t, b, op.ID).Data))
			require.NotNil(t, got.FinishedAt)
			require.True(t, got.Terminal())
		})
		t.Run("SucceedsAtOnceWhenAlreadyApplied", func(t *testing.T) {
			node, sess := b.readyNode(t)
			b.configureOp(t, node, `{"format":"f/v1","document":{"a":1}}`)
			b.reportConfig(t, sess, 1, api.ConfigApplied, "")
			again := b.configureOp(t, node, `{"format":"f/v1","document":{"a":1}}`)
			require.Equal(t, ledger.StateSucceeded, again.State, "answered ended at submit")
			require.Equal(t, ledger.StateSucceeded, b.op(t, again.ID).State)
		})
		t.Run("RunningOnlyForItsNode", func(t *testing.T) {
			node, sess := b.readyNode(t)
			other, _ := b.readyNode(t)
			op := b.configureOp(t, node, `{"format":"f/v1","document":{"r":1}}`)
			otherOp := b.configureOp(t, other, `{"format":"f/v1","document":{"r":1}}`)
			_, err := b.fleet.PollWork(ctx, sess, 0, "")
			require.NoError(t, err)
			require.Equal(t, ledger.StateRunning, b.op(t, op.ID).State)
			require.Equal(t, ledger.StatePending, b.op(t, otherOp.ID).State, "not delivered yet")
			// A forced resubmit of the revision after a failure is
			// pending until delivered again, then running.
			b.reportConfig(t, sess, 1, api.ConfigFailed, "no")
			forced := b.configureOp(t, node, `{"format":"f/v1","document":{"r":1},"force":true}`)
			require.Equal(t, ledger.StatePending, forced.State)
			a, err := b.fleet.PollWork(ctx, sess, 0, "")
			require.NoError(t, err)
			require.NotNil(t, a.Config)
			require.Equal(t, ledger.StateRunning, b.op(t, forced.ID).State)
		})
		t.Run("RunningAtSubmitWhenAlreadyDelivered", func(t *testing.T) {
			node, sess := b.readyNode(t)
			first := b.configureOp(t, node, `{"format":"f/v1","document":{"d":1}}`)
			_, err := b.fleet.PollWork(ctx, sess, 0, "")
			require.NoError(t, err)
			// The same document again while the node holds it unreported:
			// its channel has it, so the new operation is running at once.
			again := b.configureOp(t, node, `{"format":"f/v1","document":{"d":1}}`)
			require.Equal(t, ledger.StateRunning, again.State, "answered running at submit")
			require.NotNil(t, again.AcceptedAt)
			require.Equal(t, []string{ledger.EventSubmitted, ledger.EventRunning}, eventTypes(t, b, again.ID))
			b.reportConfig(t, sess, 1, api.ConfigApplied, "")
			require.Equal(t, ledger.StateSucceeded, b.op(t, first.ID).State)
			require.Equal(t, ledger.StateSucceeded, b.op(t, again.ID).State)
		})
		t.Run("CancelRunning", func(t *testing.T) {
			node, sess := b.readyNode(t)
			op := b.configureOp(t, node, `{"format":"f/v1","document":{"c":1}}`)
			_, err := b.fleet.PollWork(ctx, sess, 0, "")
			require.NoError(t, err)
			require.Equal(t, ledger.StateRunning, b.op(t, op.ID).State)
			got, err := b.svc.Cancel(ctx, admin, op.ID, "enough")
			require.NoError(t, err)
			require.Equal(t, ledger.StateCancelled, got.State, "a delivered configure's operation ends at once")
			c, err := b.fleet.NodeConfig(ctx, node)
			require.NoError(t, err)
			require.Equal(t, int64(1), c.Desired.Revision, "the configuration stays desired")
		})
		t.Run("FailedWithTheNodesMessage", func(t *testing.T) {
			node, sess := b.readyNode(t)
			op := b.configureOp(t, node, `{"format":"f/v1","document":{"a":1}}`)
			b.reportConfig(t, sess, 1, api.ConfigFailed, "hook exited 3")
			got := b.op(t, op.ID)
			require.Equal(t, ledger.StateFailed, got.State)
			require.Equal(t, ledger.CodeConfigFailed, got.Error.Code)
			require.Equal(t, "hook exited 3", got.Error.Message)
			require.False(t, got.Error.Retryable)
			// Never delivered: it ended from pending, and its event says so.
			require.JSONEq(t, `{"from":"pending","error":{"code":"config_failed","message":"hook exited 3","retryable":false}}`,
				string(lastEvent(t, b, op.ID).Data))
		})
		t.Run("Superseded", func(t *testing.T) {
			node, _ := b.readyNode(t)
			first := b.configureOp(t, node, `{"format":"f/v1","document":{"a":1}}`)
			second := b.configureOp(t, node, `{"format":"f/v1","document":{"a":2}}`)
			got := b.op(t, first.ID)
			require.Equal(t, ledger.StateFailed, got.State)
			require.Equal(t, ledger.CodeSuperseded, got.Error.Code)
			require.False(t, got.Error.Retryable)
			require.Equal(t, ledger.StatePending, b.op(t, second.ID).State)
		})
		t.Run("ClearingIsANewRevision", func(t *testing.T) {
			node, sess := b.readyNode(t)
			b.configureOp(t, node, `{"format":"f/v1","document":{"a":1}}`)
			b.configureOp(t, node, `{"format":"f/v1","document":null}`)
			a, err := b.fleet.PollWork(ctx, sess, 0, "")
			require.NoError(t, err)
			require.Equal(t, int64(2), a.Config.Revision)
			require.Equal(t, "null", string(a.Config.Document))
		})
		t.Run("RetiredNodeRefusedAtSubmit", func(t *testing.T) {
			node, _ := b.readyNode(t)
			_, err := b.fleet.Retire(ctx, "admin:test", node, "")
			require.NoError(t, err)
			before := countOps(t, b)
			_, _, err = b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindNodeConfigure,
				Targets: nodeTargets(node), Operation: json.RawMessage(`{"format":"f/v1","document":{}}`)})
			requireCode(t, err, errcode.NodeRetired)
			require.Equal(t, before, countOps(t, b), "nothing recorded")
		})
		t.Run("EnrollingNodeAccepted", func(t *testing.T) {
			boot, err := b.fleet.Invite(ctx, "admin:test", fleet.Invite{RentalID: "cfg-enrolling-" + b.replica, Generation: 1})
			require.NoError(t, err)
			op := b.configureOp(t, boot.NodeID, `{"format":"f/v1","document":{}}`)
			require.Equal(t, ledger.StatePending, op.State)
		})
		t.Run("BadInputRecordsNothing", func(t *testing.T) {
			node, _ := b.readyNode(t)
			other, _ := b.readyNode(t)
			before := countOps(t, b)
			big := `"` + strings.Repeat("x", 300<<10) + `"`
			for _, c := range []struct {
				targets []ledger.Target
				op      string
				field   string
			}{
				{nodeTargets(node), `{"document":{}}`, "operation/format"},
				{nodeTargets(node), `{"format":"","document":{}}`, "operation/format"},
				{nodeTargets(node), `{"format":"` + strings.Repeat("f", 129) + `","document":{}}`, "operation/format"},
				{nodeTargets(node), `{"format":"has space","document":{}}`, "operation/format"},
				{nodeTargets(node), `{"format":"f/v1"}`, "operation/document"},
				{nodeTargets(node), `{"format":"f/v1","document":` + big + `}`, "operation/document"},
				{nodeTargets(node), `{"format":"f/v1","document":{},"force":"yes"}`, "operation/force"},
				{nodeTargets(node), `{"format":"f/v1","document":{},"force":null}`, "operation/force"},
				{nodeTargets(node, other), `{"format":"f/v1","document":{}}`, "targets"},
				{nil, `{"format":"f/v1","document":{}}`, "targets"},
			} {
				_, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindNodeConfigure,
					Targets: c.targets, Operation: json.RawMessage(c.op)})
				requireCode(t, err, errcode.ValidationFailed)
				require.Contains(t, err.Error(), c.field, "for %s", c.op[:min(len(c.op), 80)])
			}
			require.Equal(t, before, countOps(t, b))
		})
		t.Run("NodeQuotaCountsConfigures", func(t *testing.T) {
			node, _ := b.readyNode(t)
			c, err := b.fleet.NodeConfig(ctx, node)
			require.NoError(t, err)
			require.Nil(t, c.Desired)
			op := b.configureOp(t, node, `{"format":"f/v1","document":{"q":1}}`)
			open, err := b.svc.List(ctx, admin, ledger.Filter{TargetID: node, State: ledger.StatePending, Limit: 10})
			require.NoError(t, err)
			require.Len(t, open, 1)
			require.Equal(t, op.ID, open[0].ID)
		})
	})
}

func TestNodeConfigureTimesOut(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		node, _ := b.readyNode(t)
		undelivered := b.configureOp(t, node, `{"format":"f/v1","document":{"a":1}}`)
		other, otherSess := b.readyNode(t)
		delivered := b.configureOp(t, other, `{"format":"f/v1","document":{"a":1}}`)
		_, err := b.fleet.PollWork(ctx, otherSess, 0, "")
		require.NoError(t, err)
		require.Equal(t, ledger.StateRunning, b.op(t, delivered.ID).State)
		b.clock.Advance(11 * time.Minute)
		b.start(t)
		for _, id := range []string{undelivered.ID, delivered.ID} {
			done := b.waitState(t, id, ledger.StateFailed)
			require.Equal(t, ledger.CodeTimedOut, done.Error.Code)
		}
		c, err := b.fleet.NodeConfig(ctx, node)
		require.NoError(t, err)
		require.Equal(t, int64(1), c.Desired.Revision, "the configuration stays desired")
	}, func(s *ledger.Settings) { s.OwnerLease = 300 * time.Millisecond })
}

func TestRetirementEndsOpenConfigures(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		b.start(t)
		node, _ := b.readyNode(t)
		op := b.configureOp(t, node, `{"format":"f/v1","document":{"a":1}}`)
		retire, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindNodeRetire,
			Targets: nodeTargets(node), Wait: waitLong})
		require.NoError(t, err)
		require.Equal(t, ledger.StateSucceeded, retire.State)
		got := b.op(t, op.ID)
		require.Equal(t, ledger.StateFailed, got.State)
		require.Equal(t, "node_retired", got.Error.Code)
	})
}

func TestFleetConfigure(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		b.start(t)
		const n = 20
		var ids []string
		sessions := map[string]fleet.Session{}
		for range n {
			id, sess := b.readyNode(t)
			ids = append(ids, id)
			sessions[id] = sess
		}
		parent, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindFleetConfigure,
			Targets: nodeTargets(ids...), Operation: json.RawMessage(`{"format":"f/v1","document":{"fleet":true},"max_concurrency":5}`)})
		require.NoError(t, err)
		require.Eventually(t, func() bool { return len(b.children(t, parent.ID)) == n }, waitLong, tick)
		// Every node converges as its child is handed out; the first fails.
		b.reportEach(t, ids, sessions, func(i int, _ *api.ConfigDelivery) (string, string) {
			if i == 0 {
				return api.ConfigFailed, "node 0"
			}
			return api.ConfigApplied, "node " + strconv.Itoa(i)
		})
		done := b.waitState(t, parent.ID, ledger.StateFailed)
		require.Equal(t, ledger.CodeChildrenFailed, done.Error.Code)
		require.Equal(t, &ledger.Counts{Total: n, Succeeded: n - 1, Failed: 1}, done.Counts)
		for _, ch := range b.children(t, parent.ID) {
			require.Equal(t, ledger.KindNodeConfigure, ch.Kind)
			require.Equal(t, ledger.FamilyNodeConfig, ch.Family)
		}
	})
}

// A fleet.configure child held for a slot is recorded after the operator's
// later node.configure of its node: the later submission stays desired and
// the child ends superseded, as if it had been recorded in submit order.
func TestFleetConfigureHeldChildDoesNotUndoALaterNodeConfigure(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		b.start(t)
		first, firstSess := b.readyNode(t)
		second, _ := b.readyNode(t)
		parent, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindFleetConfigure,
			Targets: nodeTargets(first, second), Operation: json.RawMessage(`{"format":"f/v1","document":{"fleet":true},"max_concurrency":1}`)})
		require.NoError(t, err)
		var held, running ledger.Operation
		require.Eventually(t, func() bool {
			held, running = ledger.Operation{}, ledger.Operation{}
			for _, ch := range b.children(t, parent.ID) {
				if ch.Held {
					held = ch
				} else {
					running = ch
				}
			}
			// Let go once its released child is recorded.
			return held.ID != "" && running.ID != "" && b.op(t, parent.ID).Owner == ""
		}, waitLong, tick)
		require.Equal(t, first, running.TargetID, "children are released in target order")
		require.Equal(t, second, held.TargetID)

		mine := b.configureOp(t, second, `{"format":"f/v1","document":{"mine":true}}`)
		before, err := b.fleet.NodeConfig(ctx, second)
		require.NoError(t, err)
		require.Equal(t, int64(1), before.Desired.Revision)

		// The first node applies: the slot frees and the held child is
		// released, after the node.configure submitted later than it.
		a, err := b.fleet.PollWork(ctx, firstSess, 0, "")
		require.NoError(t, err)
		require.NotNil(t, a.Config)
		b.reportConfig(t, firstSess, a.Config.Revision, api.ConfigApplied, "")

		got := b.waitState(t, held.ID, ledger.StateFailed)
		require.Equal(t, ledger.CodeSuperseded, got.Error.Code)
		require.False(t, got.Error.Retryable)
		require.Contains(t, got.Error.Message, mine.ID)
		after, err := b.fleet.NodeConfig(ctx, second)
		require.NoError(t, err)
		require.Equal(t, before.Desired.Revision, after.Desired.Revision, "the held child wrote no revision")
		require.Equal(t, before.Desired.Hash, after.Desired.Hash)
		require.Equal(t, mine.ID, after.Desired.OperationID)
		require.Equal(t, ledger.StatePending, b.op(t, mine.ID).State, "the later configure still waits for its node")

		done := b.waitState(t, parent.ID, ledger.StateFailed)
		require.Equal(t, &ledger.Counts{Total: 2, Succeeded: 1, Failed: 1}, done.Counts)

		// Submit order, not kind, decides: a fleet.configure submitted
		// later still replaces the node's revision.
		_, _, err = b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindFleetConfigure,
			Targets: nodeTargets(second), Operation: json.RawMessage(`{"format":"f/v1","document":{"fleet":2}}`)})
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			c, err := b.fleet.NodeConfig(ctx, second)
			require.NoError(t, err)
			return c.Desired.Revision == 2
		}, waitLong, tick)
		require.Equal(t, ledger.CodeSuperseded, b.waitState(t, mine.ID, ledger.StateFailed).Error.Code)
	})
}

// The recording of a fleet.configure's children decides each as
// node.configure would, a write lane's children in one transaction (the
// batch of fleet.ConfigureManyTx): a
// new revision for a fresh node and for one whose older configure it
// supersedes, an unchanged applied document succeeded at once, one the node
// reported failed failed at once with its message, a retired node and a
// node whose agent lacks config.v1 refused with their codes.
func TestFleetConfigureReleaseDecidesEachChild(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		b.start(t)
		const doc = `{"format":"f/v1","document":{"same":true}}`
		fresh, _ := b.readyNode(t)
		applied, appliedSess := b.readyNode(t)
		b.configureOp(t, applied, doc)
		b.reportConfig(t, appliedSess, 1, api.ConfigApplied, "")
		failed, failedSess := b.readyNode(t)
		b.configureOp(t, failed, doc)
		b.reportConfig(t, failedSess, 1, api.ConfigFailed, "disk full")
		retired, _ := b.readyNode(t)
		_, err := b.fleet.Retire(ctx, "admin:test", retired, "")
		require.NoError(t, err)
		incapable, _ := b.nodeWith(t, []string{api.CapCommands})
		older, _ := b.readyNode(t)
		olderOp := b.configureOp(t, older, `{"format":"f/v1","document":{"older":true}}`)

		targets := []string{fresh, applied, failed, retired, incapable.NodeID, older}
		parent, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindFleetConfigure,
			Targets: nodeTargets(targets...), Operation: json.RawMessage(`{"format":"f/v1","document":{"same":true},"max_concurrency":6}`)})
		require.NoError(t, err)
		byNode := map[string]ledger.Operation{}
		require.Eventually(t, func() bool {
			for _, ch := range b.children(t, parent.ID) {
				byNode[ch.TargetID] = ch
			}
			if len(byNode) < len(targets) {
				return false
			}
			for _, ch := range byNode {
				if ch.Held {
					return false
				}
			}
			// Let go once its children are recorded.
			return b.op(t, parent.ID).Owner == ""
		}, waitLong, tick)

		require.Equal(t, ledger.StatePending, b.op(t, byNode[fresh].ID).State, "a fresh node's child waits for its node")
		c, err := b.fleet.NodeConfig(ctx, fresh)
		require.NoError(t, err)
		require.Equal(t, int64(1), c.Desired.Revision)

		got := b.waitState(t, byNode[applied].ID, ledger.StateSucceeded)
		var res ledger.ConfigureResult
		require.NoError(t, json.Unmarshal(got.Result, &res))
		require.Equal(t, int64(1), res.Revision, "an unchanged applied document keeps its revision")
		require.Equal(t, api.ConfigApplied, res.State)

		got = b.waitState(t, byNode[failed].ID, ledger.StateFailed)
		require.Equal(t, ledger.CodeConfigFailed, got.Error.Code)
		require.Contains(t, got.Error.Message, "disk full")

		got = b.waitState(t, byNode[retired].ID, ledger.StateFailed)
		require.Equal(t, "node_retired", got.Error.Code)
		got = b.waitState(t, byNode[incapable.NodeID].ID, ledger.StateFailed)
		require.Equal(t, string(errcode.CapabilityMissing), got.Error.Code)
		ic, err := b.fleet.NodeConfig(ctx, incapable.NodeID)
		require.NoError(t, err)
		require.Nil(t, ic.Desired, "a refused child writes nothing")

		got = b.waitState(t, olderOp.ID, ledger.StateFailed)
		require.Equal(t, ledger.CodeSuperseded, got.Error.Code)
		oc, err := b.fleet.NodeConfig(ctx, older)
		require.NoError(t, err)
		require.Equal(t, int64(2), oc.Desired.Revision, "the child's document is the node's next revision")
		require.Equal(t, ledger.StatePending, b.op(t, byNode[older].ID).State)
	})
}
