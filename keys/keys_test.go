package keys_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/keys"
)

var (
	masterA = bytes.Repeat([]byte{0xA}, 32)
	masterB = bytes.Repeat([]byte{0xB}, 32)
)

func claims(now time.Time, aud string) jwt.RegisteredClaims {
	return jwt.RegisteredClaims{Subject: "n1", Audience: jwt.ClaimStrings{aud}, IssuedAt: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(now.Add(time.Minute))}
}

func TestEmptyKeyRefusesEverything(t *testing.T) {
	empty := keys.NewRing()
	s := keys.NewSigner(empty, keys.LabelNodeSession, "aud", "node+jwt", nil)
	_, err := s.Sign(claims(time.Now(), "aud"))
	require.ErrorIs(t, err, keys.ErrNoKey)
	// A token signed by a real key does not verify against no key.
	tok, err := keys.NewSigner(keys.NewRing(masterA), keys.LabelNodeSession, "aud", "node+jwt", nil).Sign(claims(time.Now(), "aud"))
	require.NoError(t, err)
	var c jwt.RegisteredClaims
	require.ErrorIs(t, s.Verify(tok, &c), keys.ErrTokenInvalid)
}

func TestFamiliesDoNotCrossVerify(t *testing.T) {
	ring := keys.NewRing(masterA)
	node := keys.NewSigner(ring, keys.LabelNodeSession, "aud", "node+jwt", nil)
	console := keys.NewSigner(ring, keys.LabelConsoleSession, "aud", "node+jwt", nil)
	tok, err := console.Sign(claims(time.Now(), "aud"))
	require.NoError(t, err)
	var c jwt.RegisteredClaims
	require.ErrorIs(t, node.Verify(tok, &c), keys.ErrTokenInvalid, "a console token is not a node token even with the same audience and type")
	a, _ := ring.Current(keys.LabelNodeSession)
	b, _ := ring.Current(keys.LabelConsoleSession)
	require.NotEqual(t, a.Key, b.Key)
	require.NotEqual(t, a.ID, b.ID)
}

func TestPinnedAudienceTypeAndAlgorithm(t *testing.T) {
	ring := keys.NewRing(masterA)
	s := keys.NewSigner(ring, keys.LabelNodeSession, "nodes", "node+jwt", nil)
	var c jwt.RegisteredClaims
	other, err := keys.NewSigner(ring, keys.LabelNodeSession, "others", "node+jwt", nil).Sign(claims(time.Now(), "others"))
	require.NoError(t, err)
	require.ErrorIs(t, s.Verify(other, &c), keys.ErrTokenInvalid, "audience")
	typed, err := keys.NewSigner(ring, keys.LabelNodeSession, "nodes", "enroll+jwt", nil).Sign(claims(time.Now(), "nodes"))
	require.NoError(t, err)
	require.ErrorIs(t, s.Verify(typed, &c), keys.ErrTokenInvalid, "type")
	none, err := jwt.NewWithClaims(jwt.SigningMethodNone, claims(time.Now(), "nodes")).SignedString(jwt.UnsafeAllowNoneSignatureType)
	require.NoError(t, err)
	require.ErrorIs(t, s.Verify(none, &c), keys.ErrTokenInvalid, "alg none")
	sk, _ := ring.Current(keys.LabelNodeSession)
	hs512 := jwt.NewWithClaims(jwt.SigningMethodHS512, claims(time.Now(), "nodes"))
	hs512.Header["kid"], hs512.Header["typ"] = sk.ID, "node+jwt"
	signed, err := hs512.SignedString(sk.Key)
	require.NoError(t, err)
	require.ErrorIs(t, s.Verify(signed, &c), keys.ErrTokenInvalid, "algorithm other than HS256")
}

func TestExpiryWithLeeway(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := now
	s := keys.NewSigner(keys.NewRing(masterA), keys.LabelNodeSession, "aud", "node+jwt", func() time.Time { return clock })
	tok, err := s.Sign(claims(now, "aud"))
	require.NoError(t, err)
	var c jwt.RegisteredClaims
	clock = now.Add(time.Minute + keys.Leeway - time.Nanosecond)
	require.NoError(t, s.Verify(tok, &c))
	clock = now.Add(time.Minute + keys.Leeway)
	require.ErrorIs(t, s.Verify(tok, &c), keys.ErrTokenInvalid)
}

