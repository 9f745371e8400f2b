package models_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
	"github.com/nodeward/nodeward/secrets"
)

// TestFanOutCommandsShareTheirPayload: commands inserted together (a
// fan-out's release) store each payload of at least 1 KiB once and name
// it (migration 00032); every read answers the payload whole, from the
// database as well as from the cache; a small payload stays in its row;
// an update and a settlement leave the sharing as it was. A stored payload
// is stamped again only when its stamp is an hour old, and retention keeps
// it while a command names it.
func TestFanOutCommandsShareTheirPayload(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := models.NewFleetStore(db, "r1", nil)
		insert(t, s, sampleNode("n1", "r1", 1), sampleNode("n2", "r2", 1), sampleNode("n3", "r3", 1))
		big := json.RawMessage(fmt.Sprintf(`{"attempt_id":"1","command":"true","env":{"PAD":%q,"TOKEN":"%sabc"},"run_id":"run-1"}`,
			strings.Repeat("x", models.SharedBodyMin), secrets.HandlePrefix))
		small := json.RawMessage(`{"attempt_id":"1","command":"true","run_id":"run-2"}`)
		cmd := func(id, node string, payload json.RawMessage, at time.Time) fleet.Command {
			return fleet.Command{OperationID: id, NodeID: node, Kind: "launch_workload", Payload: payload, PayloadDigest: "d-" + id,
				FencingToken: 1, IssuedAt: at, State: fleet.CommandPending}
		}
		record := func(cs ...fleet.Command) {
			t.Helper()
			require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error { return tx.InsertCommands(ctx, cs) }))
		}
		record(cmd("c1", "n1", big, t0), cmd("c2", "n2", big, t0), cmd("c3", "n3", big, t0), cmd("c4", "n1", small, t0))

		count := func(q string, args ...any) int64 {
			t.Helper()
			var n int64
			require.NoError(t, db.Raw(q, args...).Scan(&n).Error)
			return n
		}
		require.EqualValues(t, 1, count(`SELECT COUNT(*) FROM operation_bodies WHERE body = ?`, string(big)), "one stored copy")
		require.EqualValues(t, 3, count(`SELECT COUNT(*) FROM commands WHERE payload = '' AND payload_body IS NOT NULL`))
		require.EqualValues(t, 1, count(`SELECT COUNT(*) FROM commands WHERE payload_body IS NULL AND payload = ?`, string(small)),
			"a small payload stays in its row")

		want := map[string]json.RawMessage{"c1": big, "c2": big, "c3": big, "c4": small}
		check := func(cs ...fleet.Command) {
			t.Helper()
			require.NotEmpty(t, cs)
			for _, c := range cs {
				require.Equal(t, string(want[c.OperationID]), string(c.Payload), c.OperationID)
			}
		}
		for pass, cached := range []bool{false, true} {
			t.Run(fmt.Sprintf("cached=%v", cached), func(t *testing.T) {
				forget := func() {
					if !cached {
						models.ForgetBodies()
					}
				}
				forget()
				c, err := s.Command(ctx, "c2")
				require.NoError(t, err)
				check(c)
				forget()
				cs, err := s.Commands(ctx, "n1", "", 0)
				require.NoError(t, err)
				require.Len(t, cs, 2)
				check(cs...)
				forget()
				cs, err = s.CommandHistory(ctx, "n1", "", nil, 10)
				require.NoError(t, err)
				check(cs...)
				forget()
				launches, err := s.LaunchCommands(ctx, "n1", "run-1", "1")
				require.NoError(t, err)
				require.Equal(t, []string{"c1"}, launches, "a shared payload's handle is found")
				forget()
				require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
					locked, err := tx.LockCommands(ctx, []string{"c1", "c3", "c4"})
					for _, c := range locked {
						check(c)
					}
					require.Len(t, locked, 3)
					return err
				}))
				forget()
				// Each pass claims past the last one's visibility timeout.
				now := t0.Add(time.Hour + time.Duration(pass)*2*time.Minute)
				require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
					_, cs, err := tx.ClaimDue(ctx, fleet.Due{NodeID: "n3", Fencing: 1, Now: now, RedeliverBefore: now.Add(-time.Minute), Limit: 10})
					require.Len(t, cs, 1)
					check(cs...)
					return err
				}))
			})
		}

		// An update and a settlement write the command's own columns.
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
			c, err := tx.LockCommand(ctx, "c1")
			if err != nil {
				return err
			}
			c.DeliveryCount++
			if err := tx.UpdateCommand(ctx, c); err != nil {
				return err
			}
			locked, err := tx.LockCommands(ctx, []string{"c2"})
			if err != nil {
				return err
			}
			c2 := locked["c2"]
			c2.State, c2.SettledAt = fleet.CommandApplied, &t0
			_, err = tx.SettleCommands(ctx, []fleet.Command{c2})
			return err
		}))
		require.EqualValues(t, 3, count(`SELECT COUNT(*) FROM commands WHERE payload = '' AND payload_body IS NOT NULL`))
		models.ForgetBodies()
		for _, id := range []string{"c1", "c2"} {
			c, err := s.Command(ctx, id)
			require.NoError(t, err)
			check(c)
		}

		// A stored payload named again is stamped again only once its stamp
		// is an hour old: concurrent lanes naming it take no lock on it.
		stamp := func() time.Time {
			t.Helper()
			var at time.Time
			require.NoError(t, db.Raw(`SELECT used_at FROM operation_bodies`).Row().Scan(&at))
			return at.UTC()
		}
		first := stamp()
		insert(t, s, sampleNode("n4", "r4", 1), sampleNode("n5", "r5", 1))
		record(cmd("c5", "n4", big, first.Add(59*time.Minute)))
		require.True(t, first.Equal(stamp()), "stamped within the hour: left as it is")
		later := first.Add(61 * time.Minute)
		record(cmd("c6", "n5", big, later))
		require.True(t, later.Equal(stamp()), "stamped over an hour ago: stamped again")
		require.EqualValues(t, 1, count(`SELECT COUNT(*) FROM operation_bodies`))

		// Retention keeps the payload while a command names it, however old
		// its stamp, and deletes it with the last one.
		ls := models.NewLedgerStore(s)
		_, _, _, err := ls.Prune(ctx, later.Add(48*time.Hour), later, 100)
		require.NoError(t, err)
		require.EqualValues(t, 1, count(`SELECT COUNT(*) FROM operation_bodies`), "named by commands")
		require.NoError(t, db.Exec(`DELETE FROM commands`).Error)
		_, _, _, err = ls.Prune(ctx, later.Add(48*time.Hour), later, 100)
		require.NoError(t, err)
		require.Zero(t, count(`SELECT COUNT(*) FROM operation_bodies`))
	})
}
