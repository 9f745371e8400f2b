package models_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/internal/testwait"
	"github.com/nodeward/nodeward/models"
)

// TestPostgresPoolServesInOrder: statements waiting for the pool's one
// connection get it in the order they asked for it. (database/sql alone
// hands a freed connection to a random waiter: forty waiters come out
// with about half of their 780 pairs out of order.)
func TestPostgresPoolServesInOrder(t *testing.T) {
	db := openOneConnection(t)
	// The statements' order on the connection, as Postgres saw it: what
	// each caller does after its answer is its scheduler's business.
	require.NoError(t, db.Exec("CREATE SEQUENCE served_order").Error)
	holder := db.WithContext(context.Background()).Begin() // transactions take the pool's connection directly
	require.NoError(t, holder.Error)
	asked0 := models.PoolAsked(db)
	const n = 40
	served := make(chan [2]int, n)
	errs := make(chan error, n)
	for i := range n {
		go func() {
			var seq int
			err := db.WithContext(context.Background()).Raw("SELECT nextval('served_order')").Scan(&seq).Error
			if err != nil {
				errs <- err
				return
			}
			served <- [2]int{seq, i}
		}()
		// The next asks once this one has asked (and a little after, for
		// it to reach the queue from there).
		testwait.For(t, "statement "+strconv.Itoa(i)+" asked", time.Minute, func() bool { return models.PoolAsked(db) >= asked0+int64(i)+1 })
		time.Sleep(2 * time.Millisecond)
	}
	require.NoError(t, holder.Rollback().Error)
	order := make([]int, n)
	for k := range n {
		select {
		case got := <-served:
			require.LessOrEqual(t, got[0], n)
			order[got[0]-1] = got[1]
		case err := <-errs:
			t.Fatal(err)
		case <-time.After(time.Minute):
			t.Fatalf("only %d of %d statements were served", k, n)
		}
	}
	inversions := 0
	for a := range order {
		for b := a + 1; b < len(order); b++ {
			if order[a] > order[b] {
				inversions++
			}
		}
	}
	// A scheduler hiccup may swap two neighbours; a random handout
	// inverts hundreds of pairs.
	require.LessOrEqual(t, inversions, 3, "served in order %v", order)
}
