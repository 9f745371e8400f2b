package fleet_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/keys"
	"github.com/nodeward/nodeward/metrics"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// TestPeerGoneOrRestartedResyncs: a replica resyncs when another one's
// heartbeat lapses or it starts again — what that one committed but had
// not announced yet is read instead of waited for — and not when one
// appears, keeps beating, or was already counted gone; its own row is
// never a peer. The first look only learns who is there.
func TestPeerGoneOrRestartedResyncs(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		if db.Dialect != models.Postgres {
			t.Skip("several replicas need Postgres (DECISIONS.md §23)")
		}
		store := models.NewFleetStore(db, "watcher", nil)
		m := metrics.New(nil)
		c := newClock()
		svc := fleet.New(fleet.Options{Store: store, Keys: keys.NewRing(testKey), Now: c.Now, Metrics: m, CrossReplica: true,
			Logger: slog.New(slog.DiscardHandler), Settings: fleet.Settings{PublicURL: "https://cp.example", ReplicaID: "watcher"}})
		t0 := c.Now()
		at := func(d time.Duration) time.Time { return t0.Add(d) }
		beat := func(id string, started, now time.Duration) {
			require.NoError(t, store.PublishSessions(ctx, id, at(started), at(now), nil))
		}
		look := func(now time.Duration, want float64, why string) {
			t.Helper()
			fleet.WatchPeers(svc, at(now))
			require.Equal(t, want, testutil.ToFloat64(m.PeerResyncs), why)
		}

		beat("watcher", 0, 0)
		beat("p1", 0, 0)
		look(0, 0, "the first look learns who is there")
		look(5*time.Second, 0, "p1 beat 5 s ago")
		beat("p1", 6*time.Second, 6*time.Second)
		look(7*time.Second, 1, "p1 started again")
		beat("p2", 7*time.Second, 7*time.Second)
		look(8*time.Second, 1, "a replica that appears is no loss")
		beat("p2", 7*time.Second, 20*time.Second)
		look(25*time.Second, 2, "p1's heartbeat lapsed (19 s old)")
		look(26*time.Second, 2, "p1 is already counted gone")
		look(60*time.Second, 3, "p2's heartbeat lapsed too; the watcher's own stale row is not a peer")
	})
}
