package ledger

import (
	"context"
	"errors"

	"github.com/nodeward/nodeward/secrets"
)

// carriesSecrets reports whether op holds handles to resolve as it is
// recorded: such a submission takes the transaction path.
func (s *Service) carriesSecrets(op Operation) bool {
	return s.secrets != nil && secrets.Carries(op.Operation)
}

// resolveSecrets spends the sealed handles op carries, in the submitting
// transaction (ARCHITECTURE.md §4): a refusal rolls everything back, so
// no handle is left used by a submission that recorded nothing.
func (s *Service) resolveSecrets(ctx context.Context, tx Tx, p Principal, k *Kind, op Operation) error {
	if !s.carriesSecrets(op) {
		return nil
	}
	_, err := s.secrets.Resolve(ctx, tx.Secrets(), secrets.Use{
		Principal: secrets.Principal{Kind: string(p.Kind), ID: p.ID},
		RequestID: op.RequestID, OperationID: op.ID,
		Target: secrets.Target{Kind: op.TargetKind, ID: op.TargetID},
		FanOut: k.FanOut != nil, Operation: op.Operation,
	})
	var denied *secrets.Denied
	if errors.As(err, &denied) {
		// A concurrent submission of the same request that won spent the
		// handles: answer its operation (the replay path), not a denial.
		if _, lerr := tx.OperationByRequest(ctx, p, op.RequestID); lerr == nil {
			return ErrDuplicate
		}
	}
	return err
}

// refusedSecrets audits a denied use once its submission rolled back.
func (s *Service) refusedSecrets(ctx context.Context, err error) {
	if s.secrets != nil {
		s.secrets.RecordDenial(ctx, err)
	}
}
