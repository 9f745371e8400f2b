package ledger

import (
	"context"
	"errors"

	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/secrets"
)

func secretsPrincipal(p Principal) secrets.Principal {
	return secrets.Principal{Kind: string(p.Kind), ID: p.ID}
}

// mintReveals makes the submitter's reveal handles for the secrets op's
// kind generates, in the submitting transaction (DECISIONS.md §16).
func (s *Service) mintReveals(ctx context.Context, tx Tx, p Principal, k *Kind, op Operation) (map[string]string, error) {
	if s.secrets == nil || len(k.Reveals) == 0 {
		return nil, nil
	}
	return s.secrets.MintReveals(ctx, tx.Secrets(), secretsPrincipal(p), op.RequestID, op.ID, k.Reveals)
}

// withReveals completes a submit's answer: the reveal handles (read back
// for a replay, within their TTL), and, when inline (the submit that
// recorded the operation waited for it to succeed and asked for them),
// the values, which spends their handles.
func (s *Service) withReveals(ctx context.Context, p Principal, op Operation, inline bool) (Operation, error) {
	k, ok := s.kinds.Kind(op.Kind)
	if s.secrets == nil || !ok || len(k.Reveals) == 0 {
		return op, nil
	}
	if op.Reveals == nil {
		hs, err := s.secrets.RevealHandles(ctx, secretsPrincipal(p), op.ID)
		if err != nil {
			return op, err
		}
		op.Reveals = hs
	}
	if !inline || op.State != StateSucceeded {
		return op, nil
	}
	// The operation in hand has succeeded (just read by the wait): its
	// values are produced from it rather than from a read of it again.
	produce := func(operationID, field string) (string, error) {
		if operationID != op.ID {
			return s.produce(ctx)(operationID, field)
		}
		if k.Reveal == nil {
			return "", errcode.Errorf(errcode.Conflict, "kind %q is not served here", op.Kind)
		}
		return k.Reveal(ctx, op, field)
	}
	for field, handle := range op.Reveals {
		_, value, err := s.secrets.Redeem(ctx, secretsPrincipal(p), handle, produce)
		var ce *errcode.Error
		if errors.As(err, &ce) {
			continue // spent or expired: shown once already
		}
		if err != nil {
			return op, err
		}
		if op.Secrets == nil {
			op.Secrets = map[string]string{}
		}
		op.Secrets[field] = value
	}
	return op, nil
}

// produce makes a reveal's value from its operation: only a succeeded
// operation generated one (conflict otherwise).
func (s *Service) produce(ctx context.Context) func(operationID, field string) (string, error) {
	return func(operationID, field string) (string, error) {
		op, err := s.store.Operation(ctx, operationID)
		if errors.Is(err, ErrNoRows) {
			return "", errcode.New(errcode.Conflict, "the operation is gone; its secret cannot be revealed")
		}
		if err != nil {
			return "", err
		}
		if op.State != StateSucceeded {
			return "", errcode.Errorf(errcode.Conflict, "operation %s is %s; a secret is revealed once it has succeeded", op.ID, op.State)
		}
		k, ok := s.kinds.Kind(op.Kind)
		if !ok || k.Reveal == nil {
			return "", errcode.Errorf(errcode.Conflict, "kind %q is not served here", op.Kind)
		}
		return k.Reveal(ctx, op, field)
	}
}

// Reveal redeems a reveal handle for the principal that submitted its
// operation, once, within its TTL (DECISIONS.md §16, §37; administrators
// too may redeem only their own). Errors: not_found, permission_denied,
// reveal_spent, reveal_expired, conflict (the operation has not
// succeeded; the handle stays open).
func (s *Service) Reveal(ctx context.Context, p Principal, handle string) (field, value string, err error) {
	if s.secrets == nil {
		return "", "", secrets.ErrRevealNotFound
	}
	return s.secrets.Redeem(ctx, secretsPrincipal(p), handle, s.produce(ctx))
}
