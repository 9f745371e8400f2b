package auth

// Test hooks for the external tests of this package.

// HoldHashes makes every password hash run fn first, inside its slot (set
// it before the service is used concurrently).
func HoldHashes(s *Service, fn func()) { s.hashes.hold = fn }

// HashPeak answers the most password hashes that ran at once.
func HashPeak(s *Service) int64 { return s.hashes.peak.Load() }

// LimiterSize answers how many keys the login limiter holds.
func LimiterSize(s *Service) int { return s.limiter.size() }
