package models_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// TestPostgresClaimsAreHOTUpdates: a claim rewrites only a command's
// unindexed delivery columns, and the commands table keeps room on its
// pages (migration 00015), so claims are HOT updates (no index entries
// written). Counted by the server (pg_stat_user_tables) on one connection,
// whose statistics it flushes before reading them.
// openOneConnection opens a fresh, migrated Postgres database whose pool
// holds one connection, so the statistics its statements leave can be
// flushed (pg_stat_force_next_flush) before they are read.
func openOneConnection(t *testing.T) *models.DB {
	t.Helper()
	opts := dbtest.Options(t, models.Postgres)
	opts.MaxOpenConns = 1
	db, err := models.Open(context.Background(), opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	require.NoError(t, db.Migrate(context.Background()))
	return db
}

func TestPostgresClaimsAreHOTUpdates(t *testing.T) {
	db := openOneConnection(t)
	s := models.NewFleetStore(db, "r1", nil)
	n := sampleNode("hot", "rent-hot", 1)
	n.State = fleet.StateReady
	insert(t, s, n)

	const cmds = 400
	payload := json.RawMessage(fmt.Sprintf(`{"image":"registry.example.com/team/app:%s"}`, "v1"))
	for i := range cmds {
		at := t0.Add(time.Duration(i) * time.Second)
		c := fleet.Command{OperationID: fmt.Sprintf("hot-%04d", i), NodeID: "hot", Kind: "prepare_image", Payload: payload,
			PayloadDigest: "d", FencingToken: 1, IssuedAt: at, State: fleet.CommandPending}
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error { return tx.InsertCommand(ctx, c) }))
		// A few commands wait while the oldest is claimed and settled.
		if i < 3 {
			continue
		}
		var got []fleet.Command
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
			var err error
			_, got, err = tx.ClaimDue(ctx, fleet.Due{NodeID: "hot", Fencing: 1, Now: at, RedeliverBefore: at.Add(-time.Minute), Limit: 1})
			return err
		}))
		require.Len(t, got, 1)
		c = got[0]
		c.State, c.SettledAt = fleet.CommandApplied, &at
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error { _, err := tx.SettleCommands(ctx, []fleet.Command{c}); return err }))
	}
	require.NoError(t, db.Exec("SELECT pg_stat_force_next_flush()").Error)
	var st struct{ Upd, Hot int64 }
	require.NoError(t, db.Exec("SELECT pg_stat_clear_snapshot()").Error)
	require.NoError(t, db.Raw(`SELECT n_tup_upd AS upd, n_tup_hot_upd AS hot FROM pg_stat_user_tables
		WHERE relid = 'commands'::regclass`).Scan(&st).Error)
	claims := int64(cmds - 3)
	t.Logf("commands: %d updates (%d claims, %d settlements), %d HOT", st.Upd, claims, claims, st.Hot)
	require.Equal(t, 2*claims, st.Upd, "the statistics are flushed")
	require.GreaterOrEqual(t, st.Hot, claims*95/100, "claims are HOT updates (without room on the page: 89 %)")
}
