package fleet

import (
	"context"
	"time"
)

// SetWarmPage sets how many nodes a warm-up reads at a time; call it before
// the service's first warm-up.
func SetWarmPage(s *Service, n int) { s.warmPage = n }

// WatchPeers runs one look of the peer watch at now (publishLoop's, for a
// service whose Run was not started).
func WatchPeers(s *Service, now time.Time) { s.watchPeers(context.Background(), now) }

// PublishSessions writes this replica's row whole once, as publishLoop's
// first turn does.
func PublishSessions(s *Service, now time.Time) error {
	return s.publishSessions(context.Background(), &sessionPublisher{started: now}, now)
}
