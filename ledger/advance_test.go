package ledger_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/models"
)

// advances answers the coalesced advances of fan-out parents so far: at
// once, and put off to the end of an interval (the sweep's are not
// counted).
func (b *bundle) advances() (prompt, waited float64) {
	return testutil.ToFloat64(b.metrics.FanOutAdvances.WithLabelValues("prompt")),
		testutil.ToFloat64(b.metrics.FanOutAdvances.WithLabelValues("interval"))
}

// A wave of children ending together advances the parent a few times, not
// once per child, and the parent still ends with every child counted.
func TestFanOutAdvancesCoalesce(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		b.start(t)
		const n = 200
		parent := b.submit(t, admin, "test.fan", `{"children":200}`)
		done := b.waitState(t, parent.ID, ledger.StateSucceeded)
		require.Equal(t, &ledger.Counts{Total: n, Succeeded: n}, done.Counts)
		// A batch hands its notices out after its commit, so the last
		// ends may be heard just after the parent saw them in the store.
		require.Eventually(t, func() bool {
			return testutil.ToFloat64(b.metrics.FanOutChildEnds) >= n
		}, waitLong, tick, "every child's end was heard")
		ends := testutil.ToFloat64(b.metrics.FanOutChildEnds)
		prompt, waited := b.advances()
		t.Logf("%v child-end notices, %v advances at once, %v put off", ends, prompt, waited)
		require.Less(t, prompt+waited, float64(n/4), "advances were coalesced")
	}, func(s *ledger.Settings) { s.AdvanceInterval = 500 * time.Millisecond })
}

// A max_concurrency 1 fan-out releases the next child on each end without
// waiting for the coalescing interval: with an interval of an hour, it
// still ends, and no advance was put off.
func TestFanOutMaxConcurrencyOneNeverWaits(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		b.start(t)
		parent := b.submit(t, admin, "test.fan", `{"children":20,"max_concurrency":1}`)
		done := b.waitState(t, parent.ID, ledger.StateSucceeded)
		require.Equal(t, &ledger.Counts{Total: 20, Succeeded: 20}, done.Counts)
		for _, ch := range b.children(t, parent.ID) {
			require.Equal(t, int64(1), b.tk.count(ch.ID))
		}
		prompt, waited := b.advances()
		require.Zero(t, waited, "no release waited for the interval")
		require.GreaterOrEqual(t, prompt, float64(20), "one advance per release")
	}, func(s *ledger.Settings) { s.AdvanceInterval = time.Hour })
}

// Two replicas share a fan-out's children: each coalesces the ends it
// hears, and the parent ends once with every child counted.
func TestFanOutAdvancesAcrossReplicas(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		if b.db.Dialect != models.Postgres {
			t.Skip("several replicas need Postgres (DECISIONS.md §23)")
		}
		other := newLedger(t, b.db, b.tk, b.clock, func(s *ledger.Settings) { s.AdvanceInterval = 500 * time.Millisecond })
		b.start(t)
		other.start(t)
		const n = 200
		parent := b.submit(t, admin, "test.fan", `{"children":200}`)
		done := b.waitState(t, parent.ID, ledger.StateSucceeded)
		require.Equal(t, &ledger.Counts{Total: n, Succeeded: n}, done.Counts)
		var ends, advances float64
		for _, r := range []*bundle{b, other} {
			heard := testutil.ToFloat64(r.metrics.FanOutChildEnds)
			prompt, waited := r.advances()
			t.Logf("%s: %v child-end notices, %v advances", r.replica, heard, prompt+waited)
			ends += heard
			advances += prompt + waited
		}
		require.GreaterOrEqual(t, ends, float64(n))
		require.Less(t, advances, float64(n/4))
	}, func(s *ledger.Settings) { s.AdvanceInterval = 500 * time.Millisecond })
}

// A fan-out with more held children than one advance releases
// (ReleasePerAdvance) releases them batch after batch, each advance
// queueing the next at once — not waiting for a child's end or the sweep —
// so no single transaction takes every child's node lock (a fleet.configure
// of 10,000 nodes ran Postgres's lock table out of memory in one).
func TestFanOutReleasesHeldChildrenInBatches(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		b.start(t)
		parent := b.submit(t, admin, "test.fan", `{"children":20}`)
		done := b.waitState(t, parent.ID, ledger.StateSucceeded)
		require.Equal(t, &ledger.Counts{Total: 20, Succeeded: 20}, done.Counts)
		for _, ch := range b.children(t, parent.ID) {
			require.Equal(t, int64(1), b.tk.count(ch.ID), "each child ran once")
		}
		// 20 held children, 3 a batch: 7 batches, the 6 after the first
		// queued by the one before.
		continued := testutil.ToFloat64(b.metrics.FanOutAdvances.WithLabelValues("continued"))
		require.GreaterOrEqual(t, continued, float64(6), "each batch queued the next")
		_, waited := b.advances()
		require.Zero(t, waited, "no batch waited for the interval")
	}, func(s *ledger.Settings) { s.AdvanceInterval, s.ReleasePerAdvance = time.Hour, 3 })
}
