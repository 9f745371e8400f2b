package models_test

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// TestFleetStoreSummarize: the overview's counts — nodes by state, ready
// nodes whose lease ends before the lapse time, unsettled commands, and
// commands refused since the window's start — and the nodes listing's
// lease filter that the lapsing count links to.
func TestFleetStoreSummarize(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := models.NewFleetStore(db, "r1", nil)
		node := func(id string, st fleet.State, lease *time.Time) fleet.Node {
			n := sampleNode(id, "rent-"+id, 1)
			n.State, n.LeaseExpiresAt = st, lease
			return n
		}
		insert(t, s,
			node("soon", fleet.StateReady, tp(t0.Add(10*time.Second))),
			node("later", fleet.StateReady, tp(t0.Add(80*time.Second))),
			node("lost", fleet.StateLost, tp(t0.Add(-time.Minute))),
			node("new", fleet.StateEnrolling, nil),
		)
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
			for i, c := range []struct {
				state   fleet.CommandState
				settled *time.Time
			}{
				{fleet.CommandPending, nil},
				{fleet.CommandPending, nil},
				{fleet.CommandRefused, tp(t0.Add(-time.Hour))},
				{fleet.CommandRefused, tp(t0.Add(-48 * time.Hour))},
				{fleet.CommandApplied, tp(t0)},
			} {
				err := tx.InsertCommand(ctx, fleet.Command{OperationID: string(rune('a' + i)), NodeID: "soon", Kind: "stop_workload",
					Payload: json.RawMessage(`{}`), PayloadDigest: "d", FencingToken: 1, IssuedAt: t0.Add(-72 * time.Hour),
					State: c.state, SettledAt: c.settled})
				if err != nil {
					return err
				}
			}
			return nil
		}))

		sum, err := s.Summarize(ctx, fleet.SummaryWindow{LapseBefore: t0.Add(30 * time.Second), RefusedSince: t0.Add(-24 * time.Hour)})
		require.NoError(t, err)
		require.Equal(t, map[fleet.State]int64{fleet.StateReady: 2, fleet.StateLost: 1, fleet.StateEnrolling: 1}, sum.ByState)
		require.EqualValues(t, 1, sum.Lapsing, "only the ready node whose lease ends within the window")
		require.EqualValues(t, 2, sum.PendingCommands)
		require.EqualValues(t, 1, sum.RefusedCommands, "the refusal two days ago is out of the window")

		// The counter follows every change of state, and a fold keeps
		// the counts.
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
			for i := 0; i < 20; i++ {
				n, err := tx.LockNode(ctx, "later")
				if err != nil {
					return err
				}
				n.State = []fleet.State{fleet.StateLost, fleet.StateReady}[i%2]
				if err := tx.UpdateNode(ctx, n); err != nil {
					return err
				}
			}
			n, err := tx.LockNode(ctx, "new")
			if err != nil {
				return err
			}
			n.State = fleet.StateRetired
			if err := tx.UpdateNode(ctx, n); err != nil {
				return err
			}
			n.AgentVersion = "same state, no change counted"
			return tx.UpdateNode(ctx, n)
		}))
		want := map[fleet.State]int64{fleet.StateReady: 2, fleet.StateLost: 1, fleet.StateRetired: 1}
		for _, fold := range []bool{false, true, true} {
			if fold {
				require.NoError(t, s.FoldNodeCounts(ctx))
			}
			got, err := s.CountNodesByState(ctx)
			require.NoError(t, err)
			require.Equal(t, want, got, "folded: %v", fold)
		}
		require.LessOrEqual(t, dbtest.Count(t, db.DB, &models.NodeStateCount{}), int64(16), "folded into a row per state")

		lapse := t0.Add(30 * time.Second)
		nodes, err := s.ListNodes(ctx, fleet.NodeFilter{State: fleet.StateReady, LeaseBefore: &lapse, Limit: 10})
		require.NoError(t, err)
		require.Len(t, nodes, 1)
		require.Equal(t, "soon", nodes[0].ID)
	})
}

// TestNodeCounterConcurrent: concurrent transactions moving nodes in
// opposite directions (ready→lost in one, lost→ready in another: the
// pattern that deadlocks a counter kept as one row per state), with folds
// running alongside, neither wait on each other nor lose a change: the
// counter ends equal to the nodes themselves.
func TestNodeCounterConcurrent(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := models.NewFleetStore(db, "r1", nil)
		const workers, perWorker = 4, 3
		var all []fleet.Node
		for i := 0; i < workers*perWorker; i++ {
			n := sampleNode(fmt.Sprintf("n%02d", i), fmt.Sprintf("rent-%02d", i), 1)
			n.State = []fleet.State{fleet.StateReady, fleet.StateLost}[(i/perWorker)%2]
			all = append(all, n)
		}
		insert(t, s, all...)
		var wg sync.WaitGroup
		errs := make(chan error, workers+1)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				mine := all[w*perWorker : (w+1)*perWorker] // disjoint: no node row is shared
				for round := 0; round < 10; round++ {
					err := s.Tx(ctx, func(tx fleet.Tx) error {
						for _, m := range mine {
							n, err := tx.LockNode(ctx, m.ID)
							if err != nil {
								return err
							}
							if n.State == fleet.StateReady {
								n.State = fleet.StateLost
							} else {
								n.State = fleet.StateReady
							}
							if err := tx.UpdateNode(ctx, n); err != nil {
								return err
							}
						}
						return nil
					})
					if err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				if err := s.FoldNodeCounts(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.NoError(t, s.FoldNodeCounts(ctx))
		var truth []struct {
			State string
			N     int64
		}
		require.NoError(t, db.Raw(`SELECT state, COUNT(*) AS n FROM nodes GROUP BY state`).Scan(&truth).Error)
		want := map[fleet.State]int64{}
		for _, r := range truth {
			want[fleet.State(r.State)] = r.N
		}
		got, err := s.CountNodesByState(ctx)
		require.NoError(t, err)
		require.Equal(t, want, got)
	})
}
