package models_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPostgresPoolServesInOrder: statements waiting for the pool's one
// connection get it in the order they asked for it. (database/sql alone
// hands a freed connection to a random waiter: forty waiters would come
// out in about 390 of 780 pairs out of order.)
func TestPostgresPoolServesInOrder(t *testing.T) {
	db := openOneConnection(t)
	holder := db.WithContext(context.Background()).Begin() // transactions take the pool's connection directly
	require.NoError(t, holder.Error)
	const n = 40
	served := make(chan int, n)
	errs := make(chan error, n)
	for i := range n {
		go func() {
			var got int
			err := db.WithContext(context.Background()).Raw("SELECT ?::int", i).Scan(&got).Error
			if err != nil {
				errs <- err
				return
			}
			served <- got
		}()
		// The next asks well after this one is queued.
		time.Sleep(5 * time.Millisecond)
	}
	require.NoError(t, holder.Rollback().Error)
	var order []int
	for range n {
		select {
		case i := <-served:
			order = append(order, i)
		case err := <-errs:
			t.Fatal(err)
		case <-time.After(time.Minute):
			t.Fatalf("only %d of %d statements were served", len(order), n)
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
