package models_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// TestFanOutChildrenShareTheirOperation: children recorded together with
// one large operation store it once (operation_bodies), their rows name
// it, and every read answers each child's operation whole, from the
// database as well as from the cache; small operations stay in their
// rows. Retention deletes a stored operation only with the last row that
// names it, and not one a newer fan-out used.
func TestFanOutChildrenShareTheirOperation(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := models.NewLedgerStore(models.NewFleetStore(db, "r1", nil))
		now := t0
		doc := func(tag string) json.RawMessage {
			return json.RawMessage(fmt.Sprintf(`{"format":"t/v1","document":{"tag":%q,"pad":%q}}`, tag, strings.Repeat("x", models.SharedBodyMin)))
		}
		big, other, small := doc("a"), doc("b"), json.RawMessage(`{"format":"t/v1","document":{}}`)
		mk := func(i int, parent string, body json.RawMessage) ledger.Operation {
			return fanOutChild(fmt.Sprintf("ch-%02d", i), parent, i, body, now)
		}
		want := map[string]json.RawMessage{}
		var first []ledger.Operation
		for i, body := range []json.RawMessage{big, big, big, small, small, other, big} {
			op := mk(i, "p1", body)
			first = append(first, op)
			want[op.ID] = body
		}
		require.NoError(t, s.Tx(ctx, func(tx ledger.Tx) error { return tx.InsertOperations(ctx, first, nil) }))

		var stored []struct {
			Digest string
			Body   string
		}
		require.NoError(t, db.Raw("SELECT digest, body FROM operation_bodies ORDER BY body").Scan(&stored).Error)
		require.Len(t, stored, 2, "one stored copy of each large operation")
		require.Equal(t, string(big), stored[0].Body)
		require.Equal(t, string(other), stored[1].Body)
		var inRows int64
		require.NoError(t, db.Raw("SELECT COALESCE(SUM(LENGTH(operation)), 0) FROM operations WHERE body_digest IS NOT NULL").Scan(&inRows).Error)
		require.Zero(t, inRows, "rows naming a stored operation hold none of it")
		var inline int64
		require.NoError(t, db.Raw("SELECT COUNT(*) FROM operations WHERE body_digest IS NULL AND operation = ?", string(small)).Scan(&inline).Error)
		require.EqualValues(t, 2, inline, "small operations stay in their rows")

		check := func(ops []ledger.Operation, n int) {
			t.Helper()
			require.Len(t, ops, n)
			for _, op := range ops {
				require.JSONEq(t, string(want[op.ID]), string(op.Operation), op.ID)
			}
		}
		for _, cached := range []bool{false, true} {
			if !cached {
				models.ForgetBodies()
			}
			listed, err := s.List(ctx, ledger.Filter{ParentID: "p1", Limit: 100})
			require.NoError(t, err)
			check(listed, len(first))
			models.ForgetBodies()
			one, err := s.Operation(ctx, "ch-06")
			require.NoError(t, err)
			check([]ledger.Operation{one}, 1)
			models.ForgetBodies()
			require.NoError(t, s.Tx(ctx, func(tx ledger.Tx) error {
				locked, err := tx.LockOperations(ctx, []string{"ch-00", "ch-03", "ch-05"})
				check(locked, 3)
				return err
			}))
			models.ForgetBodies()
			require.NoError(t, s.Tx(ctx, func(tx ledger.Tx) error {
				released, err := tx.ReleaseHeld(ctx, "p1", 100, now)
				if cached {
					check(released, 0) // released by the first pass
				} else {
					check(released, len(first))
				}
				return err
			}))
		}

		// A second fan-out, later, of the same large operation: the stored
		// copy is used again, not stored twice.
		later := now.Add(48 * time.Hour)
		second := mk(10, "p2", big)
		second.CreatedAt, second.UpdatedAt = later, later
		require.NoError(t, s.Tx(ctx, func(tx ledger.Tx) error { return tx.InsertOperations(ctx, []ledger.Operation{second}, nil) }))
		var n int64
		require.NoError(t, db.Raw("SELECT COUNT(*) FROM operation_bodies").Scan(&n).Error)
		require.EqualValues(t, 2, n)

		// Every child of the first fan-out ends; retention past their end
		// deletes them and the operation only they named, and keeps the
		// one the second fan-out names.
		for _, op := range first {
			op.Held, op.State, op.FinishedAt, op.UpdatedAt = false, ledger.StateSucceeded, &now, now
			require.NoError(t, s.Tx(ctx, func(tx ledger.Tx) error { return tx.UpdateOperation(ctx, op) }))
		}
		_, _, _, err := s.Prune(ctx, now.Add(24*time.Hour), now, 100)
		require.NoError(t, err)
		stored = nil
		require.NoError(t, db.Raw("SELECT digest, body FROM operation_bodies").Scan(&stored).Error)
		require.Len(t, stored, 1)
		require.Equal(t, string(big), stored[0].Body, "still named by the second fan-out's child")
		models.ForgetBodies()
		got, err := s.Operation(ctx, second.ID)
		require.NoError(t, err)
		require.JSONEq(t, string(big), string(got.Operation))

		// Once that child is pruned too, so is its operation; but not
		// while a fan-out used it after the cut-off.
		second.State, second.FinishedAt = ledger.StateSucceeded, &later
		require.NoError(t, s.Tx(ctx, func(tx ledger.Tx) error { return tx.UpdateOperation(ctx, second) }))
		_, _, _, err = s.Prune(ctx, later, now, 100)
		require.NoError(t, err)
		require.NoError(t, db.Raw("SELECT COUNT(*) FROM operation_bodies").Scan(&n).Error)
		require.EqualValues(t, 1, n, "used at the cut-off, not before it")
		_, _, _, err = s.Prune(ctx, later.Add(time.Second), now, 100)
		require.NoError(t, err)
		require.NoError(t, db.Raw("SELECT COUNT(*) FROM operation_bodies").Scan(&n).Error)
		require.Zero(t, n)
	})
}

