package models_test

import (
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// TestSettlePending: the settlement a node's results ask for is written
// only to the node's pending commands; every command asked for is
// answered as found (another node's, one settled before), an unknown one
// is absent; the answer says whether the node has another pending
// command. On Postgres, where the statement also locks another lane's
// command, the request strays and runs again alone.
func TestSettlePending(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := models.NewFleetStore(db, "r1", nil)
		const lanes = 4
		s.SetWriteLanes(lanes)
		own := "sp-node"
		other := ""
		for i := 0; other == ""; i++ {
			if id := fmt.Sprintf("sp-other-%d", i); models.LaneOf(id, lanes) != models.LaneOf(own, lanes) {
				other = id
			}
		}
		insert(t, s, sampleNode(own, "sp-r1", 1), sampleNode(other, "sp-r2", 1))
		command := func(op, node string, st fleet.CommandState) fleet.Command {
			c := fleet.Command{OperationID: op, NodeID: node, Kind: "launch_workload", Payload: json.RawMessage(`{}`),
				PayloadDigest: "d", FencingToken: 1, IssuedAt: t0, State: st}
			if st == fleet.CommandRefused {
				c.FailureCode, c.FailureMessage, c.SettledAt = "node_retired", "retired", tp(t0)
			}
			return c
		}
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
			return tx.InsertCommands(ctx, []fleet.Command{command("sp-a", own, fleet.CommandPending),
				command("sp-b", own, fleet.CommandPending), command("sp-done", own, fleet.CommandRefused),
				command("sp-left", own, fleet.CommandPending), command("sp-x", other, fleet.CommandPending)})
		}))
		settle := func(ss ...fleet.Settlement) ([]fleet.SettleFound, bool) {
			var found []fleet.SettleFound
			var left bool
			require.NoError(t, s.Tx(fleet.OnNode(ctx, own), func(tx fleet.Tx) error {
				var err error
				found, left, err = tx.SettlePending(ctx, own, t0.Add(time.Hour), ss)
				return err
			}))
			sort.Slice(found, func(i, j int) bool { return found[i].OperationID < found[j].OperationID })
			return found, left
		}
		strays := s.GroupStats().Strays
		found, left := settle(
			fleet.Settlement{OperationID: "sp-x", State: fleet.CommandApplied},
			fleet.Settlement{OperationID: "sp-b", State: fleet.CommandRefused, FailureCode: "refused_by_node", FailureMessage: "pull failed"},
			fleet.Settlement{OperationID: "sp-missing", State: fleet.CommandApplied},
			fleet.Settlement{OperationID: "sp-a", State: fleet.CommandApplied, Duplicate: true},
			fleet.Settlement{OperationID: "sp-done", State: fleet.CommandApplied},
		)
		require.Equal(t, []fleet.SettleFound{
			{OperationID: "sp-a", NodeID: own, Kind: "launch_workload", State: fleet.CommandPending, Settled: true},
			{OperationID: "sp-b", NodeID: own, Kind: "launch_workload", State: fleet.CommandPending, Settled: true},
			{OperationID: "sp-done", NodeID: own, Kind: "launch_workload", State: fleet.CommandRefused, FailureCode: "node_retired"},
			{OperationID: "sp-x", NodeID: other, Kind: "launch_workload", State: fleet.CommandPending},
		}, found)
		require.True(t, left, "sp-left is pending")
		if db.Dialect == models.Postgres {
			require.Equal(t, strays+1, s.GroupStats().Strays, "another lane's command locked: ran again alone")
		}
		get := func(op string) fleet.Command {
			c, err := s.Command(ctx, op)
			require.NoError(t, err)
			return c
		}
		a, b := get("sp-a"), get("sp-b")
		require.Equal(t, fleet.CommandApplied, a.State)
		require.Empty(t, a.FailureCode)
		require.Equal(t, t0.Add(time.Hour), *a.SettledAt)
		require.Equal(t, fleet.CommandRefused, b.State)
		require.Equal(t, "refused_by_node", b.FailureCode)
		require.Equal(t, "pull failed", b.FailureMessage)
		require.Equal(t, command("sp-done", own, fleet.CommandRefused).FailureMessage, get("sp-done").FailureMessage)
		require.Equal(t, t0, *get("sp-done").SettledAt, "settled before: unchanged")
		require.Equal(t, fleet.CommandPending, get("sp-x").State, "another node's: unchanged")

		found, left = settle(fleet.Settlement{OperationID: "sp-left", State: fleet.CommandApplied})
		require.Len(t, found, 1)
		require.True(t, found[0].Settled)
		require.False(t, left, "nothing pending left")

		// Two replicas settle overlapping sets of one node's commands at
		// once, in opposite orders: each command is settled by one call.
		s2 := models.NewFleetStore(db, "r2", nil)
		const n = 30
		var cs []fleet.Command
		for i := range n {
			cs = append(cs, command(fmt.Sprintf("sp-c%02d", i), own, fleet.CommandPending))
		}
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error { return tx.InsertCommands(ctx, cs) }))
		var mu sync.Mutex
		settled := map[string]int{}
		var errs []error
		var wg sync.WaitGroup
		for w, st := range []*models.FleetStore{s, s2, s, s2} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := 0; k < n; k += 5 {
					var ss []fleet.Settlement
					for j := range 10 {
						i := (k + j) % n
						if w%2 == 1 {
							i = n - 1 - i
						}
						ss = append(ss, fleet.Settlement{OperationID: cs[i].OperationID, State: fleet.CommandApplied})
					}
					var found []fleet.SettleFound
					err := st.Tx(fleet.OnNode(ctx, own), func(tx fleet.Tx) error {
						var err error
						found, _, err = tx.SettlePending(ctx, own, time.Now(), ss)
						return err
					})
					mu.Lock()
					if err != nil {
						errs = append(errs, err)
					}
					for _, f := range found {
						if f.Settled {
							settled[f.OperationID]++
						}
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		require.Empty(t, errs)
		require.Len(t, settled, n)
		for op, k := range settled {
			require.Equal(t, 1, k, "%s settled once", op)
			require.Equal(t, fleet.CommandApplied, get(op).State)
		}
	})
}
