package secrets

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strings"
	"time"

	"github.com/nodeward/nodeward/errcode"
)

// RevealPrefix starts every reveal handle (version 1); it differs from
// HandlePrefix so neither kind of handle is taken for the other.
const RevealPrefix = "nw-reveal:v1:"

// RevealTTL is how long a reveal handle may be redeemed (DECISIONS.md §37).
const RevealTTL = 10 * time.Minute

// Reveal handle states.
const (
	RevealOpen    State = "open"
	RevealSpent   State = "spent"
	RevealExpired State = "expired"
)

// RevealStates are every state a reveal handle may be in.
var RevealStates = []State{RevealOpen, RevealSpent, RevealExpired}

// Reveal audit action and the outcomes of a refused reveal.
const (
	ActionReveal = "reveal"

	OutcomeSpent    = "spent"
	OutcomeExpired  = "expired"
	OutcomeNotReady = "not_ready"
	// OutcomeReplayed is a generated secret shown again, without a
	// handle, to its submitter replaying the request (an administrator's
	// identical enrollment token, DECISIONS.md §5, §35).
	OutcomeReplayed = "replayed"
)

// AuditShownAgain records that the value of the operation's generated
// secret field was shown again to p, its submitter, replaying request
// requestID: a secret shown is audited however it was shown.
func (s *Service) AuditShownAgain(ctx context.Context, p Principal, requestID, operationID, field string) error {
	return s.store.InsertAudit(ctx, AuditEntry{At: s.clock(), Action: ActionReveal, Outcome: OutcomeReplayed, Principal: p,
		RequestID: requestID, OperationID: operationID, Field: field})
}

// Reveal is one stored reveal handle: a secret an operation generates,
// redeemable once by its submitter. The value is never stored (it is
// produced again from the operation's result when redeemed); the handle is
// kept encrypted (Box) so a replay of the submitting request answers the
// same handle, and named by its digest.
type Reveal struct {
	Digest      string
	Principal   Principal
	RequestID   string
	OperationID string
	Field       string
	KeyID       string
	Box         []byte // the handle, sealed
	State       State
	CreatedAt   time.Time
	ExpiresAt   time.Time
	SpentAt     *time.Time
}

// Errors a reveal answers.
var (
	ErrRevealNotFound = errcode.New(errcode.NotFound, "no such reveal handle")
	ErrRevealDenied   = errcode.New(errcode.PermissionDenied, "only the principal that submitted the operation may reveal its secrets")
	ErrRevealSpent    = errcode.New(errcode.RevealSpent, "this secret was revealed already")
	ErrRevealExpired  = errcode.New(errcode.RevealExpired, "this reveal handle has expired")
)

func revealAAD(digest string) []byte { return []byte("reveal\x00" + digest) }

// MintReveals makes one reveal handle per field for the operation, stores
// them in tx (the submitting transaction) and answers field → handle.
func (s *Service) MintReveals(ctx context.Context, tx Tx, p Principal, requestID, operationID string, fields []string) (map[string]string, error) {
	now := s.clock()
	out := make(map[string]string, len(fields))
	rs := make([]Reveal, 0, len(fields))
	for _, f := range fields {
		raw := make([]byte, 32)
		if _, err := rand.Read(raw); err != nil {
			return nil, err
		}
		handle := RevealPrefix + base64.RawURLEncoding.EncodeToString(raw)
		digest := Digest(handle)
		kid, box, err := s.seal([]byte(handle), revealAAD(digest))
		if err != nil {
			return nil, err
		}
		out[f] = handle
		rs = append(rs, Reveal{Digest: digest, Principal: p, RequestID: requestID, OperationID: operationID,
			Field: f, KeyID: kid, Box: box, State: RevealOpen, CreatedAt: now, ExpiresAt: now.Add(RevealTTL)})
	}
	return out, tx.InsertReveals(ctx, rs...)
}

// RevealHandles answers the handles minted for the operation's submitter,
// field → handle, while they are within their TTL (a replay of the
// submitting request answers the same ones); nil when there are none.
func (s *Service) RevealHandles(ctx context.Context, p Principal, operationID string) (map[string]string, error) {
	rs, err := s.store.RevealsOf(ctx, operationID)
	if err != nil {
		return nil, err
	}
	now := s.clock()
	var out map[string]string
	for _, r := range rs {
		if r.Principal != p || !now.Before(r.ExpiresAt) {
			continue
		}
		h, err := s.open(r.KeyID, r.Box, revealAAD(r.Digest))
		if err != nil {
			return nil, err
		}
		if out == nil {
			out = map[string]string{}
		}
		out[r.Field] = string(h)
	}
	return out, nil
}

// Redeem answers a reveal handle's field and value, once, to the principal
// that submitted its operation; produce makes the value from the
// operation (it is never stored) and answers a *errcode.Error (say
// conflict while the operation has not succeeded) to refuse. Every
// redemption and refusal is audited. Errors: ErrRevealNotFound,
// ErrRevealDenied, ErrRevealSpent, ErrRevealExpired, and produce's.
func (s *Service) Redeem(ctx context.Context, p Principal, handle string, produce func(operationID, field string) (string, error)) (string, string, error) {
	if !strings.HasPrefix(handle, RevealPrefix) || len(handle) > 256 {
		return "", "", ErrRevealNotFound
	}
	digest := Digest(handle)
	r, err := s.store.LookupReveal(ctx, digest)
	if errors.Is(err, ErrNoRows) {
		return "", "", ErrRevealNotFound
	}
	if err != nil {
		return "", "", err
	}
	now := s.clock()
	audit := func(outcome string) AuditEntry {
		return AuditEntry{At: now, Action: ActionReveal, Outcome: outcome, Principal: p, HandleDigest: digest[:16],
			RequestID: r.RequestID, OperationID: r.OperationID, Field: r.Field}
	}
	refuse := func(outcome string, err error) (string, string, error) {
		if aerr := s.store.InsertAudit(ctx, audit(outcome)); aerr != nil {
			return "", "", aerr
		}
		return "", "", err
	}
	switch {
	case r.Principal != p:
		return refuse(OutcomeDenied, ErrRevealDenied)
	case r.State == RevealSpent:
		return refuse(OutcomeSpent, ErrRevealSpent)
	case r.State == RevealExpired || !now.Before(r.ExpiresAt):
		return refuse(OutcomeExpired, ErrRevealExpired)
	}
	value, err := produce(r.OperationID, r.Field)
	var ce *errcode.Error
	if errors.As(err, &ce) {
		return refuse(OutcomeNotReady, err)
	}
	if err != nil {
		return "", "", err
	}
	spent, err := s.store.SpendReveal(ctx, digest, now, audit(OutcomeOK))
	if err != nil {
		return "", "", err
	}
	if !spent {
		// A concurrent redemption won.
		return refuse(OutcomeSpent, ErrRevealSpent)
	}
	return r.Field, value, nil
}
