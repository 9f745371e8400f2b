package ledger_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/ledger"
)

// TestSummarize: the overview counts, by state, the open operations
// created within the window and the operations that ended within it
// (whenever they were created), and those that ended failed within the
// failures window; older ones are out of both.
func TestSummarize(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		b.start(t)
		old := b.submit(t, admin, "test.fail", `{}`)
		b.waitState(t, old.ID, ledger.StateFailed)
		long := b.submit(t, admin, "test.block", `{}`)
		b.waitStarted(t, long.ID)
		b.clock.Advance(2 * time.Hour) // out of the last hour, still in the day
		_, err := b.svc.Cancel(ctx, admin, long.ID, "took too long")
		require.NoError(t, err)
		b.waitState(t, long.ID, ledger.StateCancelled) // created 2 h ago, ended in the hour

		ok := b.submit(t, admin, "test.noop", `{}`)
		failed := b.submit(t, admin, "test.fail", `{}`)
		b.waitState(t, ok.ID, ledger.StateSucceeded)
		b.waitState(t, failed.ID, ledger.StateFailed)

		sum, err := b.svc.Summarize(ctx, time.Hour, 24*time.Hour)
		require.NoError(t, err)
		require.Equal(t, map[ledger.State]int64{ledger.StatePending: 0, ledger.StateRunning: 0, ledger.StateSucceeded: 1,
			ledger.StateFailed: 1, ledger.StateCancelled: 1}, sum.RecentByState)
		require.EqualValues(t, 2, sum.Failed, "both failures ended within the day")
		require.Equal(t, b.clock.Now().Add(-time.Hour), sum.RecentSince)

		b.clock.Advance(23 * time.Hour)
		sum, err = b.svc.Summarize(ctx, time.Hour, 24*time.Hour)
		require.NoError(t, err)
		require.EqualValues(t, 1, sum.Failed, "the older failure is a day old now")
		require.Zero(t, sum.RecentByState[ledger.StateSucceeded])
		require.Zero(t, sum.RecentByState[ledger.StateCancelled])
	})
}
