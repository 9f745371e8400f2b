package fleet_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/metrics"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// nodeReads answers the session doors' node reads so far.
func nodeReads(m *metrics.Metrics) float64 {
	return testutil.ToFloat64(m.NodeLookups.WithLabelValues("store"))
}

// requireNodeReads runs fn and checks how many node reads it cost.
func requireNodeReads(t *testing.T, m *metrics.Metrics, want float64, msg string, fn func()) {
	t.Helper()
	r0 := nodeReads(m)
	fn()
	require.Equal(t, want, nodeReads(m)-r0, "%s: node reads", msg)
}

func requireDoor(t *testing.T, svc *fleet.Service, tok string, door fleet.Door, want error) {
	t.Helper()
	_, err := svc.Authenticate(ctx, tok, door)
	if want == nil {
		require.NoError(t, err)
		return
	}
	requireCode(t, err, want)
}

// beatOn records a heartbeat carrying facts with caps (nil: none listed).
func beatOn(t *testing.T, svc *fleet.Service, now time.Time, sess fleet.Session, caps []string) {
	t.Helper()
	f := facts(now)
	f.Capabilities = caps
	_, err := svc.RecordEvents(ctx, sess, []api.Event{{ID: "hb-" + randomSuffix(), Kind: api.EventHeartbeat, ObservedAt: now, Facts: &f}})
	require.NoError(t, err)
}

// TestNodeCacheRepoll (a single process: every change is heard): an
// agent's doors read its node once, then not again for NodeCacheMaxAge —
// well past the old 10 s TTL an agent's 25 s re-poll outlived. A heartbeat
// whose capabilities are those cached reads nothing and keeps the entry;
// one that changes them is seen by the next door.
func TestNodeCacheRepoll(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		node, sess, tok := b.readyNode(t)
		requireNodeReads(t, b.metrics, 0, "cached by the first door", func() { requireDoor(t, b.svc, tok, fleet.DoorAsk, nil) })
		b.clock.Advance(25 * time.Second)
		requireNodeReads(t, b.metrics, 0, "a re-poll past the TTL", func() { requireDoor(t, b.svc, tok, fleet.DoorAsk, nil) })
		requireNodeReads(t, b.metrics, 0, "a heartbeat with the same capabilities", func() {
			beatOn(t, b.svc, b.clock.Now(), sess, nil)
			requireDoor(t, b.svc, tok, fleet.DoorReport, nil)
		})
		requireNodeReads(t, b.metrics, 1, "a heartbeat changing them", func() {
			beatOn(t, b.svc, b.clock.Now(), sess, []string{api.CapCommands, api.CapDiag})
			require.NoError(t, b.svc.RequireCapability(ctx, node, api.CapDiag))
			requireDoor(t, b.svc, tok, fleet.DoorAsk, nil)
		})
		b.clock.Advance(5*time.Minute - time.Second)
		requireNodeReads(t, b.metrics, 0, "within the max age", func() { requireDoor(t, b.svc, tok, fleet.DoorAsk, nil) })
		b.clock.Advance(time.Second)
		requireNodeReads(t, b.metrics, 1, "past the max age: read again, once", func() {
			requireDoor(t, b.svc, tok, fleet.DoorAsk, nil)
			requireDoor(t, b.svc, tok, fleet.DoorAsk, nil)
		})
		_, err := b.svc.Retire(ctx, "admin:test", node, "")
		require.NoError(t, err)
		requireDoor(t, b.svc, tok, fleet.DoorAsk, fleet.ErrNodeRetired)
	})
}

// TestNodeCacheNotifierDown: a replica whose notifications may be missed
// (it starts so until its listener connects) relies on a cached node for
// NodeCacheTTL only; once they flow, for NodeCacheMaxAge; when they stop
// again, what it cached is read anew.
func TestNodeCacheNotifierDown(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b := crossReplica(t, db, "cache-down", true, nil)
		svc, clk, m := b.svc, b.clock, b.metrics
		_, _, tok := b.readyNode(t)

		requireNodeReads(t, m, 0, "down: cached for the TTL", func() {
			clk.Advance(10*time.Second - time.Nanosecond)
			requireDoor(t, svc, tok, fleet.DoorAsk, nil)
		})
		requireNodeReads(t, m, 1, "down: past the TTL", func() {
			clk.Advance(time.Nanosecond)
			requireDoor(t, svc, tok, fleet.DoorAsk, nil)
		})
		svc.SetNotifierHealthy(true)
		requireNodeReads(t, m, 1, "up: what was cached while down is read anew", func() { requireDoor(t, svc, tok, fleet.DoorAsk, nil) })
		requireNodeReads(t, m, 0, "up: cached past the TTL", func() {
			clk.Advance(time.Minute)
			requireDoor(t, svc, tok, fleet.DoorAsk, nil)
		})
		svc.SetNotifierHealthy(false)
		requireNodeReads(t, m, 1, "down again: read anew", func() { requireDoor(t, svc, tok, fleet.DoorAsk, nil) })
	})
}

