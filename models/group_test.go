package models_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// Two replicas' group commits lock the same nodes in opposite orders while
// the lease renewals write them too: batches that meet in a deadlock do not
// fail their callers (the refused request runs again alone), and every
// transaction's write lands exactly once.
func TestGroupCommitOverlappingBatchesNeverFailOrRepeat(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		a := models.NewFleetStore(db, "ra", nil)
		b := models.NewFleetStore(db, "rb", nil)
		const nodes = 6
		ids := make([]string, nodes)
		for i := range ids {
			ids[i] = fmt.Sprintf("ov%d", i)
			n := sampleNode(ids[i], "rent-"+ids[i], 1)
			n.State = fleet.StateReady
			insert(t, a, n)
		}
		const per = 24 // transactions per replica
		var wg sync.WaitGroup
		errs := make(chan error, 2*per+64)
		start := make(chan struct{})
		run := func(s *models.FleetStore, name string, order []string) {
			for i := range per {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					errs <- s.Tx(ctx, func(tx fleet.Tx) error {
						for _, id := range order {
							if _, err := tx.LockNode(ctx, id); err != nil {
								return err
							}
						}
						return tx.AppendAudit(ctx, fleet.AuditEntry{At: t0, Actor: "test", Action: "overlap." + name,
							NodeID: ids[0], Detail: map[string]any{"i": i}})
					})
				}()
			}
		}
		reversed := make([]string, nodes)
		for i, id := range ids {
			reversed[nodes-1-i] = id
		}
		run(a, "a", ids)
		run(b, "b", reversed)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range 8 {
				batch := make([]fleet.LeaseRenewal, nodes)
				for i, id := range reversed {
					batch[i] = fleet.LeaseRenewal{NodeID: id, Until: time.Now().Add(time.Minute)}
				}
				_, err := a.RenewLeases(ctx, batch)
				errs <- err
			}
		}()
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		entries, err := a.Audit(ctx, ids[0], 0)
		require.NoError(t, err)
		seen := map[string]int{}
		for _, e := range entries {
			if e.Actor == "test" {
				seen[fmt.Sprintf("%s/%v", e.Action, e.Detail["i"])]++
			}
		}
		require.Len(t, seen, 2*per, "every transaction committed")
		for k, n := range seen {
			require.Equal(t, 1, n, "%s committed once", k)
		}
	})
}

// Audit rows are written with the batch: a request that fails leaves none,
// each that commits leaves its own, once and in its order, and a request
// with more rows than one statement takes still writes them all.
func TestGroupCommitAuditRowsFollowTheirRequest(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := models.NewFleetStore(db, "r1", nil)
		const reqs = 48
		var wg sync.WaitGroup
		start := make(chan struct{})
		refused := fmt.Errorf("refused")
		for i := range reqs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				err := s.Tx(ctx, func(tx fleet.Tx) error {
					for step := range 2 {
						if err := tx.AppendAudit(ctx, fleet.AuditEntry{At: t0, Actor: "test", Action: "audit.step",
							NodeID: "aud", Detail: map[string]any{"i": i, "step": step}}); err != nil {
							return err
						}
					}
					if i%3 == 0 {
						return refused
					}
					return nil
				})
				if i%3 == 0 {
					assert.ErrorIs(t, err, refused)
				} else {
					assert.NoError(t, err)
				}
			}()
		}
		close(start)
		wg.Wait()
		entries, err := s.Audit(ctx, "aud", 0)
		require.NoError(t, err)
		next := map[float64]float64{} // request → its next step, oldest entry first
		for k := len(entries) - 1; k >= 0; k-- {
			i, step := entries[k].Detail["i"].(float64), entries[k].Detail["step"].(float64)
			require.NotZero(t, int(i)%3, "request %v failed: none of its rows", i)
			require.Equal(t, next[i], step, "request %v: its rows once, in order", i)
			next[i]++
		}
		require.Len(t, next, reqs-reqs/3)

		const many = 2500
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
			for i := range many {
				if err := tx.AppendAudit(ctx, fleet.AuditEntry{At: t0, Actor: "test", Action: "audit.many", NodeID: "many",
					Detail: map[string]any{"i": i}}); err != nil {
					return err
				}
			}
			return nil
		}))
		entries, err = s.Audit(ctx, "many", 0)
		require.NoError(t, err)
		require.Len(t, entries, many)
	})
}
