package models_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// TestLedgerStatesWithoutStateIndexes: no index of operations reads state
// (migration 00017); the statements read ended states through end_state
// (generated from terminal and state) and open ones among the open
// operations. Every state is listed, counted by the overview and swept as
// before, on both dialects, including an operation moved pending → running
// (the first delivery's write) and one ended after that.
func TestLedgerStatesWithoutStateIndexes(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := models.NewLedgerStore(models.NewFleetStore(db, "r1", nil))
		now := t0
		mk := func(i int, channel ledger.Channel) ledger.Operation {
			op := ledger.Operation{
				ID: fmt.Sprintf("op-%02d", i), RequestID: fmt.Sprintf("req-%02d", i), Digest: "d",
				PrincipalKind: ledger.PrincipalAdmin, PrincipalID: "u1", Family: "test", Kind: "test.noop",
				State: ledger.StatePending, Channel: channel, Targets: []ledger.Target{},
				Operation: json.RawMessage(`{}`), CreatedAt: now, Deadline: now.Add(time.Minute), UpdatedAt: now,
			}
			require.NoError(t, s.Insert(ctx, &op))
			return op
		}
		// op-00 pending, op-01 running, op-02..04 ended in each ended
		// state, op-05 pending past its deadline on long_poll.
		want := map[ledger.State][]string{}
		for i, st := range []ledger.State{ledger.StatePending, ledger.StateRunning, ledger.StateSucceeded, ledger.StateFailed, ledger.StateCancelled} {
			op := mk(i, ledger.ChannelLocal)
			if st != ledger.StatePending {
				op.State, op.UpdatedAt = ledger.StateRunning, now
				op.AcceptedAt = &now
				require.NoError(t, s.Tx(ctx, func(tx ledger.Tx) error { return tx.UpdateOperation(ctx, op) }))
			}
			if st.Terminal() {
				op.State, op.FinishedAt = st, &now
				if st == ledger.StateFailed {
					op.Error = &ledger.Error{Code: "boom", Message: "boom"}
				}
				require.NoError(t, s.Tx(ctx, func(tx ledger.Tx) error { return tx.UpdateOperation(ctx, op) }))
			}
			want[st] = []string{op.ID}
		}
		late := mk(5, ledger.ChannelLongPoll)
		want[ledger.StatePending] = []string{late.ID, "op-00"}

		var ended []struct {
			ID       string
			EndState *string
		}
		require.NoError(t, db.Raw("SELECT id, end_state FROM operations ORDER BY id").Scan(&ended).Error)
		for _, e := range ended {
			op, err := s.Operation(ctx, e.ID)
			require.NoError(t, err)
			if op.State.Terminal() {
				require.NotNil(t, e.EndState, e.ID)
				require.Equal(t, string(op.State), *e.EndState, e.ID)
			} else {
				require.Nil(t, e.EndState, "%s is %s", e.ID, op.State)
			}
		}

		for st, ids := range want {
			ops, err := s.List(ctx, ledger.Filter{State: st, Limit: 10})
			require.NoError(t, err)
			var got []string
			for _, o := range ops {
				require.Equal(t, st, o.State)
				got = append(got, o.ID)
			}
			require.Equal(t, ids, got, "list state=%s", st)
		}

		sum, err := s.Summarize(ctx, now.Add(-time.Hour), now.Add(-time.Hour))
		require.NoError(t, err)
		require.Equal(t, map[ledger.State]int64{ledger.StatePending: 2, ledger.StateRunning: 1, ledger.StateSucceeded: 1,
			ledger.StateFailed: 1, ledger.StateCancelled: 1}, sum.RecentByState)
		require.EqualValues(t, 1, sum.Failed)
		open, err := s.CountOpen(ctx)
		require.NoError(t, err)
		require.Equal(t, map[ledger.State]int64{ledger.StatePending: 2, ledger.StateRunning: 1}, open)

		// The deadline sweep takes the late long_poll operation only; the
		// claim takes the pending local one only.
		overdue, err := s.Overdue(ctx, now.Add(2*time.Minute), 10)
		require.NoError(t, err)
		require.Len(t, overdue, 1)
		require.Equal(t, late.ID, overdue[0].ID)
		claimed, err := s.Claim(ctx, "r1", now, 10)
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		require.Equal(t, "op-00", claimed[0].ID)
	})
}
