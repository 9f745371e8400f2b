package secrets

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/url"
	"time"

	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/internal/dbtime"
	"github.com/nodeward/nodeward/keys"
)

// Options builds a Service.
type Options struct {
	Store Store
	Keys  *keys.Ring
	Now   func() time.Time
	// MaxLive overrides DefaultMaxLive when > 0.
	MaxLive int
	Logger  *slog.Logger
}

// Service seals and resolves values.
type Service struct {
	store   Store
	keys    *keys.Ring
	now     func() time.Time
	maxLive int
	log     *slog.Logger
}

// New returns the secrets service.
func New(o Options) *Service {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.MaxLive <= 0 {
		o.MaxLive = DefaultMaxLive
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &Service{store: o.Store, keys: o.Keys, now: o.Now, maxLive: o.MaxLive, log: o.Logger}
}

func (s *Service) clock() time.Time { return dbtime.Norm(s.now()) }

// SealRequest is what to seal and for what.
type SealRequest struct {
	RequestID string
	Target    Target
	Field     string
	Value     string
	// TTL is the handle's lifetime; zero is DefaultTTL.
	TTL time.Duration
}

// Receipt is a sealed value's handle. The handle is answered once and
// never stored.
type Receipt struct {
	Handle    string
	ExpiresAt time.Time
}

// Seal stores the value encrypted and answers its handle. Errors:
// validation_failed naming the field (nothing stored), quota_exceeded.
func (s *Service) Seal(ctx context.Context, p Principal, req SealRequest) (Receipt, error) {
	var v errcode.Validation
	v.Check(validRequestID(req.RequestID), "request_id", "required: 1-128 characters of letters, digits, '.', '_', ':' or '-'")
	checkTarget(&v, req.Target)
	v.Check(len(req.Field) <= 1024 && ValidPointer(req.Field), "field", "required: a JSON pointer (RFC 6901) into the operation, such as /env/NAME")
	v.Check(len(req.Value) >= 1 && len(req.Value) <= MaxValueSize, "value", "1 to %d bytes", MaxValueSize)
	ttl := req.TTL
	if ttl == 0 {
		ttl = DefaultTTL
	}
	v.Check(ttl >= time.Second && ttl <= MaxTTL, "ttl_seconds", "1 to %d", int(MaxTTL/time.Second))
	if err := v.Err(); err != nil {
		return Receipt{}, err
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return Receipt{}, err
	}
	handle := HandlePrefix + base64.RawURLEncoding.EncodeToString(raw)
	digest := Digest(handle)
	kid, box, err := s.seal([]byte(req.Value), sealedAAD(digest))
	if err != nil {
		return Receipt{}, err
	}
	now := s.clock()
	rec := Sealed{Digest: digest, Principal: p, RequestID: req.RequestID, Target: req.Target, Field: req.Field,
		KeyID: kid, Box: box, State: StateSealed, CreatedAt: now, ExpiresAt: now.Add(ttl)}
	a := AuditEntry{At: now, Action: ActionSeal, Outcome: OutcomeOK, Principal: p, HandleDigest: digest[:16],
		RequestID: req.RequestID, Target: req.Target, Field: req.Field}
	if err := s.store.Seal(ctx, rec, a, s.maxLive); err != nil {
		if errors.Is(err, ErrQuota) {
			return Receipt{}, errcode.Errorf(errcode.QuotaExceeded, "at most %d sealed values may be live at once; use or let some expire first", s.maxLive)
		}
		return Receipt{}, err
	}
	return Receipt{Handle: handle, ExpiresAt: rec.ExpiresAt}, nil
}

func checkTarget(v *errcode.Validation, t Target) {
	switch t.Kind {
	case TargetFleet:
		v.Check(t.ID == "", "target/id", "must be absent for the fleet")
	case TargetNode, TargetPackageHost:
		v.Check(t.ID != "" && len(t.ID) <= 256, "target/id", "required: 1-256 characters")
	case TargetEndpoint:
		u, err := url.Parse(t.ID)
		v.Check(len(t.ID) <= 2048 && err == nil && (u.Scheme == "https" || u.Scheme == "http") && u.Host != "",
			"target/id", "required: an http or https URL")
	default:
		v.Add("target/kind", "one of fleet, node, endpoint, package_host")
	}
}

func validRequestID(s string) bool {
	if len(s) < 1 || len(s) > 128 {
		return false
	}
	for _, c := range []byte(s) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-'
		if !ok {
			return false
		}
	}
	return true
}

// Digest is the stored name of a handle: SHA-256, hex.
func Digest(handle string) string {
	sum := sha256.Sum256([]byte(handle))
	return hex.EncodeToString(sum[:])
}

// The additional data binds a ciphertext to its row: a box moved to
// another handle or operation does not open.
func sealedAAD(digest string) []byte { return []byte("sealed\x00" + digest) }

func deliveryAAD(operationID, field string) []byte {
	return []byte("delivery\x00" + operationID + "\x00" + field)
}

// seal encrypts under the current sealing subkey with a fresh nonce and
// answers the key's id and nonce||ciphertext.
func (s *Service) seal(plain, aad []byte) (string, []byte, error) {
	sk, err := s.keys.Current(keys.LabelSealing)
	if err != nil {
		return "", nil, err
	}
	gcm, err := newGCM(sk.Key)
	if err != nil {
		return "", nil, err
	}
	nonce := make([]byte, gcm.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", nil, err
	}
	return sk.ID, gcm.Seal(nonce, nonce, plain, aad), nil
}

// open decrypts a box sealed under the key kid, from any key of the ring
// (so rotation keeps older values readable).
func (s *Service) open(kid string, box, aad []byte) ([]byte, error) {
	sk, err := s.keys.Lookup(keys.LabelSealing, kid)
	if err != nil {
		return nil, err
	}
	gcm, err := newGCM(sk.Key)
	if err != nil {
		return nil, err
	}
	if len(box) < gcm.NonceSize() {
		return nil, errors.New("sealed box too short")
	}
	return gcm.Open(nil, box[:gcm.NonceSize()], box[gcm.NonceSize():], aad)
}

func newGCM(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// Audit answers the audit rows f selects, newest first, below the cursor
// f.Before (0: the newest), at most f.Limit.
func (s *Service) Audit(ctx context.Context, f AuditFilter) ([]AuditEntry, error) {
	return s.store.Audit(ctx, f)
}

// Sweep purges expired handles (auditing each unused one), expires
// reveal handles past their TTL (auditing each), and the
// resolved values of operations that ended (nothing is left to deliver),
// in batches until none is left; it answers how many handles went.
func (s *Service) Sweep(ctx context.Context) (int, error) {
	total := 0
	for {
		n, err := s.store.Purge(ctx, s.clock(), 500)
		total += n
		if err != nil {
			return total, err
		}
		if n < 500 {
			break
		}
	}
	for {
		// Expired reveal handles are kept a day, so a late redemption
		// answers reveal_expired rather than not_found.
		n, err := s.store.ExpireReveals(ctx, s.clock(), 24*time.Hour, 500)
		if err != nil {
			return total, err
		}
		if n < 500 {
			break
		}
	}
	for {
		n, err := s.store.PurgeDeliveries(ctx, s.clock().Add(-LaunchValuesKept), 500)
		if err != nil || n < 500 {
			return total, err
		}
	}
}

// RunSweeper sweeps every interval until ctx ends.
func (s *Service) RunSweeper(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("sweep expired sealed values", "err", err)
			}
		}
	}
}