// fanOutChild is the i-th child of parent, held, carrying body, recorded
// at at.
func fanOutChild(id, parent string, i int, body json.RawMessage, at time.Time) ledger.Operation {
	return ledger.Operation{
		ID: id, RequestID: fmt.Sprintf("%s:%d", parent, i), Digest: "d",
		PrincipalKind: ledger.PrincipalAdmin, PrincipalID: "u1", Family: "test", Kind: "test.noop",
		State: ledger.StatePending, Channel: ledger.ChannelLocal, ParentID: parent, Held: true,
		Targets: []ledger.Target{}, Operation: body, CreatedAt: at, Deadline: at.Add(time.Minute), UpdatedAt: at,
	}
}

// TestRetentionKeepsABodyAFanOutIsNaming: retention on one replica runs
// while a fan-out on another names a stored operation no row named any
// more, in a transaction not yet committed. On Postgres the retention's
// delete waits for that transaction's row lock (checked in
// pg_stat_activity) and then must see the body used again; on SQLite the
// one writer runs them in turn. Either way the body stays and the new
// child reads whole.
func TestRetentionKeepsABodyAFanOutIsNaming(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s1 := models.NewLedgerStore(models.NewFleetStore(db, "r1", nil))
		s2 := models.NewLedgerStore(models.NewFleetStore(db, "r2", nil))
		body := json.RawMessage(fmt.Sprintf(`{"pad":%q}`, strings.Repeat("y", models.SharedBodyMin)))
		child := func(id, parent string, at time.Time) ledger.Operation { return fanOutChild(id, parent, 0, body, at) }
		// A fan-out long ago stored the body; its children are gone.
		require.NoError(t, s1.Tx(ctx, func(tx ledger.Tx) error {
			return tx.InsertOperations(ctx, []ledger.Operation{child("old-child", "old-parent", t0)}, nil)
		}))
		require.NoError(t, db.Exec("DELETE FROM operations WHERE parent_id = 'old-parent'").Error)

		later := t0.Add(48 * time.Hour)
		named, release, committed := make(chan struct{}), make(chan struct{}), make(chan error, 1)
		var releaseOnce sync.Once
		letGo := func() { releaseOnce.Do(func() { close(release) }) }
		defer letGo() // a failure below must not leave the transaction open
		go func() {
			committed <- s1.Tx(ctx, func(tx ledger.Tx) error {
				if err := tx.InsertOperations(ctx, []ledger.Operation{child("new-child", "new-parent", later)}, nil); err != nil {
					return err
				}
				close(named)
				<-release
				return nil
			})
		}()
		<-named
		pruned := make(chan error, 1)
		go func() {
			// The cut-off falls between the body's first use and this one.
			_, _, _, err := s2.Prune(ctx, t0.Add(24*time.Hour), t0, 100)
			pruned <- err
		}()
		if db.Dialect == models.Postgres {
			require.Eventually(t, func() bool {
				var waiting int64
				require.NoError(t, db.Raw(`SELECT COUNT(*) FROM pg_stat_activity
					WHERE wait_event_type = 'Lock' AND query LIKE 'DELETE FROM operation_bodies%'`).Scan(&waiting).Error)
				return waiting > 0
			}, 10*time.Second, 5*time.Millisecond, "retention's delete waits for the fan-out's lock")
		}
		letGo()
		require.NoError(t, <-committed)
		require.NoError(t, <-pruned)

		var n int64
		require.NoError(t, db.Raw("SELECT COUNT(*) FROM operation_bodies").Scan(&n).Error)
		require.EqualValues(t, 1, n, "the body the new child names is kept")
		models.ForgetBodies()
		got, err := s1.Operation(ctx, "new-child")
		require.NoError(t, err)
		require.JSONEq(t, string(body), string(got.Operation))
	})
}
