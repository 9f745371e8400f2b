package ledger_test

import (
	"encoding/json"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/testwait"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// submitted is one submit of submitTogether: what it answered.
type submitted struct {
	op      ledger.Operation
	created bool
	err     error
}

// submitTogether submits subs as an administrator at once, each queued
// behind a transaction that holds the one write lane until all are
// queued, so they run in one batch.
func submitTogether(t *testing.T, b *bundle, subs []ledger.Submission) []submitted {
	t.Helper()
	held, release := make(chan struct{}), make(chan struct{})
	go func() {
		assert.NoError(t, b.fstore.Tx(ctx, func(fleet.Tx) error { close(held); <-release; return nil }))
	}()
	<-held
	out := make([]submitted, len(subs))
	var wg sync.WaitGroup
	for i, sub := range subs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i].op, out[i].created, out[i].err = b.svc.Submit(ctx, admin, sub)
		}()
	}
	testwait.For(t, "the submits to queue", testwait.Patience, func() bool { return b.fstore.GroupStats().Queued == int64(len(subs)) })
	close(release)
	wg.Wait()
	return out
}

func commandSubmission(node, kind, payload string) ledger.Submission {
	return ledger.Submission{RequestID: newRequestID(), Kind: kind,
		Targets: []ledger.Target{{Kind: ledger.TargetNode, ID: node}}, Operation: json.RawMessage(payload)}
}

