package models_test

import (
	"encoding/json"
	"testing"
	"time"

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

// TestLedgerStoreRecordsAHandedCommandDelivered: a command handed to a
// poll held at the node's fencing token is recorded delivered to that
// token, its operation running with its event, in the submit's own
// statements (one on Postgres, the operation's insert then the
// command's on SQLite); handed at a token the node no longer has (it re-enrolled
// since the poll came), it is recorded pending and its operation with it,
// nothing half-written; an operation recorded before by a statement of its
// own is made running all the same; both dialects.
func TestLedgerStoreRecordsAHandedCommandDelivered(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		fs := models.NewFleetStore(db, "r1", nil)
		ls := models.NewLedgerStore(fs)
		n := sampleNode("n1", "rent-handed", 1)
		n.State, n.FencingToken = fleet.StateReady, 4
		insert(t, fs, n)
		at := t0.Add(time.Second)
		handed := func(id string, fencing int64, between bool) (fleet.Node, error) {
			o := &ledger.Operation{ID: id, RequestID: "req-" + id, Digest: "d", PrincipalKind: ledger.PrincipalAdmin, PrincipalID: "u1",
				Family: ledger.FamilyCommands, Kind: ledger.KindNodePrepareImage, State: ledger.StatePending, Channel: ledger.ChannelLongPoll,
				Targets: []ledger.Target{{Kind: ledger.TargetNode, ID: "n1"}}, TargetKind: ledger.TargetNode, TargetID: "n1",
				Operation: json.RawMessage(`{"image":"i"}`), CreatedAt: t0, Deadline: t0.Add(1e12), UpdatedAt: t0}
			var node fleet.Node
			err := ls.Tx(ctx, func(tx ledger.Tx) error {
				if err := tx.InsertOperation(ctx, o, ledger.Event{OperationID: id, Type: ledger.EventSubmitted, At: t0}); err != nil {
					return err
				}
				if between {
					if _, err := tx.CountOpenForNode(ctx, "n1", nil); err != nil {
						return err
					}
				}
				var inserted bool
				var err error
				node, inserted, err = tx.Fleet().IssueToNode(ctx, fleet.Command{OperationID: id, NodeID: "n1", Kind: "prepare_image",
					Payload: o.Operation, PayloadDigest: "d", IssuedAt: t0, State: fleet.CommandPending,
					DeliveredFencing: &fencing, FirstDeliveredAt: &at, LastDeliveredAt: &at, DeliveryCount: 1})
				require.True(t, err != nil || inserted, "a ready node takes the command")
				return err
			})
			if err == nil {
				require.NotZero(t, o.Cursor)
			}
			return node, err
		}
		check := func(id string, delivered bool) {
			t.Helper()
			c, err := fs.Command(ctx, id)
			require.NoError(t, err)
			op, err := ls.Operation(ctx, id)
			require.NoError(t, err)
			evs, err := ls.Events(ctx, id, 0, 10)
			require.NoError(t, err)
			var types []string
			for _, e := range evs {
				types = append(types, e.Type)
			}
			require.Equal(t, int64(4), c.FencingToken)
			require.Equal(t, fleet.CommandPending, c.State, "awaiting its settlement either way")
			if !delivered {
				require.Zero(t, c.DeliveryCount)
				require.Nil(t, c.DeliveredFencing)
				require.Nil(t, c.FirstDeliveredAt)
				require.Equal(t, ledger.StatePending, op.State)
				require.Nil(t, op.AcceptedAt)
				require.Equal(t, []string{ledger.EventSubmitted}, types)
				return
			}
			require.Equal(t, 1, c.DeliveryCount)
			require.Equal(t, int64(4), *c.DeliveredFencing)
			require.Equal(t, at, *c.FirstDeliveredAt)
			require.Equal(t, at, *c.LastDeliveredAt)
			require.Equal(t, ledger.StateRunning, op.State)
			require.Equal(t, at, *op.AcceptedAt)
			require.Equal(t, []string{ledger.EventSubmitted, ledger.EventRunning}, types)
			require.JSONEq(t, `{"channel":"long_poll"}`, string(evs[1].Data))
		}

		got, err := handed("a", 4, false)
		require.NoError(t, err)
		require.Equal(t, int64(4), got.FencingToken)
		check("a", true)

		got, err = handed("b", 3, false)
		require.NoError(t, err)
		require.Equal(t, int64(4), got.FencingToken, "the token under the lock tells the caller it was not handed")
		check("b", false)

		_, err = handed("c", 4, true)
		require.NoError(t, err)
		check("c", true)

		_, err = handed("a", 4, false)
		require.ErrorIs(t, err, ledger.ErrDuplicate, "a taken id, handed")
		_, err = handed("a", 3, false)
		require.ErrorIs(t, err, ledger.ErrDuplicate, "a taken id, handed at a stale token")
	})
}
