package ledger_test

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/txroutes"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// routeWatch notes the write lane route of every transaction the ledger
// runs through its store.
type routeWatch struct {
	ledger.Store
	txroutes.Log
}

func (s *routeWatch) Tx(ctx context.Context, fn func(ledger.Tx) error) error {
	s.Note(ctx)
	return s.Store.Tx(ctx, fn)
}

// TestInvitationsRunInTheNodesLane: an invitation is recorded and carried
// out in the write lane of the node it reserves, not in the exclusive lane
// that holds every other lane back; one that retires the rental's older
// generation in another lane strays there and still succeeds, the older
// generation retired.
func TestInvitationsRunInTheNodesLane(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		w := &routeWatch{}
		b := newLedgerWrapped(t, db, newTestKinds(), newClock(), func(s ledger.Store) ledger.Store {
			w.Store = s
			return w
		})
		if db.Dialect == models.Postgres {
			b.fstore.SetWriteLanes(4)
		}
		b.start(t)
		invite := func(node string, generation int) ledger.Operation {
			t.Helper()
			body, err := json.Marshal(map[string]any{"node_id": node, "rental_id": "rental-lanes", "generation": generation})
			require.NoError(t, err)
			op, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindNodeInvite, Operation: body})
			require.NoError(t, err)
			return b.waitState(t, op.ID, ledger.StateSucceeded)
		}

		strays := b.fstore.GroupStats().Strays
		invite("lanes-g1", 1)
		require.Equal(t, 2, w.ToNode("lanes-g1"), "its record and its run, each routed to the node's lane")
		require.Equal(t, strays, b.fstore.GroupStats().Strays, "a new rental's invitation locks nothing of another lane")

		// Generation 2 reserved in another lane than generation 1.
		second := ""
		for i := 0; second == ""; i++ {
			id := "lanes-g2-" + strconv.Itoa(i)
			if db.Dialect != models.Postgres || b.store.WriteLane(id) != b.store.WriteLane("lanes-g1") {
				second = id
			}
		}
		invite(second, 2)
		require.Equal(t, 2, w.ToNode(second))
		if db.Dialect == models.Postgres {
			require.Greater(t, b.fstore.GroupStats().Strays, strays, "retiring generation 1 left the lane of generation 2")
		}
		older, err := b.fleet.Node(ctx, "lanes-g1")
		require.NoError(t, err)
		require.Equal(t, fleet.StateRetired, older.State, "the newer generation retires the older")
	})
}

// TestConcurrentInvitationsOfOneIdentity: invitations of one rental and
// generation submitted at once, reserving nodes in different write lanes,
// are carried out concurrently, and exactly one succeeds; the others end
// failed identity_exists, having left no node behind. Invitations of
// distinct rentals submitted beside them all succeed.
func TestConcurrentInvitationsOfOneIdentity(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b := newLedgerWrapped(t, db, newTestKinds(), newClock(), nil)
		if db.Dialect == models.Postgres {
			b.fstore.SetWriteLanes(4)
		}
		b.start(t)
		const same, distinct = 8, 24
		ids := make([]string, same+distinct)
		var wg sync.WaitGroup
		for i := range ids {
			wg.Go(func() {
				rental := "rental-race"
				if i >= same {
					rental = "rental-own-" + strconv.Itoa(i)
				}
				body, _ := json.Marshal(map[string]any{"node_id": "race-" + strconv.Itoa(i), "rental_id": rental, "generation": 1})
				op, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindNodeInvite, Operation: body})
				if err == nil {
					ids[i] = op.ID
				}
			})
		}
		wg.Wait()
		won := 0
		for i, id := range ids {
			if id == "" {
				// Refused at submit: another had already been recorded and run.
				require.Less(t, i, same, "a distinct rental's invitation was refused")
				continue
			}
			var op ledger.Operation
			require.Eventually(t, func() bool {
				var err error
				op, err = b.store.Operation(ctx, id)
				require.NoError(t, err)
				return op.State.Terminal()
			}, waitLong, tick)
			if i >= same {
				require.Equal(t, ledger.StateSucceeded, op.State, "distinct rental %d", i)
				continue
			}
			if op.State == ledger.StateSucceeded {
				won++
				continue
			}
			require.Equal(t, ledger.StateFailed, op.State)
			require.NotNil(t, op.Error)
			require.Equal(t, "identity_exists", op.Error.Code)
			_, err := b.fleet.Node(ctx, "race-"+strconv.Itoa(i))
			require.Error(t, err, "a losing invitation left its node behind")
		}
		require.Equal(t, 1, won, "exactly one invitation of the identity wins")
	})
}