func TestRotationKeepsOldKeysForVerification(t *testing.T) {
	old := keys.NewSigner(keys.NewRing(masterA), keys.LabelNodeSession, "aud", "node+jwt", nil)
	tok, err := old.Sign(claims(time.Now(), "aud"))
	require.NoError(t, err)
	rotated := keys.NewSigner(keys.NewRing(masterB, masterA), keys.LabelNodeSession, "aud", "node+jwt", nil)
	var c jwt.RegisteredClaims
	require.NoError(t, rotated.Verify(tok, &c), "old tokens verify after rotation")
	fresh, err := rotated.Sign(claims(time.Now(), "aud"))
	require.NoError(t, err)
	require.ErrorIs(t, old.Verify(fresh, &c), keys.ErrTokenInvalid, "the new key signs")
	dropped := keys.NewSigner(keys.NewRing(masterB), keys.LabelNodeSession, "aud", "node+jwt", nil)
	require.ErrorIs(t, dropped.Verify(tok, &c), keys.ErrTokenInvalid, "a removed key no longer verifies")
}

func TestParseRing(t *testing.T) {
	ring, err := keys.ParseRing("# current\n" + "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a\n\n" +
		"0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b\n")
	require.NoError(t, err)
	cur, err := ring.Current(keys.LabelSealing)
	require.NoError(t, err)
	want, _ := keys.NewRing(masterA).Current(keys.LabelSealing)
	require.Equal(t, want, cur)
	_, err = keys.ParseRing("abcd")
	require.Error(t, err)
	require.False(t, errors.Is(err, keys.ErrNoKey))
	empty, err := keys.ParseRing("\n# nothing\n")
	require.NoError(t, err)
	require.True(t, empty.Empty())
}

// TestSealingSubkeyIsSeparate: the key that encrypts sealed secrets is
// none of the signing keys, so a leaked session or enrollment key opens
// no secret (and the other way round).
func TestSealingSubkeyIsSeparate(t *testing.T) {
	ring := keys.NewRing(masterA)
	seal, err := ring.Current(keys.LabelSealing)
	require.NoError(t, err)
	for _, label := range []string{keys.LabelNodeSession, keys.LabelConsoleSession, keys.LabelNodeEnrollment, keys.LabelPackageHostToken} {
		other, err := ring.Current(label)
		require.NoError(t, err)
		require.NotEqual(t, seal.Key, other.Key, label)
		require.NotEqual(t, seal.ID, other.ID, label)
	}
	require.NotEqual(t, masterA, seal.Key, "the master key itself is never used")
}

// TestRecheckAgreesWithVerify: a remembered token's stamp is judged
// exactly as Verify judges the token, at every instant around each bound
// (leeway included), and only while its key is in the ring.
func TestRecheckAgreesWithVerify(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var now time.Time
	clock := func() time.Time { return now }
	ring := keys.NewRing(masterA)
	s := keys.NewSigner(ring, keys.LabelNodeSession, "nodes", "node+jwt", clock)
	c := claims(t0, "nodes")
	c.NotBefore = jwt.NewNumericDate(t0.Add(10 * time.Second))
	withNbf, err := s.Sign(c)
	require.NoError(t, err)
	plain, err := s.Sign(claims(t0, "nodes"))
	require.NoError(t, err)
	for _, tok := range []string{withNbf, plain} {
		now = t0.Add(20 * time.Second)
		var got jwt.RegisteredClaims
		st, err := s.VerifyStamp(tok, &got)
		require.NoError(t, err)
		sk, _ := ring.Current(keys.LabelNodeSession)
		require.Equal(t, sk.ID, st.KeyID)
		require.True(t, st.Expires.Equal(t0.Add(time.Minute)))
		var instants []time.Time
		for _, bound := range []time.Time{t0.Add(-keys.Leeway), t0.Add(10*time.Second - keys.Leeway), t0.Add(time.Minute + keys.Leeway)} {
			for _, d := range []time.Duration{-time.Second, -time.Nanosecond, 0, time.Nanosecond, time.Second} {
				instants = append(instants, bound.Add(d))
			}
		}
		for _, at := range instants {
			now = at
			var c2 jwt.RegisteredClaims
			want := s.Verify(tok, &c2)
			got := s.Recheck(st)
			require.Equal(t, want == nil, got == nil, "at %v: Verify %v, Recheck %v", at.Sub(t0), want, got)
			if got != nil {
				require.ErrorIs(t, got, keys.ErrTokenInvalid)
			}
		}
	}
	// After a rotation (a new ring), the stamp holds while its key is kept
	// for verification and not once the key is gone.
	now = t0.Add(20 * time.Second)
	var c3 jwt.RegisteredClaims
	st, err := s.VerifyStamp(plain, &c3)
	require.NoError(t, err)
	kept := keys.NewSigner(keys.NewRing(masterB, masterA), keys.LabelNodeSession, "nodes", "node+jwt", clock)
	require.NoError(t, kept.Recheck(st))
	gone := keys.NewSigner(keys.NewRing(masterB), keys.LabelNodeSession, "nodes", "node+jwt", clock)
	require.ErrorIs(t, gone.Recheck(st), keys.ErrTokenInvalid)
	require.ErrorIs(t, keys.NewSigner(keys.NewRing(), keys.LabelNodeSession, "nodes", "node+jwt", clock).Recheck(st), keys.ErrTokenInvalid)
}
