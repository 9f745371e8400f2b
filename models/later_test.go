package models_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// TestLedgerStoreRecordsACommandsOperationWithItsCommand: a command kind's
// operation is recorded with its command (one statement on Postgres), with
// its events and cursor; a taken operation id or request id is the
// ledger's ErrDuplicate; a statement other than the command's insert, or
// none, still finds the operation recorded before it; both dialects.
func TestLedgerStoreRecordsACommandsOperationWithItsCommand(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		fs := models.NewFleetStore(db, "r1", nil)
		ls := models.NewLedgerStore(fs)
		n := sampleNode("n1", "rent-later", 1)
		n.State = fleet.StateReady
		insert(t, fs, n)
		op := func(id, request string) *ledger.Operation {
			return &ledger.Operation{ID: id, RequestID: request, Digest: "d", PrincipalKind: ledger.PrincipalAdmin, PrincipalID: "u1",
				Family: ledger.FamilyCommands, Kind: ledger.KindNodePrepareImage, State: ledger.StatePending, Channel: ledger.ChannelLongPoll,
				Targets: []ledger.Target{{Kind: ledger.TargetNode, ID: "n1"}}, TargetKind: ledger.TargetNode, TargetID: "n1",
				Operation: json.RawMessage(`{"image":"i"}`), CreatedAt: t0, Deadline: t0.Add(1e12), UpdatedAt: t0}
		}
		submitted := func(id string) ledger.Event {
			return ledger.Event{OperationID: id, Type: ledger.EventSubmitted, At: t0, Data: json.RawMessage(`{}`)}
		}
		issue := func(o *ledger.Operation, then func(tx ledger.Tx) error) error {
			return ls.Tx(ctx, func(tx ledger.Tx) error {
				if err := tx.InsertOperation(ctx, o, submitted(o.ID)); err != nil {
					return err
				}
				if then != nil {
					return then(tx)
				}
				_, _, err := tx.Fleet().IssueToNode(ctx, fleet.Command{OperationID: o.ID, NodeID: "n1", Kind: "prepare_image",
					Payload: o.Operation, PayloadDigest: "d", IssuedAt: t0, State: fleet.CommandPending})
				return err
			})
		}

		a := op("a", "req-a")
		require.NoError(t, issue(a, nil))
		require.NotZero(t, a.Cursor)
		got, err := ls.Operation(ctx, "a")
		require.NoError(t, err)
		require.Equal(t, a.Cursor, got.Cursor)
		evs, err := ls.Events(ctx, "a", 0, 10)
		require.NoError(t, err)
		require.Len(t, evs, 1)
		_, err = fs.Command(ctx, "a")
		require.NoError(t, err)

		require.ErrorIs(t, issue(op("a", "req-other"), nil), ledger.ErrDuplicate, "a taken operation id")
		require.ErrorIs(t, issue(op("b", "req-a"), nil), ledger.ErrDuplicate, "a taken request id")
		_, err = ls.Operation(ctx, "b")
		require.ErrorIs(t, err, ledger.ErrNoRows)

		c := op("c", "req-c")
		require.NoError(t, issue(c, func(tx ledger.Tx) error {
			n, err := tx.CountOpenForNode(ctx, "n1", nil)
			require.Equal(t, 2, n, "the operation is recorded before the next statement")
			return err
		}))
		require.NotZero(t, c.Cursor)
		err = issue(op("c", "req-c2"), func(tx ledger.Tx) error {
			_, err := tx.CountOpenForNode(ctx, "n1", nil)
			return err
		})
		require.ErrorIs(t, err, ledger.ErrDuplicate, "the next statement answers the insert's refusal")
		d := op("d", "req-d")
		require.NoError(t, issue(d, func(ledger.Tx) error { return nil }))
		require.NotZero(t, d.Cursor, "recorded with nothing after it")
		_, err = ls.Operation(ctx, "d")
		require.NoError(t, err)
	})
}
