package fleet

import (
	"context"
	"maps"
	"slices"
	"time"
)

// watchPeers notices, at each publish tick, another replica whose
// heartbeat lapsed (it died, or lost the database) or that started again
// (a new start time: it died and came back within a tick), and then
// resyncs this replica: its node cache and due-work memo are dropped and
// every held long-poll reads again. A replica sends some notifications
// only after the commit that made them (Notification.MayFollowCommit); one
// that died in between never sent them, and without this the work they
// announced would wait for this replica's own fallbacks (a poll's next
// read, the memo's age). The first look only learns who is there.
//
// It also tells the store whether anybody else listens: a replica with no
// fresh peer and no greeting within sessionsFreshFor sends no
// notifications that only wake readers (Store.OthersListening). Freshness
// compares another replica's clock with this one's, as sessions and
// leases already do: clocks must agree within seconds.
func (s *Service) watchPeers(ctx context.Context, now time.Time) {
	rows, err := s.store.Replicas(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("read the other replicas' heartbeats", "err", err)
		}
		return
	}
	fresh := make(map[string]time.Time, len(rows))
	for _, r := range rows {
		if r.ID != s.settings.ReplicaID && now.Sub(r.HeartbeatAt) <= sessionsFreshFor {
			fresh[r.ID] = r.StartedAt
		}
	}
	s.metrics.ReplicaPeers.Set(float64(len(fresh)))
	// A greeting heard after now (during the read) is counted too.
	greeted := now.Sub(time.Unix(0, s.greetedAt.Load())) <= sessionsFreshFor
	s.store.OthersListening(len(fresh) > 0 || greeted)
	var gone []string
	for id, started := range s.peers {
		if st, ok := fresh[id]; !ok || !st.Equal(started) {
			gone = append(gone, id)
		}
	}
	first := s.peers == nil
	s.peers = fresh
	if first || len(gone) == 0 {
		return
	}
	slices.Sort(gone)
	s.metrics.PeerResyncs.Inc()
	s.log.Info("replicas gone or restarted: reading again what they may not have announced",
		"replicas", gone, "still_here", slices.Sorted(maps.Keys(fresh)))
	s.Deliver([]Notification{{Kind: NotifyResync}}, "peer")
}
