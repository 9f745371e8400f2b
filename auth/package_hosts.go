package auth

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/keys"
)

// Package hosts (ARCHITECTURE.md §5, DECISIONS.md §15, §39) are automation
// services that submit operations of the families they were granted, with
// a bearer token. A host has a generation: a token authenticates only while
// the generation it was minted at is the host's current one, so revoking
// (which bumps the generation) stops every older token at once, and issuing
// a token for an existing host (which bumps it too) retires the previous one.
//
// Tokens are never stored: the server keeps their SHA-256 beside the
// generation. A token is minted as an HMAC (its own subkey of the master
// key) of the host id, the ledger operation that issued it and the
// generation, so the call that submitted that operation can be answered the
// token after the operation ended — on whichever replica ran it — without
// the token ever entering the ledger or the database (see PackageHostToken).

// GrantableFamilies are the operation families a package host may be
// granted (DECISIONS.md §12). `credentials` is for administrators only.
var GrantableFamilies = []string{"nodes", "commands", "fleet", "nodeconfig", "diagnose"}

// AdminOnlyFamily is the family no package host may be granted.
const AdminOnlyFamily = "credentials"

// MaxPackageHostName is the longest package host name, in characters.
const MaxPackageHostName = 64

// PackageHost is one automation service's standing.
type PackageHost struct {
	// Cursor orders hosts by creation; the listing pages on it.
	Cursor int64
	ID     string
	Name   string
	// Families are the granted operation families, sorted.
	Families []string
	// Generation starts at 1 and grows with every revocation and every
	// token issued for an existing host.
	Generation int64
	CreatedAt  time.Time
	UpdatedAt  time.Time
	// RevokedAt is set by a revocation and cleared when a new token is
	// issued: a revoked host holds no working token.
	RevokedAt *time.Time
}

// PackageHostToken is one minted token: its SHA-256 and the generation it
// was minted at (it works only while that is the host's generation).
type PackageHostToken struct {
	TokenHash   string
	HostID      string
	Generation  int64
	OperationID string
	CreatedAt   time.Time
}

// ValidatePackageHost checks a new host's name and families and answers
// the families sorted and without repeats. Field names are prefixed with
// prefix ("" or "operation/"). Errors: validation_failed naming the field.
func ValidatePackageHost(name string, families []string, prefix string) ([]string, error) {
	var v errcode.Validation
	if msg := checkHostName(name); msg != "" {
		v.Add(prefix+"name", "%s", msg)
	}
	out, msg := checkFamilies(families)
	if msg != "" {
		v.Add(prefix+"families", "%s", msg)
	}
	return out, v.Err()
}

func checkHostName(name string) string {
	const rule = "1-64 characters, no control or bidirectional-override characters, no leading or trailing space"
	if !utf8.ValidString(name) {
		return "not valid UTF-8; " + rule
	}
	n := utf8.RuneCountInString(name)
	if n == 0 || n > MaxPackageHostName || strings.TrimSpace(name) != name {
		return rule
	}
	for _, r := range name {
		// A JSON decoder reads invalid UTF-8 as U+FFFD: refused alike.
		if unicode.IsControl(r) || bidiControl(r) || r == utf8.RuneError {
			return rule
		}
	}
	return ""
}

// bidiControl reports the characters that reorder text around them, which
// would let a name display as another.
func bidiControl(r rune) bool {
	return r == '\u061c' || r == '\u200e' || r == '\u200f' ||
		(r >= '\u202a' && r <= '\u202e') || (r >= '\u2066' && r <= '\u2069')
}

