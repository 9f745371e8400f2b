package auth

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/argon2"
)

// Argon2id parameters: OWASP's recommended minimum (19 MiB, t=2, p=1), which
// keeps a login well under a second on a small control-plane machine. Each
// hash in flight holds argonMemoryKiB, and at most HashSlots run at once, so
// hashing never holds more than HashSlots × 19 MiB: 38 MiB on a 2-core
// machine, 152 MiB at the 8-slot ceiling of DefaultHashSlots.
const (
	argonMemoryKiB = 19 * 1024
	argonTime      = 2
	argonThreads   = 1
	argonKeyLen    = 32
)

// HashPassword returns an encoded argon2id hash of password with a fresh salt.
func HashPassword(password string) (string, error) {
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return "", err
	}
	sum := argon2.IDKey([]byte(password), salt, argonTime, argonMemoryKiB, argonThreads, argonKeyLen)
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s", argon2.Version, argonMemoryKiB, argonTime, argonThreads,
		base64.RawStdEncoding.EncodeToString(salt), base64.RawStdEncoding.EncodeToString(sum)), nil
}

// CheckPassword reports whether password matches the encoded hash, using the
// parameters stored in the hash (so they can be raised later).
func CheckPassword(encoded, password string) (bool, error) {
	parts := strings.Split(encoded, "$")
	if len(parts) != 6 || parts[1] != "argon2id" {
		return false, errors.New("unsupported password hash")
	}
	var mem, t uint32
	var p uint8
	if _, err := fmt.Sscanf(parts[3], "m=%d,t=%d,p=%d", &mem, &t, &p); err != nil {
		return false, fmt.Errorf("password hash parameters: %w", err)
	}
	salt, err := base64.RawStdEncoding.DecodeString(parts[4])
	if err != nil {
		return false, err
	}
	want, err := base64.RawStdEncoding.DecodeString(parts[5])
	if err != nil {
		return false, err
	}
	got := argon2.IDKey([]byte(password), salt, t, mem, p, uint32(len(want)))
	return subtle.ConstantTimeCompare(got, want) == 1, nil
}

// maxDefaultHashSlots caps DefaultHashSlots, and so hashing memory, on big
// machines.
const maxDefaultHashSlots = 8

// DefaultHashSlots is one hashing slot per usable core, at most 8: more
// hashes at once than cores only adds memory, not throughput.
func DefaultHashSlots() int {
	return min(runtime.GOMAXPROCS(0), maxDefaultHashSlots)
}

// DefaultHashQueueTimeout is how long a password check waits for a slot
// before the login is shed with ErrOverloaded.
const DefaultHashQueueTimeout = 2 * time.Second

// hashGate bounds concurrent password hashes: unbounded, a burst of
// logins (each a full argon2id, known user or not) grows memory by 19 MiB
// a login until the process is killed.
type hashGate struct {
	slots   chan struct{}
	timeout time.Duration
	// inFlight and peak count hashes running now and the most at once.
	inFlight atomic.Int64
	peak     atomic.Int64
	// hold, when set (by tests), runs inside every slot.
	hold func()
}

func newHashGate(slots int, timeout time.Duration) *hashGate {
	return &hashGate{slots: make(chan struct{}, slots), timeout: timeout}
}

// do runs fn in a slot; ErrOverloaded when none came free within the
// queue timeout, the context's error when it ended first.
func (g *hashGate) do(ctx context.Context, fn func()) error {
	timer := time.NewTimer(g.timeout)
	defer timer.Stop()
	select {
	case g.slots <- struct{}{}:
	case <-timer.C:
		return ErrOverloaded
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-g.slots }()
	n := g.inFlight.Add(1)
	defer g.inFlight.Add(-1)
	for p := g.peak.Load(); n > p && !g.peak.CompareAndSwap(p, n); p = g.peak.Load() {
	}
	if g.hold != nil {
		g.hold()
	}
	fn()
	return nil
}

// hashPassword is HashPassword in a hashing slot.
func (s *Service) hashPassword(ctx context.Context, password string) (string, error) {
	var hash string
	var herr error
	if err := s.hashes.do(ctx, func() { hash, herr = HashPassword(password) }); err != nil {
		return "", err
	}
	return hash, herr
}

// checkPassword is CheckPassword in a hashing slot.
func (s *Service) checkPassword(ctx context.Context, encoded, password string) (bool, error) {
	var ok bool
	var cerr error
	if err := s.hashes.do(ctx, func() { ok, cerr = CheckPassword(encoded, password) }); err != nil {
		return false, err
	}
	return ok, cerr
}
