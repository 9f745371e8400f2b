package keys

import (
	"errors"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Leeway is the clock skew JWT validation tolerates (DECISIONS.md §9).
const Leeway = 5 * time.Second

// Signer signs and verifies HS256 JWTs of one credential family: its own
// subkey, its own audience and token type, all pinned on verification.
type Signer struct {
	ring     *Ring
	label    string
	audience string
	typ      string
	now      func() time.Time
}

// NewSigner returns a signer for one family. now may be nil (time.Now).
func NewSigner(ring *Ring, label, audience, typ string, now func() time.Time) *Signer {
	if now == nil {
		now = time.Now
	}
	return &Signer{ring: ring, label: label, audience: audience, typ: typ, now: now}
}

// Audience returns the audience the signer pins.
func (s *Signer) Audience() string { return s.audience }

// Sign returns the compact JWT for claims, setting the audience, the header
// `kid` and `typ`. HS256 is deterministic: the same claims give the same token.
func (s *Signer) Sign(claims jwt.Claims) (string, error) {
	sk, err := s.ring.Current(s.label)
	if err != nil {
		return "", err
	}
	t := jwt.NewWithClaims(jwt.SigningMethodHS256, claims)
	t.Header["kid"] = sk.ID
	t.Header["typ"] = s.typ
	return t.SignedString(sk.Key)
}

// ErrTokenInvalid is returned for every token that does not verify; the
// reason is deliberately not told to the caller.
var ErrTokenInvalid = errors.New("token invalid")

// Verify parses token into claims, pinning algorithm HS256, type, audience
// and expiry (with Leeway). Any failure is ErrTokenInvalid wrapping the reason
// (for logs, never for the caller).
func (s *Signer) Verify(token string, claims jwt.Claims) error {
	_, err := s.VerifyStamp(token, claims)
	return err
}

// Stamp is what a verified token's validity still depends on afterwards:
// the key that signed it and its times. What else Verify checked (the
// signature, algorithm, type, audience) cannot change for the same token,
// so a caller that remembers a verified token need only Recheck its stamp.
type Stamp struct {
	KeyID string
	// Expires, NotBefore and IssuedAt are zero when the token lacks them.
	Expires, NotBefore, IssuedAt time.Time
}

// VerifyStamp is Verify, also answering the token's stamp.
func (s *Signer) VerifyStamp(token string, claims jwt.Claims) (Stamp, error) {
	if s.ring.Empty() {
		return Stamp{}, fmt.Errorf("%w: %w", ErrTokenInvalid, ErrNoKey)
	}
	var st Stamp
	p := jwt.NewParser(
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithAudience(s.audience),
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
		jwt.WithLeeway(Leeway),
		jwt.WithTimeFunc(s.now),
	)
	_, err := p.ParseWithClaims(token, claims, func(t *jwt.Token) (any, error) {
		if typ, _ := t.Header["typ"].(string); typ != s.typ {
			return nil, errors.New("wrong token type")
		}
		kid, _ := t.Header["kid"].(string)
		sk, err := s.ring.Lookup(s.label, kid)
		if err != nil {
			return nil, err
		}
		st.KeyID = sk.ID // the ring's string: remembered stamps share it
		return sk.Key, nil
	})
	if err != nil {
		return Stamp{}, fmt.Errorf("%w: %w", ErrTokenInvalid, err)
	}
	st.Expires = numericTime(claims.GetExpirationTime())
	st.NotBefore = numericTime(claims.GetNotBefore())
	st.IssuedAt = numericTime(claims.GetIssuedAt())
	return st, nil
}

func numericTime(d *jwt.NumericDate, err error) time.Time {
	if d == nil || err != nil {
		return time.Time{}
	}
	return d.Time
}

// Recheck answers what Verify would now say of a token it verified with
// this stamp: its key must still be in the ring, and its times are judged
// against the signer's clock with Leeway exactly as jwt's validator does
// (expiry required, not-before and issued-at when present). Failures are
// ErrTokenInvalid.
func (s *Signer) Recheck(st Stamp) error {
	if s.ring.Empty() {
		return fmt.Errorf("%w: %w", ErrTokenInvalid, ErrNoKey)
	}
	if _, err := s.ring.Lookup(s.label, st.KeyID); err != nil {
		return fmt.Errorf("%w: %w", ErrTokenInvalid, err)
	}
	now := s.now()
	switch {
	case st.Expires.IsZero():
		return fmt.Errorf("%w: %w", ErrTokenInvalid, jwt.ErrTokenRequiredClaimMissing)
	case !now.Before(st.Expires.Add(Leeway)):
		return fmt.Errorf("%w: %w", ErrTokenInvalid, jwt.ErrTokenExpired)
	case !st.NotBefore.IsZero() && now.Before(st.NotBefore.Add(-Leeway)):
		return fmt.Errorf("%w: %w", ErrTokenInvalid, jwt.ErrTokenNotValidYet)
	case !st.IssuedAt.IsZero() && now.Before(st.IssuedAt.Add(-Leeway)):
		return fmt.Errorf("%w: %w", ErrTokenInvalid, jwt.ErrTokenUsedBeforeIssued)
	}
	return nil
}
