package fleet_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/fleet"
)

// TestSettleMixedRequest: one request mixing every answer a result can
// get — settled now (applied, refused), unknown, another node's, settled
// before (applied, refused), and ids asked twice — answers each as it
// would alone, the first result of an id settling it; only the fresh
// settlements count, and nothing settled before changes.
func TestSettleMixedRequest(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		id, sess, _ := b.readyNode(t)
		other, _, _ := b.readyNode(t)
		for _, op := range []string{"mx-apply", "mx-old", "mx-old-refused", "mx-left"} {
			b.issue(t, id, launch(op))
		}
		b.issue(t, id, prepare("mx-refuse"))
		b.issue(t, other, launch("mx-theirs"))
		_, err := b.svc.Poll(ctx, sess, 0, "")
		require.NoError(t, err)
		settled, err := b.svc.Settle(ctx, sess, []api.Result{{OperationID: "mx-old", Applied: true},
			{OperationID: "mx-old-refused", Failure: "no space"}})
		require.NoError(t, err)
		require.Equal(t, []api.Settled{{OperationID: "mx-old", State: "applied"},
			{OperationID: "mx-old-refused", State: "refused", Code: "refused_by_node"}}, settled)
		command := func(op string) fleet.Command {
			c, err := b.svc.Command(ctx, op)
			require.NoError(t, err)
			return c
		}
		old, oldRefused := command("mx-old"), command("mx-old-refused")

		b.clock.Advance(time.Second)
		applied := testutil.ToFloat64(b.metrics.CommandsSettled.WithLabelValues("applied"))
		refused := testutil.ToFloat64(b.metrics.CommandsSettled.WithLabelValues("refused"))
		settled, err = b.svc.Settle(ctx, sess, []api.Result{
			{OperationID: "mx-apply", Applied: true},
			{OperationID: "mx-refuse", Failure: "pull failed"},
			{OperationID: "mx-none", Applied: true},
			{OperationID: "mx-theirs", Applied: true},
			{OperationID: "mx-old", Failure: "late refusal"},
			{OperationID: "mx-old-refused", Applied: true, Duplicate: true},
			{OperationID: "mx-refuse", Applied: true},
			{OperationID: "mx-apply", Failure: "changed my mind"},
			{OperationID: "mx-none", Failure: "what?"},
		})
		require.NoError(t, err)
		require.Equal(t, []api.Settled{
			{OperationID: "mx-apply", State: "applied"},
			{OperationID: "mx-refuse", State: "refused", Code: "refused_by_node"},
			{OperationID: "mx-none", Code: "unknown_operation"},
			{OperationID: "mx-theirs", Code: "not_this_node"},
			{OperationID: "mx-old", State: "applied"},
			{OperationID: "mx-old-refused", State: "refused", Code: "refused_by_node"},
			{OperationID: "mx-refuse", State: "refused", Code: "refused_by_node"},
			{OperationID: "mx-apply", State: "applied"},
			{OperationID: "mx-none", Code: "unknown_operation"},
		}, settled)
		require.Equal(t, applied+1, testutil.ToFloat64(b.metrics.CommandsSettled.WithLabelValues("applied")), "fresh ones only")
		require.Equal(t, refused+1, testutil.ToFloat64(b.metrics.CommandsSettled.WithLabelValues("refused")))

		now := b.clock.Now()
		c := command("mx-apply")
		require.Equal(t, fleet.CommandApplied, c.State)
		require.Empty(t, c.FailureCode)
		require.True(t, now.Equal(*c.SettledAt))
		c = command("mx-refuse")
		require.Equal(t, fleet.CommandRefused, c.State)
		require.Equal(t, "refused_by_node", c.FailureCode)
		require.Equal(t, "pull failed", c.FailureMessage, "the first result of the id settled it")
		require.Equal(t, old, command("mx-old"), "settled before: unchanged")
		require.Equal(t, oldRefused, command("mx-old-refused"))
		require.Equal(t, fleet.CommandPending, command("mx-theirs").State)
		require.Equal(t, fleet.CommandPending, command("mx-left").State)

		// Nothing of the request settled: the same answers again, no count.
		again, err := b.svc.Settle(ctx, sess, []api.Result{{OperationID: "mx-refuse", Applied: true},
			{OperationID: "mx-theirs", Applied: true}, {OperationID: "mx-none", Applied: true}})
		require.NoError(t, err)
		require.Equal(t, []api.Settled{{OperationID: "mx-refuse", State: "refused", Code: "refused_by_node"},
			{OperationID: "mx-theirs", Code: "not_this_node"}, {OperationID: "mx-none", Code: "unknown_operation"}}, again)
		require.Equal(t, refused+1, testutil.ToFloat64(b.metrics.CommandsSettled.WithLabelValues("refused")))
	})
}

// TestSettleAfterRetire: a retired node still settles what it was
// delivered; what retirement refused answers its refusal and stays so.
func TestSettleAfterRetire(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		id, sess, _ := b.readyNode(t)
		b.issue(t, id, launch("rt-delivered"))
		b.issue(t, id, prepare("rt-delivered-refused"))
		_, err := b.svc.Poll(ctx, sess, 0, "")
		require.NoError(t, err)
		b.issue(t, id, launch("rt-undelivered"))
		_, err = b.svc.Retire(ctx, "a", id, "")
		require.NoError(t, err)
		undelivered, err := b.svc.Command(ctx, "rt-undelivered")
		require.NoError(t, err)

		settled, err := b.svc.Settle(ctx, sess, []api.Result{
			{OperationID: "rt-undelivered", Applied: true},
			{OperationID: "rt-delivered", Applied: true},
			{OperationID: "rt-delivered-refused", Failure: "pull failed"},
		})
		require.NoError(t, err)
		require.Equal(t, []api.Settled{
			{OperationID: "rt-undelivered", State: "refused", Code: "node_retired"},
			{OperationID: "rt-delivered", State: "applied"},
			{OperationID: "rt-delivered-refused", State: "refused", Code: "refused_by_node"},
		}, settled)
		after, err := b.svc.Command(ctx, "rt-undelivered")
		require.NoError(t, err)
		require.Equal(t, undelivered, after, "retirement's refusal stands")
	})
}
