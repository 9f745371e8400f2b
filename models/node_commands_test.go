package models_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/secrets"
)

// TestNodeCommandsAcrossBothIndexes: a node's commands live in two partial
// indexes (pending, settled: migration 00021); the reads of any state
// merge them oldest first and stop at the limit, the reads of one state
// answer that state only, and the reconciliation's applied ids and the
// output scrubber's launches find pending and settled commands alike.
func TestNodeCommandsAcrossBothIndexes(t *testing.T) {
	withStore(t, func(t *testing.T, s *models.FleetStore, rec *recorder) {
		insert(t, s, sampleNode("n1", "rent", 1))
		insert(t, s, sampleNode("n2", "rent2", 1))
		launch := func(attempt string) json.RawMessage {
			return json.RawMessage(fmt.Sprintf(`{"run_id":"r","attempt_id":%q,"env":{"K":%q}}`, attempt, secrets.HandlePrefix+"x"))
		}
		// Oldest first: c0 applied launch (attempt 1), c1 pending stop,
		// c2 refused stop, c3 pending launch (attempt 1), c4 applied
		// launch (attempt 2), c5 applied stop; n2 has one of its own.
		specs := []struct {
			state   fleet.CommandState
			kind    string
			payload json.RawMessage
		}{
			{fleet.CommandApplied, "launch_workload", launch("1")},
			{fleet.CommandPending, "stop_workload", json.RawMessage(`{}`)},
			{fleet.CommandRefused, "stop_workload", json.RawMessage(`{}`)},
			{fleet.CommandPending, "launch_workload", launch("1")},
			{fleet.CommandApplied, "launch_workload", launch("2")},
			{fleet.CommandApplied, "stop_workload", json.RawMessage(`{}`)},
		}
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
			for i, sp := range specs {
				c := fleet.Command{OperationID: fmt.Sprintf("c%d", i), NodeID: "n1", Kind: sp.kind, Payload: sp.payload, PayloadDigest: "d",
					FencingToken: 1, IssuedAt: t0.Add(time.Duration(i) * time.Second), State: fleet.CommandPending}
				if err := tx.InsertCommand(ctx, c); err != nil {
					return err
				}
				if sp.state != fleet.CommandPending {
					c.State, c.SettledAt = sp.state, &t0
					if err := tx.UpdateCommand(ctx, c); err != nil {
						return err
					}
				}
			}
			return tx.InsertCommand(ctx, fleet.Command{OperationID: "other", NodeID: "n2", Kind: "launch_workload", Payload: launch("1"),
				PayloadDigest: "d", FencingToken: 1, IssuedAt: t0, State: fleet.CommandPending})
		}))
		ids := func(cs []fleet.Command, err error) []string {
			require.NoError(t, err)
			out := []string{}
			for _, c := range cs {
				out = append(out, c.OperationID)
			}
			return out
		}
		require.Equal(t, []string{"c0", "c1", "c2", "c3", "c4", "c5"}, ids(s.Commands(ctx, "n1", "", 0)))
		require.Equal(t, []string{"c0", "c1", "c2", "c3"}, ids(s.Commands(ctx, "n1", "", 4)))
		require.Equal(t, []string{"c1", "c3"}, ids(s.Commands(ctx, "n1", fleet.CommandPending, 0)))
		require.Equal(t, []string{"c0", "c4"}, ids(s.Commands(ctx, "n1", fleet.CommandApplied, 2)))
		require.Equal(t, []string{"c2"}, ids(s.Commands(ctx, "n1", fleet.CommandRefused, 0)))
		// The history: newest first, paged by the last key of a page.
		require.Equal(t, []string{"c5", "c4", "c3"}, ids(s.CommandHistory(ctx, "n1", "", nil, 3)))
		c3 := fleet.CommandKey{IssuedAt: t0.Add(3 * time.Second), OperationID: "c3"}
		require.Equal(t, []string{"c2", "c1", "c0"}, ids(s.CommandHistory(ctx, "n1", "", &c3, 3)))
		require.Equal(t, []string{"c4", "c0"}, ids(s.CommandHistory(ctx, "n1", fleet.CommandApplied, &fleet.CommandKey{IssuedAt: t0.Add(5 * time.Second), OperationID: "c5"}, 3)))
		require.Equal(t, []string{"c1"}, ids(s.CommandHistory(ctx, "n1", fleet.CommandPending, &c3, 3)))
		// Two commands issued in the same microsecond are told apart by id.
		require.Equal(t, []string{"c2"}, ids(s.CommandHistory(ctx, "n1", "", &fleet.CommandKey{IssuedAt: t0.Add(2 * time.Second), OperationID: "c3"}, 1)))
		applied, err := s.AppliedOperationIDs(ctx, "n1")
		require.NoError(t, err)
		require.Equal(t, []string{"c0", "c4", "c5"}, applied)
		launches, err := s.LaunchCommands(ctx, "n1", "r", "1")
		require.NoError(t, err)
		require.Equal(t, []string{"c0", "c3"}, launches, "settled and pending launches of the attempt")
	})
}
