package ledger

import "context"

// ClaimForTest claims as the dispatcher does, without running anything.
func (s *Service) ClaimForTest(ctx context.Context, n int) ([]Operation, error) {
	return s.claim(ctx, n)
}

// ExecuteForTest runs a claimed operation as the dispatcher does.
func (s *Service) ExecuteForTest(ctx context.Context, op Operation) { s.execute(ctx, op) }

// HeardForTest counts the changes kept for claimed runs not yet started.
func (s *Service) HeardForTest() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.heard)
}
