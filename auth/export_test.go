package auth

// Test hooks for the external tests of this package.

// HoldHashes makes every password hash run fn first, inside its slot (set
// it before the service is used concurrently).
func HoldHashes(s *Service, fn func()) { s.hashes.hold = fn }

// HashPeak answers the most password hashes that ran at once.
func HashPeak(s *Service) int64 { return s.hashes.peak.Load() }

// LimiterSize answers how many keys the login limiter holds.
func LimiterSize(s *Service) int { return s.limiter.size() }

// SharedWaiters answers how many requests joined the store read of
// credential in flight now (0: none in flight).
func SharedWaiters(s *Service, credential string) int {
	s.cache.mu.Lock()
	defer s.cache.mu.Unlock()
	if f, ok := s.cache.flights[keyOf(credential)]; ok {
		return f.waiters
	}
	return 0
}
