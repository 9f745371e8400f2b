package ledger

import (
	"context"
	"encoding/json"
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

// scrubEnd replaces the secret values op used (its own resolved values, or
// its fan-out parent's) by a placeholder in its result, error and
// evidence before they are stored (ARCHITECTURE.md §4 "Scrub"). An
// operation that carried no handle used no value: nothing is read.
// (Generated secrets never reach a result: kinds record results without
// them, and reveals produce them again.)
func (s *Service) scrubEnd(ctx context.Context, tx Tx, op Operation, result json.RawMessage, opErr *Error) (Operation, json.RawMessage, *Error, error) {
	if !s.carriesSecrets(op) {
		return op, result, opErr, nil
	}
	values, err := s.secrets.TxValues(ctx, tx.Secrets(), op.ID, op.ParentID)
	if err != nil || len(values) == 0 {
		return op, result, opErr, err
	}
	result = secrets.ScrubJSON(result, values)
	op.Evidence = secrets.ScrubJSON(op.Evidence, values)
	if opErr != nil {
		e := *opErr
		e.Message = secrets.Scrub(e.Message, values)
		opErr = &e
	}
	return op, result, opErr, nil
}
