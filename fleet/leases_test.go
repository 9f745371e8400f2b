package fleet_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/testwait"
)

// arrive holds a long-poll of wait for the session until it is held past
// its arrival (lease touched, work checked), then ends it (the agent's
// connection goes: the clock is the test's, so its deadline would never
// come in time), and waits until a renewal it queued, if any, is written.
func (b *bundle) arrive(t *testing.T, sess fleet.Session, wait time.Duration) {
	t.Helper()
	renewals := testutil.ToFloat64(b.metrics.PollRenewals)
	flushed := testutil.ToFloat64(b.metrics.HeartbeatsFlushed)
	r0, s0 := reads(b.metrics)
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := b.svc.PollFor(pctx, sess, fleet.PollRequest{Wait: wait})
		done <- err
	}()
	testwait.For(t, "poll to be held past its arrival check", testwait.Patience, func() bool {
		r, s := reads(b.metrics)
		return b.svc.Hub().HeldFor(sess.NodeID) == 1 && r+s > r0+s0
	})
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	if renewed := testutil.ToFloat64(b.metrics.PollRenewals) - renewals; renewed > 0 {
		testwait.For(t, "renewal written", testwait.Patience, func() bool {
			return testutil.ToFloat64(b.metrics.HeartbeatsFlushed) >= flushed+renewed
		})
	}
}

// requireHeld sweeps the leases at the clock's time and checks the node was
// not marked lost.
func (b *bundle) requireHeld(t *testing.T, id, when string) {
	t.Helper()
	lost, err := b.svc.SweepLeases(ctx)
	require.NoError(t, err)
	require.NotContains(t, lost, id, when)
	n, err := b.svc.Node(ctx, id)
	require.NoError(t, err)
	require.Equal(t, fleet.StateReady, n.State, when)
}

// TestHeldPollLeaseRenewals (issue 13): a node held poll after poll renews
// its lease only when the lease would not outlast the arriving poll's wait
// by the margin (a third of the lease), and so never goes lost, even when
// its agent polls again, or the renewal is written, many seconds late;
// with the agent's 25 s wait and the 90 s lease that is every second
// arrival (every 50 s: 1.8 renewals a lease), not one per poll. Proven on
// the injected clock, the sweeper run at each poll's end, the worst moment.
func TestHeldPollLeaseRenewals(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		t.Run("AgentWait", func(t *testing.T) {
			id, sess, _ := b.readyNode(t)
			r0 := testutil.ToFloat64(b.metrics.PollRenewals)
			const arrivals = 12 // 300 s held
			for i := range arrivals {
				b.arrive(t, sess, 25*time.Second)
				b.clock.Advance(25 * time.Second) // the poll's deadline: the agent polls again at once
				b.requireHeld(t, id, "end of poll "+itoa(i))
			}
			renewals := testutil.ToFloat64(b.metrics.PollRenewals) - r0
			require.Equal(t, 6.0, renewals, "renewed at 0, 50, 100, 150, 200 and 250 s")
			t.Logf("%.0f renewals over %d held polls (%.2f a lease)", renewals, arrivals, renewals/(arrivals*25.0/90))
		})
		t.Run("SlowRepoll", func(t *testing.T) {
			// The agent takes up to just under the margin to poll again.
			id, sess, _ := b.readyNode(t)
			for i := range 10 {
				b.arrive(t, sess, 25*time.Second)
				b.clock.Advance(25*time.Second + 29*time.Second)
				b.requireHeld(t, id, "re-poll "+itoa(i)+" 29 s late")
			}
		})
		t.Run("LongestWait", func(t *testing.T) {
			// A 60 s wait: renewing at a third of the lease would have left
			// nothing to spare; the lease must be renewed at every arrival.
			id, sess, _ := b.readyNode(t)
			r0 := testutil.ToFloat64(b.metrics.PollRenewals)
			for i := range 6 {
				b.arrive(t, sess, fleet.MaxPollWait)
				b.clock.Advance(fleet.MaxPollWait)
				b.requireHeld(t, id, "end of 60 s poll "+itoa(i))
			}
			require.Equal(t, 6.0, testutil.ToFloat64(b.metrics.PollRenewals)-r0)
		})
		t.Run("LongWaitAfterEarlyAnswer", func(t *testing.T) {
			// Why the rule looks at the wait rather than renewing every half
			// lease: a 60 s poll answered 44 s in, polled again at once for
			// 60 s, ends 104 s after the renewal. Renewing only once the last
			// was half a lease (45 s) old would skip the second arrival and
			// the node would go lost at 90 s while held.
			id, sess, _ := b.readyNode(t)
			b.arrive(t, sess, fleet.MaxPollWait)
			b.clock.Advance(44 * time.Second)
			r0 := testutil.ToFloat64(b.metrics.PollRenewals)
			b.arrive(t, sess, fleet.MaxPollWait)
			require.Equal(t, r0+1, testutil.ToFloat64(b.metrics.PollRenewals), "renewed: 46 s left, less than the wait and the margin")
			b.clock.Advance(fleet.MaxPollWait)
			b.requireHeld(t, id, "end of the second 60 s poll")
		})
		t.Run("EarlyAnswers", func(t *testing.T) {
			// Answered early (work), polled again at once: arrivals every
			// 5 s renew once the lease is down to the wait and the margin.
			id, sess, _ := b.readyNode(t)
			r0 := testutil.ToFloat64(b.metrics.PollRenewals)
			for i := range 36 { // 180 s
				b.arrive(t, sess, 25*time.Second)
				b.clock.Advance(5 * time.Second)
				b.requireHeld(t, id, "early answer "+itoa(i))
			}
			// Renewed at 0, 40, 80, 120 and 160 s (the lease left under 55 s).
			require.Equal(t, 5.0, testutil.ToFloat64(b.metrics.PollRenewals)-r0)
		})
		t.Run("StoppedPollingGoesLost", func(t *testing.T) {
			// The control: the same node that stops polling does go lost.
			id, sess, _ := b.readyNode(t)
			b.arrive(t, sess, 25*time.Second)
			b.clock.Advance(90*time.Second + time.Millisecond)
			_, err := b.svc.SweepLeases(ctx) // (or the service's own sweeper did)
			require.NoError(t, err)
			n, err := b.svc.Node(ctx, id)
			require.NoError(t, err)
			require.Equal(t, fleet.StateLost, n.State)
		})
	})
}
