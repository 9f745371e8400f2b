package models_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// TestFleetStoreListNodesKeyset: the nodes listing pages newest first by
// (created_at, id) from any cursor, alone and filtered by state, and
// nodes created in the same microsecond are each listed once, in id
// order, however the pages fall among them.
func TestFleetStoreListNodesKeyset(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := models.NewFleetStore(db, "r1", nil)
		states := []fleet.State{fleet.StateReady, fleet.StateLost, fleet.StateEnrolling}
		var all []fleet.Node
		for i := range 13 {
			n := sampleNode(fmt.Sprintf("nod_%02d", i), fmt.Sprintf("rent-%02d", i), 1)
			// Three nodes to a microsecond: cursors land inside a tie.
			n.CreatedAt = t0.Add(time.Duration(i/3) * time.Microsecond)
			n.State = states[i%len(states)]
			all = append(all, n)
		}
		insert(t, s, all...)

		// want is the listing's order: newest first, then the higher id.
		want := func(st fleet.State) []string {
			var ids []string
			for i := len(all) - 1; i >= 0; i-- {
				if st == "" || all[i].State == st {
					ids = append(ids, all[i].ID)
				}
			}
			return ids
		}
		for _, st := range []fleet.State{"", fleet.StateReady, fleet.StateLost} {
			for _, limit := range []int{1, 2, 4} {
				t.Run(fmt.Sprintf("state=%s/limit=%d", st, limit), func(t *testing.T) {
					var got []string
					f := fleet.NodeFilter{State: st, Limit: limit}
					for pages := 0; ; pages++ {
						require.Less(t, pages, 20, "paging ends")
						page, err := s.ListNodes(ctx, f)
						require.NoError(t, err)
						require.LessOrEqual(t, len(page), limit)
						for _, n := range page {
							if st != "" {
								require.Equal(t, st, n.State)
							}
							got = append(got, n.ID)
						}
						if len(page) < limit {
							break
						}
						last := page[len(page)-1]
						f.BeforeCreated, f.BeforeID = &last.CreatedAt, last.ID
					}
					require.Equal(t, strings.Join(want(st), " "), strings.Join(got, " "))
				})
			}
		}

		// A cursor inside a tie: the rest of its microsecond (lower ids),
		// then older nodes.
		c := all[7].CreatedAt // nod_06, nod_07, nod_08 share it
		page, err := s.ListNodes(ctx, fleet.NodeFilter{BeforeCreated: &c, BeforeID: "nod_07", Limit: 3})
		require.NoError(t, err)
		require.Equal(t, []string{"nod_06", "nod_05", "nod_04"}, []string{page[0].ID, page[1].ID, page[2].ID})
	})
}