func checkFamilies(families []string) ([]string, string) {
	if len(families) == 0 {
		return nil, "at least one of " + strings.Join(GrantableFamilies, ", ")
	}
	out := make([]string, 0, len(families))
	for _, f := range families {
		switch {
		case f == AdminOnlyFamily:
			return nil, "credentials is for administrators only and cannot be granted"
		case !slices.Contains(GrantableFamilies, f):
			return nil, fmt.Sprintf("unknown family %q; one of %s", truncate(f, 32), strings.Join(GrantableFamilies, ", "))
		case !slices.Contains(out, f):
			out = append(out, f)
		}
	}
	slices.Sort(out)
	return out, ""
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// CheckNewPackageHost validates a new host and refuses a name in use,
// before anything is recorded (the ledger's preparer). It answers the
// families sorted. Errors: validation_failed, ErrPackageHostNameTaken.
func (s *Service) CheckNewPackageHost(ctx context.Context, name string, families []string, prefix string) ([]string, error) {
	fams, err := ValidatePackageHost(name, families, prefix)
	if err != nil {
		return nil, err
	}
	if _, err := s.store.PackageHostByName(ctx, name); err == nil {
		return nil, ErrPackageHostNameTaken
	} else if !errors.Is(err, ErrNoRows) {
		return nil, err
	}
	return fams, nil
}

// NewPackageHostID mints a package host's identity.
func NewPackageHostID() string { return uuid.NewString() }

// CreatePackageHostTx creates host id at generation 1 inside tx, records
// the digest of its first token (minted from operationID) and audits it
// (DECISIONS.md §22). The token itself is not answered: PackageHostToken
// re-derives it. Errors: validation_failed, ErrPackageHostNameTaken.
func (s *Service) CreatePackageHostTx(ctx context.Context, tx Store, actor, operationID, id, name string, families []string) (PackageHost, error) {
	fams, err := ValidatePackageHost(name, families, "operation/")
	if err != nil {
		return PackageHost{}, err
	}
	now := s.now()
	h := PackageHost{ID: id, Name: name, Families: fams, Generation: 1, CreatedAt: now, UpdatedAt: now}
	if err := tx.InsertPackageHost(ctx, h); err != nil {
		if errors.Is(err, ErrDuplicate) {
			return PackageHost{}, ErrPackageHostNameTaken
		}
		return PackageHost{}, err
	}
	if err := s.recordHostToken(ctx, tx, h, operationID); err != nil {
		return PackageHost{}, err
	}
	h, err = tx.PackageHost(ctx, h.ID) // its cursor
	if err != nil {
		return PackageHost{}, err
	}
	return h, s.audit(ctx, tx, AuditEntry{Actor: actor, Action: "package_host.create", Target: h.ID, Outcome: "ok",
		Detail: hostDetail(h, operationID)})
}

// IssuePackageHostTokenTx mints a new token for an existing host inside tx:
// the generation grows by one (every earlier token stops), a revocation is
// lifted, and the new token's digest is recorded. Errors:
// ErrPackageHostNotFound.
func (s *Service) IssuePackageHostTokenTx(ctx context.Context, tx Store, actor, operationID, hostID string) (PackageHost, error) {
	h, err := lockHost(ctx, tx, hostID)
	if err != nil {
		return PackageHost{}, err
	}
	h.Generation++
	h.RevokedAt, h.UpdatedAt = nil, s.now()
	if err := tx.UpdatePackageHost(ctx, h); err != nil {
		return PackageHost{}, err
	}
	if err := tx.AnnounceRevoked(ctx, HostSubject(h.ID)); err != nil {
		return PackageHost{}, err
	}
	if err := s.recordHostToken(ctx, tx, h, operationID); err != nil {
		return PackageHost{}, err
	}
	return h, s.audit(ctx, tx, AuditEntry{Actor: actor, Action: "package_host.issue", Target: h.ID, Outcome: "ok",
		Detail: hostDetail(h, operationID)})
}

// RevokePackageHostTx revokes a host inside tx: its generation grows by
// one, so every token it holds stops at once. Like IssuePackageHostTokenTx
// it announces the change in tx (Store.AnnounceRevoked): tx's commit must
// hand it to this replica's Service.CredentialsChanged as well (the
// ledger's transactions do, through the fleet's commit hook). Revoking a revoked host
// changes nothing (it holds no working token). Errors:
// ErrPackageHostNotFound.
func (s *Service) RevokePackageHostTx(ctx context.Context, tx Store, actor, operationID, hostID string) (PackageHost, error) {
	h, err := lockHost(ctx, tx, hostID)
	if err != nil || h.RevokedAt != nil {
		return h, err
	}
	now := s.now()
	h.Generation++
	h.RevokedAt, h.UpdatedAt = &now, now
	if err := tx.UpdatePackageHost(ctx, h); err != nil {
		return PackageHost{}, err
	}
	if err := tx.AnnounceRevoked(ctx, HostSubject(h.ID)); err != nil {
		return PackageHost{}, err
	}
	return h, s.audit(ctx, tx, AuditEntry{Actor: actor, Action: "package_host.revoke", Target: h.ID, Outcome: "ok",
		Detail: hostDetail(h, operationID)})
}

func lockHost(ctx context.Context, tx Store, id string) (PackageHost, error) {
	h, err := tx.PackageHost(ctx, id)
	if errors.Is(err, ErrNoRows) {
		return PackageHost{}, ErrPackageHostNotFound
	}
	return h, err
}

func hostDetail(h PackageHost, operationID string) string {
	return fmt.Sprintf("name=%s families=%s generation=%d operation_id=%s",
		strconv.Quote(h.Name), strings.Join(h.Families, ","), h.Generation, operationID)
}

func (s *Service) recordHostToken(ctx context.Context, tx Store, h PackageHost, operationID string) error {
	tok, err := s.mintHostToken(h.ID, operationID, h.Generation)
	if err != nil {
		return err
	}
	return tx.InsertPackageHostToken(ctx, PackageHostToken{TokenHash: digest(tok), HostID: h.ID,
		Generation: h.Generation, OperationID: operationID, CreatedAt: s.now()})
}

// mintHostToken is the token the operation issues for the host at that
// generation: deterministic, so it can be answered again without storing
// it; unforgeable without the master key. An empty key ring mints nothing.
func (s *Service) mintHostToken(hostID, operationID string, generation int64) (string, error) {
	sk, err := s.keys.Current(keys.LabelPackageHostToken)
	if err != nil {
		return "", err
	}
	m := hmac.New(sha256.New, sk.Key)
	m.Write([]byte(hostID + "\x00" + operationID + "\x00" + strconv.FormatInt(generation, 10)))
	return hostTokenPrefix + base64.RawURLEncoding.EncodeToString(m.Sum(nil)), nil
}

// PackageHostToken answers the token that operationID issued for the host
// at generation, re-derived and checked against the digest recorded then.
// It is the seam through which the submitting call shows the token once;
// the one-time reveal handles of DECISIONS.md §16 and §37 will wrap it.
// Errors: ErrPackageHostNotFound when no such token was recorded (or the
// master key changed since).
func (s *Service) PackageHostToken(ctx context.Context, operationID, hostID string, generation int64) (string, error) {
	tok, err := s.mintHostToken(hostID, operationID, generation)
	if err != nil {
		return "", err
	}
	row, _, err := s.store.PackageHostByToken(ctx, digest(tok))
	if errors.Is(err, ErrNoRows) || (err == nil && (row.HostID != hostID || row.Generation != generation || row.OperationID != operationID)) {
		return "", errcode.New(errcode.NotFound, "that operation's package host token cannot be shown")
	}
	return tok, err
}

// AuthenticatePackageHost verifies a package host token: it must be
// recorded, its host not revoked, and its generation the host's current
// one. Errors: ErrUnauthenticated.
func (s *Service) AuthenticatePackageHost(ctx context.Context, token string) (Principal, error) {
	if !strings.HasPrefix(token, hostTokenPrefix) {
		return Principal{}, ErrUnauthenticated
	}
	k, now := keyOf(token), s.now()
	if e, ok := s.cache.get(k, now); ok && e.p.Kind == KindPackageHost {
		return e.p, nil
	}
	return s.cache.read(ctx, k, now, func(ctx context.Context, epoch uint64) (Principal, error) {
		row, h, err := s.store.PackageHostByToken(ctx, hex.EncodeToString(k[:]))
		if errors.Is(err, ErrNoRows) {
			return Principal{}, ErrUnauthenticated
		}
		if err != nil {
			return Principal{}, err
		}
		if h.RevokedAt != nil || row.Generation != h.Generation {
			return Principal{}, ErrUnauthenticated
		}
		p := Principal{Kind: KindPackageHost, Via: "package_host_token", PackageHostID: h.ID, PackageHostName: h.Name,
			Generation: h.Generation, Families: slices.Clip(h.Families)}
		s.cache.put(k, cacheEntry{p: p, subject: HostSubject(h.ID)}, epoch, now, time.Time{})
		return p, nil
	})
}

// AuthenticateBearer verifies a Bearer credential: a package host token
// (prefix nwh_) or an administrator's API token. Errors:
// ErrUnauthenticated.
func (s *Service) AuthenticateBearer(ctx context.Context, token string) (Principal, error) {
	if strings.HasPrefix(token, hostTokenPrefix) {
		return s.AuthenticatePackageHost(ctx, token)
	}
	return s.AuthenticateToken(ctx, token)
}

// CheckPackageHostCurrentTx refuses, inside tx, a package host whose
// generation is no longer generation (revoked, or a newer token issued
// since the request authenticated). The host's row is locked, so a
// revocation that committed before is seen, and one that commits after
// waits for tx: no operation is recorded for a token after its revocation
// returned. Errors: ErrUnauthenticated.
func CheckPackageHostCurrentTx(ctx context.Context, tx Store, hostID string, generation int64) error {
	h, err := tx.PackageHost(ctx, hostID)
	if errors.Is(err, ErrNoRows) {
		return ErrUnauthenticated
	}
	if err != nil {
		return err
	}
	if h.RevokedAt != nil || h.Generation != generation {
		return ErrUnauthenticated
	}
	return nil
}

// PackageHost answers one host. Errors: ErrPackageHostNotFound.
func (s *Service) PackageHost(ctx context.Context, id string) (PackageHost, error) {
	h, err := s.store.PackageHost(ctx, id)
	if errors.Is(err, ErrNoRows) {
		return PackageHost{}, ErrPackageHostNotFound
	}
	return h, err
}

// ListPackageHosts answers up to limit hosts created before the cursor
// before (0: from the newest), newest first.
func (s *Service) ListPackageHosts(ctx context.Context, before int64, limit int) ([]PackageHost, error) {
	return s.store.PackageHosts(ctx, before, limit)
}
