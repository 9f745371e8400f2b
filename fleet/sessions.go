package fleet

import (
	"context"
	"crypto/sha256"
	"errors"
	"time"
	"unsafe"

	"github.com/golang-jwt/jwt/v5"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
)

// enrollClaims are an enrollment token's claims: the invitation id (jti),
// node (sub), generation and window. Stored as an invitation row, they let
// the server re-mint the identical token (HS256 is deterministic).
type enrollClaims struct {
	jwt.RegisteredClaims
	Generation int64 `json:"gen"`
}

// sessionClaims bind a session credential to one node at one fencing token.
type sessionClaims struct {
	jwt.RegisteredClaims
	Fencing int64 `json:"fen"`
}

func (s *Service) mintEnrollment(inv Invitation) (string, error) {
	return s.enrollSigner.Sign(enrollClaims{
		RegisteredClaims: jwt.RegisteredClaims{
			ID:        inv.ID,
			Subject:   inv.NodeID,
			Audience:  jwt.ClaimStrings{s.enrollSigner.Audience()},
			IssuedAt:  jwt.NewNumericDate(inv.IssuedAt),
			ExpiresAt: jwt.NewNumericDate(inv.ExpiresAt),
		},
		Generation: inv.Generation,
	})
}

// mintSession answers a session credential for the node at fencing, with
// its exact expiry (the whole second the token carries).
func (s *Service) mintSession(nodeID string, fencing int64) (api.RenewResponse, error) {
	now := s.now()
	exp := now.Add(s.settings.SessionTTL).Truncate(time.Second).UTC()
	tok, err := s.sessionSigner.Sign(sessionClaims{
		RegisteredClaims: jwt.RegisteredClaims{
			ID:        randomID(),
			Subject:   nodeID,
			Audience:  jwt.ClaimStrings{s.sessionSigner.Audience()},
			IssuedAt:  jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(exp),
		},
		Fencing: fencing,
	})
	if err != nil {
		return api.RenewResponse{}, err
	}
	return api.RenewResponse{SessionToken: tok, SessionExpiresAt: exp, SessionTTLSeconds: int64(exp.Sub(now) / time.Second)}, nil
}

// Session is an authenticated agent: one node at one fencing token.
type Session struct {
	NodeID  string
	Fencing int64
}

// Door says what an agent door needs of the node: asking for something
// needs a live node; reporting what already happened is kept for a retired
// one too.
type Door int

// Doors.
const (
	// DoorAsk: renew, fetch commands. Retired nodes are refused.
	DoorAsk Door = iota
	// DoorReport: results and events. Retired nodes are accepted.
	DoorReport
)

// Authenticate verifies a session credential and checks it against the
// node's current record (never the token alone). Errors: ErrSessionInvalid,
// ErrFenced, ErrNodeRetired (DoorAsk only).
func (s *Service) Authenticate(ctx context.Context, token string, door Door) (Session, error) {
	if token == "" {
		return Session{}, ErrSessionInvalid
	}
	nodeID, fencing, err := s.verifySession(token)
	if err != nil {
		return Session{}, err
	}
	cur, err := s.currentNode(ctx, nodeID)
	if err == nil && cur.fencing < fencing {
		// A token newer than what this replica knows of the node: it was
		// re-enrolled elsewhere and the announcement is still on its way
		// (fencing tokens only grow). Read the node rather than refuse.
		s.cache.forget(nodeID)
		cur, err = s.currentNode(ctx, nodeID)
	}
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return Session{}, ErrSessionInvalid
		}
		return Session{}, err
	}
	if cur.fencing != fencing {
		return Session{}, ErrFenced
	}
	if cur.retired && door == DoorAsk {
		return Session{}, ErrNodeRetired
	}
	return Session{NodeID: nodeID, Fencing: fencing}, nil
}

// verifySession answers a session token's node and fencing token if it is
// valid now: from the session cache when this replica verified it before
// (its key and times rechecked), else by its signature. Errors:
// ErrSessionInvalid.
func (s *Service) verifySession(token string) (string, int64, error) {
	// The token's bytes are hashed in place: []byte(token) would copy
	// them to the heap on every request (Sum256's input escapes), and
	// hashing only reads them.
	key := sha256.Sum256(unsafe.Slice(unsafe.StringData(token), len(token)))
	if e, ok := s.sessions.get(key); ok {
		s.sessionCached.Inc()
		if s.sessionSigner.Recheck(e.stamp) != nil {
			// Refused as Verify would refuse it now (expired, or its
			// key gone); forgotten, so a later request verifies afresh.
			s.sessions.forget(key)
			return "", 0, ErrSessionInvalid
		}
		return e.nodeID, e.fencing, nil
	}
	s.sessionSigns.Inc()
	var c sessionClaims
	st, err := s.sessionSigner.VerifyStamp(token, &c)
	if err != nil || c.Subject == "" || c.Fencing <= 0 {
		return "", 0, ErrSessionInvalid
	}
	s.sessions.put(key, sessionEntry{nodeID: c.Subject, fencing: c.Fencing, stamp: st}, s.clock())
	return c.Subject, c.Fencing, nil
}

// Renew mints a fresh credential from a valid one. It writes nothing: the
// fencing token and the lease are untouched. Errors: as Authenticate.
func (s *Service) Renew(ctx context.Context, token string) (api.RenewResponse, error) {
	sess, err := s.Authenticate(ctx, token, DoorAsk)
	if err != nil {
		return api.RenewResponse{}, err
	}
	return s.mintSession(sess.NodeID, sess.Fencing)
}

var errNoKey = errcode.New(errcode.Unavailable, "signing is disabled: no master key")
