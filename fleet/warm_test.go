package fleet_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/testwait"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// TestWarmUpAfterNotifierBack: when a replica's notifications start to
// flow (its start, or the listener's reconnection — both leave its memos
// empty) one paged read fills the node cache and the due-work memo, so
// the fleet's redialing agents cost no read each: a quiet node's door and
// held poll read nothing; a node with a pending command, or a
// configuration it has not applied, is not taken as quiet and its poll
// reads and is answered; an applied configuration is quiet; a retired
// node is left to its own read. Pages are small here, so the read spans
// several.
func TestWarmUpAfterNotifierBack(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b := crossReplica(t, db, "warm", false, nil)
		svc, m := b.svc, b.metrics
		fleet.SetWarmPage(svc, 2) // before its first warm-up: it starts with none

		// Made while notifications may be missed: nothing is kept of it.
		_, quietSess, quietTok := b.readyNode(t)
		pending, pendingSess, pendingTok := b.readyNode(t)
		b.issue(t, pending, launch("warm-pending"))
		applied, appliedSess, appliedTok := b.readyNode(t)
		cfg := b.configure(t, applied, `{"a":1}`, false)
		require.NotNil(t, b.pollNow(t, appliedSess).Config)
		b.reportConfig(t, appliedSess, cfg.Revision, cfg.Hash, "applied", "")
		unapplied, unappliedSess, unappliedTok := b.readyNode(t)
		b.configure(t, unapplied, `{"b":2}`, false)
		retired, _, retiredTok := b.readyNode(t)
		_, err := svc.Retire(ctx, "admin:test", retired, "gone")
		require.NoError(t, err)

		svc.SetNotifierHealthy(true)
		testwait.For(t, "the warm-up", testwait.Patience, func() bool { return testutil.ToFloat64(m.NodesWarmed) >= 4 })
		require.Equal(t, 4.0, testutil.ToFloat64(m.NodesWarmed), "every node but the retired one")

		for _, tok := range []string{quietTok, pendingTok, appliedTok, unappliedTok} {
			requireNodeReads(t, m, 0, "a warmed node's door", func() { requireDoor(t, svc, tok, fleet.DoorAsk, nil) })
		}
		requireNodeReads(t, m, 1, "a retired node's door", func() { requireDoor(t, svc, retiredTok, fleet.DoorAsk, fleet.ErrNodeRetired) })
		requireReads(t, svc, m, quietSess, false, 0, 1, "quiet")
		requireReads(t, svc, m, appliedSess, false, 0, 1, "its configuration applied")
		a := requireAnswer(t, svc, m, pendingSess, false, 1, 0, "a pending command")
		require.Equal(t, []string{"warm-pending"}, ops(a.Commands))
		a = requireAnswer(t, svc, m, unappliedSess, false, 1, 0, "a configuration to deliver")
		require.NotNil(t, a.Config)

		// The listener drops and comes back: everything is forgotten, then
		// warmed again.
		svc.SetNotifierHealthy(false)
		svc.SetNotifierHealthy(true)
		testwait.For(t, "the second warm-up", testwait.Patience, func() bool { return testutil.ToFloat64(m.NodesWarmed) >= 8 })
		requireNodeReads(t, m, 0, "warmed again", func() { requireDoor(t, svc, quietTok, fleet.DoorAsk, nil) })
		requireReads(t, svc, m, quietSess, false, 0, 1, "quiet again")
	})
}

// gatedStore holds a warm-up's reads until the test lets them go.
type gatedStore struct {
	*models.FleetStore
	entered chan struct{}
	release chan struct{}
}

func (g *gatedStore) NodesAtRest(ctx context.Context, after string, limit int) ([]fleet.NodeAtRest, error) {
	select {
	case g.entered <- struct{}{}:
	default:
	}
	<-g.release
	return g.FleetStore.NodesAtRest(ctx, after, limit)
}

// TestWarmUpWaitedFor: an agent arriving while the warm-up's read is in
// flight (a fleet redialing a restarted replica comes at once) waits for
// it instead of reading its node alone, and its resuming poll, its node
// quiet, reads nothing either.
func TestWarmUpWaitedFor(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		var store *gatedStore
		b := crossReplica(t, db, "warm-wait", false, func(fs *models.FleetStore) fleet.Store {
			store = &gatedStore{FleetStore: fs, entered: make(chan struct{}, 1), release: make(chan struct{})}
			return store
		})
		svc, m := b.svc, b.metrics
		_, sess, tok := b.readyNode(t)

		svc.SetNotifierHealthy(true)
		<-store.entered
		door := make(chan error, 1)
		r0 := nodeReads(m)
		go func() { _, err := svc.Authenticate(ctx, tok, fleet.DoorAsk); door <- err }()
		select {
		case err := <-door:
			t.Fatalf("the door answered (%v) before the warm-up's read ended", err)
		case <-time.After(50 * time.Millisecond):
		}
		close(store.release)
		require.NoError(t, <-door)
		require.Equal(t, 0.0, nodeReads(m)-r0, "the door read nothing: the warm-up answered it")
		requireReads(t, svc, m, sess, true, 0, 1, "a resuming poll of a warmed quiet node")
	})
}