// TestNodeCacheBehindANewerToken: replica A cached a node while its
// notifications flowed; the node re-enrolls on replica B and its agent's
// next request reaches A before B's announcement does (here it never
// does). A session token newer than A's cached fencing token means A is
// behind, not that the token is superseded: A reads the node once and lets
// the new session in, and the old session is still fenced.
func TestNodeCacheBehindANewerToken(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		a := crossReplica(t, db, "behind-a", true, nil)
		b := crossReplica(t, db, "behind-b", true, nil)
		a.svc.SetNotifierHealthy(true) // A trusts what it caches
		node, _, oldTok := b.readyNode(t)
		requireNodeReads(t, a.metrics, 1, "A caches the node", func() { requireDoor(t, a.svc, oldTok, fleet.DoorAsk, nil) })

		boot, err := b.svc.Reinvite(ctx, "admin:test", node, nil)
		require.NoError(t, err)
		resp := b.enroll(t, boot)
		requireNodeReads(t, a.metrics, 1, "the newer token on A", func() {
			requireDoor(t, a.svc, resp.SessionToken, fleet.DoorAsk, nil)
		})
		requireNodeReads(t, a.metrics, 0, "A now knows the new fencing token", func() {
			requireDoor(t, a.svc, oldTok, fleet.DoorAsk, fleet.ErrFenced)
			requireDoor(t, a.svc, resp.SessionToken, fleet.DoorReport, nil)
		})
	})
}

// TestNodeCacheAcrossReplicas (Postgres): replica A caches a node past the
// old TTL while its notifications flow, and sees at once every change
// replica B makes to what it caches — capabilities changed by a
// heartbeat, the lease sweeper's lost, a new fencing token, retirement —
// reading the node once for each; a heartbeat on B that changes nothing
// A caches costs A nothing. With A's listener down, A reads past the TTL.
func TestNodeCacheAcrossReplicas(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		if db.Dialect != models.Postgres {
			t.Skip("several replicas need Postgres (DECISIONS.md §23)")
		}
		a, bb, nb := twoReplicas(t, db, "cache")
		clk := nb.clock
		node, sess, tok := nb.readyNode(t)
		a.barrier(t) // A has heard B's enrollment
		requireNodeReads(t, a.metrics, 1, "A's first door", func() {
			requireDoor(t, a.svc, tok, fleet.DoorAsk, nil)
			require.Equal(t, errcode.CapabilityMissing, errcode.Of(a.svc.RequireCapability(ctx, node, api.CapDiag)))
		})
		clk.Advance(time.Minute)
		requireNodeReads(t, a.metrics, 0, "A re-polls past the TTL", func() { requireDoor(t, a.svc, tok, fleet.DoorAsk, nil) })

		requireNodeReads(t, a.metrics, 0, "a heartbeat on B changing no capability", func() {
			beatOn(t, bb.svc, clk.Now(), sess, nil)
			a.barrier(t)
			requireDoor(t, a.svc, tok, fleet.DoorAsk, nil)
		})
		requireNodeReads(t, a.metrics, 1, "capabilities changed by a heartbeat on B", func() {
			beatOn(t, bb.svc, clk.Now(), sess, []string{api.CapCommands, api.CapDiag})
			a.barrier(t)
			require.NoError(t, a.svc.RequireCapability(ctx, node, api.CapDiag), "A sees the upgrade")
			requireDoor(t, a.svc, tok, fleet.DoorAsk, nil)
		})
		requireNodeReads(t, a.metrics, 1, "lost by B's sweeper", func() {
			clk.Advance(2 * time.Minute)
			// Either replica's sweeper may mark it (both run); B's is asked.
			_, err := bb.svc.SweepLeases(ctx)
			require.NoError(t, err)
			n, err := bb.svc.Node(ctx, node)
			require.NoError(t, err)
			require.Equal(t, fleet.StateLost, n.State)
			a.barrier(t)
			// A lost node's agent is still let in: its poll makes it ready.
			requireDoor(t, a.svc, tok, fleet.DoorAsk, nil)
		})

		boot, err := bb.svc.Reinvite(ctx, "admin:test", node, nil)
		require.NoError(t, err)
		resp := nb.enroll(t, boot)
		a.barrier(t)
		requireNodeReads(t, a.metrics, 1, "re-enrolled on B", func() {
			requireDoor(t, a.svc, tok, fleet.DoorAsk, fleet.ErrFenced)
			requireDoor(t, a.svc, resp.SessionToken, fleet.DoorAsk, nil)
		})

		_, err = bb.svc.Retire(ctx, "admin:test", node, "")
		require.NoError(t, err)
		a.barrier(t)
		requireNodeReads(t, a.metrics, 1, "retired on B", func() {
			requireDoor(t, a.svc, resp.SessionToken, fleet.DoorAsk, fleet.ErrNodeRetired)
			requireDoor(t, a.svc, resp.SessionToken, fleet.DoorReport, nil)
		})

		a.stopListener()
		requireNodeReads(t, a.metrics, 1, "A's listener down: read anew, then cached for the TTL", func() {
			requireDoor(t, a.svc, resp.SessionToken, fleet.DoorReport, nil)
			clk.Advance(10*time.Second - time.Nanosecond)
			requireDoor(t, a.svc, resp.SessionToken, fleet.DoorReport, nil)
		})
		requireNodeReads(t, a.metrics, 1, "past the TTL", func() {
			clk.Advance(time.Nanosecond)
			requireDoor(t, a.svc, resp.SessionToken, fleet.DoorReport, nil)
		})
	})
}
