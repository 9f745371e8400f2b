package fleet

import (
	"context"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/metrics"
)

// renewCounter is a Store that only counts the renewals it is given.
type renewCounter struct {
	Store
	renewals int
}

func (r *renewCounter) RenewLeases(_ context.Context, batch []LeaseRenewal) (int, error) {
	r.renewals += len(batch)
	return len(batch), nil
}

// TestHeldPollRenewalsAllocateNothingInTheBatcher: once warm, renewing the
// leases of held polls — every poll asking (touch) and the batch written
// (flushOnce) — allocates nothing in the batcher itself: the batch slice,
// the pending map and the coalescing memory are reused, and no flush
// result is made when no heartbeat waits. (The store's statement is
// measured by models' BenchmarkRenewLeases.)
func TestHeldPollRenewalsAllocateNothingInTheBatcher(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	store := &renewCounter{}
	b := newLeaseBatcher(store, Settings{Lease: 90 * time.Second}, func() time.Time { return now },
		metrics.New(nil), slog.New(slog.DiscardHandler))
	ids := make([]string, 500)
	for i := range ids {
		ids[i] = "node-" + strconv.Itoa(i)
	}
	round := func() {
		now = now.Add(b.settings.Lease) // every poll is due a renewal again
		for _, id := range ids {
			b.touch(id, 25*time.Second)
		}
		b.flushOnce(context.Background())
	}
	round() // warm: the maps and the batch grow to the fleet's size
	allocs := testing.AllocsPerRun(20, round)
	require.Equal(t, 22*len(ids), store.renewals, "every round renews every held poll (AllocsPerRun runs one more)")
	require.Zero(t, allocs, "allocations per round of %d renewals", len(ids))
}

// TestMergeRenewal: of two heartbeats of one node in a batch, the later is
// written, with the earlier's facts if it carries none, and announced if
// either asked to.
func TestMergeRenewal(t *testing.T) {
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	facts := func(announce bool) *FactsUpdate { return &FactsUpdate{JSON: []byte(`{}`), Announce: announce} }
	old := LeaseRenewal{NodeID: "n", Until: at, Facts: facts(true)}
	got := mergeRenewal(old, LeaseRenewal{NodeID: "n", Until: at.Add(time.Second)})
	require.Equal(t, at.Add(time.Second), got.Until)
	require.Same(t, old.Facts, got.Facts, "the earlier facts kept")
	later := facts(false)
	got = mergeRenewal(old, LeaseRenewal{NodeID: "n", Facts: later})
	require.True(t, got.Facts.Announce, "announced: the earlier asked to")
	require.False(t, later.Announce, "the request's own facts untouched")
	got = mergeRenewal(LeaseRenewal{NodeID: "n", Facts: facts(false)}, LeaseRenewal{NodeID: "n", Facts: later})
	require.Same(t, later, got.Facts)
	require.False(t, got.Facts.Announce)
}
