package ledger

import (
	"context"
	"encoding/json"
)

// ClaimForTest claims as the dispatcher does, without running anything.
func (s *Service) ClaimForTest(ctx context.Context, n int) ([]Operation, error) {
	return s.claim(ctx, n)
}

// ExecuteForTest runs a claimed operation as the dispatcher does.
func (s *Service) ExecuteForTest(ctx context.Context, op Operation) {
	if then := s.execute(ctx, op); then != nil {
		then()
	}
}

// HeardForTest counts the changes kept for claimed runs not yet started.
func (s *Service) HeardForTest() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.heard)
}

// AdvanceForTest advances a fan-out parent once, as a child's end or the
// sweep does.
func (s *Service) AdvanceForTest(ctx context.Context, parentID string) error {
	_, err := s.advance(ctx, parentID, false)
	return err
}

// RecordForTest records the commands of released children (ids) in one
// transaction of its own, as one write lane of a fan-out's recording does.
func (s *Service) RecordForTest(ctx context.Context, ids []string) error {
	return s.store.Tx(ctx, func(tx Tx) error { return s.recordTx(ctx, tx, ids) })
}

// RecordingForTest reports whether this replica is recording the
// fan-out's children now (its recording has not returned).
func (s *Service) RecordingForTest(parentID string) bool { return s.recordingHere(parentID) }

// RecordChunks is recordChunks.
var RecordChunks = recordChunks

// MayWriteMuch is mayWriteMuch for the external tests.
var MayWriteMuch = mayWriteMuch

// DigestInTurn digests requests in turn through one requestDigester (a
// fan-out's children), each operation already canonical.
func DigestInTurn(kinds []string, targets [][]Target, ops []json.RawMessage) ([]string, error) {
	var d requestDigester
	out := make([]string, len(kinds))
	for i := range kinds {
		var err error
		if out[i], err = d.digest(kinds[i], targets[i], ops[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}