// Administrators' command submits that meet in one Postgres write batch
// are recorded together, ahead of the batch's other requests, in one
// statement (models: mergeIssues); each answers as it would have alone.
// Anything but the plain case fails that batch, whose requests then run
// again each with its own statements: the refused submit records nothing,
// the others everything, once.
func TestCommandSubmitsShareAStatement(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		pg := db.Dialect == models.Postgres
		// setup answers a store of its own per test: a batch that failed
		// has its lane keep savepoints (no shared statements) until one
		// runs clean.
		setup := func(t *testing.T) *bundle {
			b := newLedger(t, db, newTestKinds(), newClock(), func(s *ledger.Settings) { s.NodeQuota = 2 })
			b.fstore.SetWriteLanes(1) // one queue, so the submits meet in one batch
			return b
		}
		// shared requires that the last batch recorded n submits ahead.
		shared := func(t *testing.T, b *bundle, before models.GroupStats, n int) {
			t.Helper()
			after := b.fstore.GroupStats()
			if !pg {
				require.Zero(t, after.IssueStatements, "SQLite: a request at a time")
				return
			}
			require.Equal(t, before.IssueStatements+1, after.IssueStatements, "one statement for the batch's submits")
			require.Equal(t, before.IssuesMerged+int64(n), after.IssuesMerged)
		}

		t.Run("HandedAndPendingTogether", func(t *testing.T) {
			b := setup(t)
			ids, sessions := b.readyNodes(t, 4)
			polls := map[string]<-chan pollAnswer{}
			for _, id := range ids[:2] {
				require.Empty(t, b.poll(t, sessions[id])) // the read that finds the node quiet
				polls[id] = b.heldPoll(t, ctx, sessions[id])
			}
			var subs []ledger.Submission
			for i, id := range ids {
				kind, payload := ledger.KindNodePrepareImage, prepare
				if i%2 == 1 {
					kind, payload = ledger.KindNodeLaunchWorkload, launch
				}
				subs = append(subs, commandSubmission(id, kind, payload))
			}
			before := b.fstore.GroupStats()
			got := submitTogether(t, b, subs)
			shared(t, b, before, 4)
			require.Equal(t, before.Reruns, b.fstore.GroupStats().Reruns, "the batch ran once")

			cursors := map[int64]bool{}
			for i, id := range ids {
				s := got[i]
				require.NoError(t, s.err)
				require.True(t, s.created)
				require.Equal(t, id, s.op.TargetID)
				stored := b.op(t, s.op.ID)
				require.Equal(t, s.op.Cursor, stored.Cursor, "the answer's cursor is the row's")
				require.False(t, cursors[stored.Cursor])
				cursors[stored.Cursor] = true
				c, err := b.fleet.Command(ctx, s.op.ID)
				require.NoError(t, err)
				require.Equal(t, subs[i].Kind, "node."+c.Kind)
				require.Equal(t, sessions[id].Fencing, c.FencingToken)
				if i < 2 {
					require.Equal(t, ledger.StateRunning, s.op.State, "handed to the held poll")
					require.NotNil(t, s.op.AcceptedAt)
					require.Equal(t, ledger.StateRunning, stored.State)
					require.Equal(t, []string{"submitted", "running"}, eventTypes(t, b, s.op.ID))
					a := receive(t, polls[id])
					require.NoError(t, a.err)
					require.Len(t, a.cmds, 1)
					require.Equal(t, s.op.ID, a.cmds[0].OperationID)
					require.Equal(t, 1, c.DeliveryCount)
				} else {
					require.Equal(t, ledger.StatePending, s.op.State)
					require.Equal(t, ledger.StatePending, stored.State)
					require.Equal(t, []string{"submitted"}, eventTypes(t, b, s.op.ID))
					require.Zero(t, c.DeliveryCount)
					cmds := b.poll(t, sessions[id])
					require.Len(t, cmds, 1)
					require.Equal(t, s.op.ID, cmds[0].OperationID)
				}
			}
		})

		t.Run("ARefusalRunsEachAlone", func(t *testing.T) {
			b := setup(t)
			ids, _ := b.readyNodes(t, 3)
			boot, err := b.fleet.Invite(ctx, "admin:test", fleet.Invite{RentalID: "rack-enrolling-" + b.replica, Generation: 1})
			require.NoError(t, err)
			subs := []ledger.Submission{commandSubmission(boot.NodeID, ledger.KindNodePrepareImage, prepare)}
			for _, id := range ids {
				subs = append(subs, commandSubmission(id, ledger.KindNodePrepareImage, prepare))
			}
			before := b.fstore.GroupStats()
			got := submitTogether(t, b, subs)
			shared(t, b, before, 4)
			if pg {
				require.Equal(t, before.Reruns+1, b.fstore.GroupStats().Reruns, "the refusal ran the batch again")
			}
			requireCode(t, got[0].err, errcode.NodeNotReady)
			_, err = b.store.OperationByRequest(ctx, admin, subs[0].RequestID)
			require.ErrorIs(t, err, ledger.ErrNoRows, "nothing recorded for the refused submit")
			for i, id := range ids {
				s := got[i+1]
				require.NoError(t, s.err)
				require.True(t, s.created)
				pending := b.pendingCommands(t, id)
				require.Len(t, pending, 1, "recorded once")
				require.Equal(t, s.op.ID, pending[0].OperationID)
			}
		})

		t.Run("TwoForOneNodeAreCountedInTurn", func(t *testing.T) {
			b := setup(t)
			// The node quota is 2: one open operation already, so of two
			// submits in one batch the first fits and the second does not.
			ids, _ := b.readyNodes(t, 2)
			b.command(t, ids[0], ledger.KindNodePrepareImage, prepare)
			subs := []ledger.Submission{
				commandSubmission(ids[0], ledger.KindNodePrepareImage, prepare),
				commandSubmission(ids[0], ledger.KindNodePrepareArtifact, `{"artifact_id":"a","url":"https://x.example/a","sha256":"`+zeros64+`"}`),
				commandSubmission(ids[1], ledger.KindNodePrepareImage, prepare),
			}
			before := b.fstore.GroupStats()
			got := submitTogether(t, b, subs)
			shared(t, b, before, 2) // the second for the node runs in its turn
			var ok, over int
			for _, s := range got[:2] {
				if s.err == nil {
					ok++
				} else {
					requireCode(t, s.err, errcode.QuotaExceeded)
					over++
				}
			}
			require.Equal(t, 1, ok, "one fits the node's quota")
			require.Equal(t, 1, over, "the other is counted after it")
			require.NoError(t, got[2].err)
			require.Len(t, b.pendingCommands(t, ids[0]), 2)
		})

		t.Run("AFullNodeIsRefused", func(t *testing.T) {
			b := setup(t)
			// The node quota is 2, and the node has two open operations.
			ids, _ := b.readyNodes(t, 2)
			b.command(t, ids[0], ledger.KindNodePrepareImage, prepare)
			b.command(t, ids[0], ledger.KindNodePrepareImage, prepare)
			before := b.fstore.GroupStats()
			got := submitTogether(t, b, []ledger.Submission{
				commandSubmission(ids[0], ledger.KindNodePrepareImage, prepare),
				commandSubmission(ids[1], ledger.KindNodePrepareImage, prepare),
			})
			shared(t, b, before, 2)
			requireCode(t, got[0].err, errcode.QuotaExceeded)
			require.NoError(t, got[1].err)
			require.Len(t, b.pendingCommands(t, ids[0]), 2, "nothing recorded past the quota")
			require.Len(t, b.pendingCommands(t, ids[1]), 1)
		})

		t.Run("ATakenRequestIDConflicts", func(t *testing.T) {
			b := setup(t)
			ids, _ := b.readyNodes(t, 2)
			a := commandSubmission(ids[0], ledger.KindNodePrepareImage, prepare)
			c := commandSubmission(ids[1], ledger.KindNodePrepareImage, prepare)
			c.RequestID = a.RequestID
			before := b.fstore.GroupStats()
			got := submitTogether(t, b, []ledger.Submission{a, c})
			if pg {
				// The shared statement met the taken key and ran nothing.
				require.Equal(t, before.IssueStatements, b.fstore.GroupStats().IssueStatements)
				require.Equal(t, before.Reruns+1, b.fstore.GroupStats().Reruns)
			}
			var won int
			for _, s := range got {
				if s.err == nil {
					require.True(t, s.created)
					won++
				} else {
					requireCode(t, s.err, errcode.RequestConflict)
				}
			}
			require.Equal(t, 1, won, "one request id, one operation")
			op, err := b.store.OperationByRequest(ctx, admin, a.RequestID)
			require.NoError(t, err)
			for _, id := range ids {
				require.Equal(t, id == op.TargetID, len(b.pendingCommands(t, id)) == 1, "node %s", id)
			}
		})
	})
}

// pendingCommands answers the node's pending commands.
func (b *bundle) pendingCommands(t *testing.T, nodeID string) []fleet.Command {
	t.Helper()
	cmds, err := b.fleet.CommandHistory(ctx, nodeID, fleet.CommandPending, nil, 100)
	require.NoError(t, err)
	return cmds
}
