package fleet_test

import (
	"log/slog"
	"sync"
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

// listeningStore records what the peer watch last told the store.
type listeningStore struct {
	*models.FleetStore
	mu     sync.Mutex
	others *bool
}

func (s *listeningStore) OthersListening(present bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.others = &present
	s.FleetStore.OthersListening(present)
}

// told answers what the store was last told ("unknown" before anything).
func (s *listeningStore) told() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.others == nil:
		return "unknown"
	case *s.others:
		return "others listen"
	}
	return "alone"
}

// TestLoneReplicaAnnouncesNothing: a replica whose look finds no other
// fresh heartbeat tells its store nobody else listens (so it stops sending
// the notifications that only wake readers); another replica's heartbeat,
// or its listener's greeting (heard before its first heartbeat), says
// somebody does, and a greeting counts for as long as a heartbeat would.
func TestLoneReplicaAnnouncesNothing(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		if db.Dialect != models.Postgres {
			t.Skip("several replicas need Postgres (DECISIONS.md §23)")
		}
		store := &listeningStore{FleetStore: models.NewFleetStore(db, "lone", nil)}
		c := newClock()
		m := metrics.New(nil)
		svc := fleet.New(fleet.Options{Store: store, Keys: keys.NewRing(testKey), Now: c.Now, Metrics: m, CrossReplica: true,
			Logger: slog.New(slog.DiscardHandler), Settings: fleet.Settings{PublicURL: "https://cp.example", ReplicaID: "lone"}})
		t0 := c.Now()
		at := func(d time.Duration) time.Time { return t0.Add(d) }
		look := func(now time.Duration, want string, peers float64, why string) {
			t.Helper()
			fleet.WatchPeers(svc, at(now))
			require.Equal(t, want, store.told(), why)
			require.Equal(t, peers, testutil.ToFloat64(m.ReplicaPeers), why)
		}

		require.Equal(t, "unknown", store.told(), "nothing said before the first look")
		require.NoError(t, store.PublishSessions(ctx, "lone", at(0), at(0), nil))
		look(0, "alone", 0, "its own row is no peer")
		require.NoError(t, store.PublishSessions(ctx, "p1", at(1*time.Second), at(1*time.Second), nil))
		require.NoError(t, store.PublishSessions(ctx, "p2", at(2*time.Second), at(2*time.Second), nil))
		look(5*time.Second, "others listen", 2, "p1 and p2 beat 4 and 3 s ago")
		look(20*time.Second, "alone", 0, "their heartbeats lapsed")

		c.Set(at(30 * time.Second))
		svc.Deliver([]fleet.Notification{{Kind: fleet.NotifyPeer}}, "notify")
		require.Equal(t, "others listen", store.told(), "a greeting: at once")
		look(40*time.Second, "others listen", 0, "greeted 10 s ago, no heartbeat yet")
		look(46*time.Second, "alone", 0, "greeted 16 s ago and no heartbeat came")
	})
}
