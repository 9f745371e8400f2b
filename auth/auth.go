// Package auth owns the administrators: users with argon2id passwords,
// console sessions (rows referenced by a JWT in the cookie, revoked at
// logout), API tokens for scripts (random, shown once, stored as SHA-256,
// revocable) and the administrators' audit log. It knows nothing of HTTP,
// and reaches the database only through its Store (implemented in models).
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/uuid"

	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/internal/dbtime"
	"github.com/nodeward/nodeward/keys"
)

// Errors returned by the service.
var (
	// ErrUnauthenticated is every credential failure; it never says which
	// part was wrong.
	ErrUnauthenticated = errcode.New(errcode.Unauthenticated, "missing or invalid credentials")
	// ErrRateLimited refuses logins after repeated failures.
	ErrRateLimited = errcode.New(errcode.RateLimited, "too many failed logins; try again later")
	// ErrOverloaded refuses a login that found every password-hashing slot
	// busy for the whole queue timeout (DECISIONS.md §44).
	ErrOverloaded = errcode.New(errcode.Overloaded, "too many sign-ins at once; try again shortly")
	// ErrUsernameTaken refuses a second user of one name.
	ErrUsernameTaken = errcode.New(errcode.Conflict, "an administrator with that username exists (usernames are compared without case)")
	// ErrSetupClosed refuses the first-run setup once an administrator exists.
	ErrSetupClosed = errcode.New(errcode.PermissionDenied, "setup is closed: an administrator already exists")
	// ErrTokenNotFound is a revoke of a token that does not exist.
	ErrTokenNotFound = errcode.New(errcode.NotFound, "no such API token")
	// ErrPackageHostNotFound names a package host that does not exist.
	ErrPackageHostNotFound = errcode.New(errcode.NotFound, "no such package host")
	// ErrPackageHostNameTaken refuses a second package host of one name.
	ErrPackageHostNameTaken = errcode.New(errcode.Conflict, "a package host with that name exists")
)

// Token prefixes make a leaked credential recognisable to secret scanners.
const (
	apiTokenPrefix   = "nwa_"
	setupTokenPrefix = "nws_"
	hostTokenPrefix  = "nwh_"
)

// DefaultSessionTTL is the console session lifetime.
const DefaultSessionTTL = 12 * time.Hour

// Login form limits. Anything longer is refused as an ordinary failed
// login, before any hashing, rate-limiter or audit work sees it.
const (
	// MaxUsernameLen is the longest username a login accepts (bytes);
	// valid usernames are at most 64 characters.
	MaxUsernameLen = 64
	// MaxPasswordLen is the longest password accepted (bytes).
	MaxPasswordLen = 1024
)

// Principal is an authenticated caller: an administrator (Kind KindAdmin,
// with UserID and Username) or a package host (Kind KindPackageHost, with
// the PackageHost fields).
type Principal struct {
	Kind     PrincipalKind
	UserID   string
	Username string
	// Via is "token" or "session" (administrators), "package_host_token".
	Via       string
	SessionID string
	TokenID   string

	// PackageHostID and PackageHostName name a package host.
	PackageHostID   string
	PackageHostName string
	// Generation is the generation of the package host token presented,
	// which is the host's current one when it authenticated.
	Generation int64
	// Families are the package host's granted operation families.
	Families []string
}

// Options configure the service.
type Options struct {
	// Store is the persistence (models.AuthStore in production).
	Store Store
	// Keys signs console session cookies.
	Keys *keys.Ring
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// HashSlots bounds concurrent password hashes; 0 is DefaultHashSlots().
	HashSlots int
	// HashQueueTimeout is how long a login waits for a hashing slot before
	// ErrOverloaded; 0 is DefaultHashQueueTimeout.
	HashQueueTimeout time.Duration
	// CacheTTL is how long a verified credential is trusted without a
	// store read (see cache.go); 0 is DefaultCacheTTL, negative turns the
	// cache off.
	CacheTTL time.Duration
	// CacheSize bounds the cached credentials; 0 is DefaultCacheSize.
	CacheSize int
	// CrossReplica: other replicas share the database (Postgres), so the
	// cache stays off until SetNotifierHealthy(true) says their
	// revocations are heard, and off again whenever they may not be.
	CrossReplica bool
}

// Service is the administrators' service.
type Service struct {
	store      Store
	sessions   *keys.Signer
	keys       *keys.Ring
	now        func() time.Time
	sessionTTL time.Duration
	limiter    *loginLimiter
	hashes     *hashGate
	// cache keeps verified credentials (cache.go).
	cache        *credCache
	crossReplica bool

	mu         sync.Mutex // guards the following
	setupToken string
}

// New returns the service.
func New(o Options) *Service {
	now := o.Now
	if now == nil {
		now = time.Now
	}
	// Answers carry the precision both databases keep, so a time answered
	// equals the same time read back later.
	clock := now
	now = func() time.Time { return dbtime.Norm(clock()) }
	if o.HashSlots <= 0 {
		o.HashSlots = DefaultHashSlots()
	}
	if o.HashQueueTimeout <= 0 {
		o.HashQueueTimeout = DefaultHashQueueTimeout
	}
	if o.CacheTTL == 0 {
		o.CacheTTL = DefaultCacheTTL
	}
	if o.CacheSize == 0 {
		o.CacheSize = DefaultCacheSize
	}
	return &Service{
		store:        o.Store,
		sessions:     keys.NewSigner(o.Keys, keys.LabelConsoleSession, "nodeward-console", "console+jwt", now),
		keys:         o.Keys,
		now:          now,
		sessionTTL:   DefaultSessionTTL,
		limiter:      newLoginLimiter(5, 15*time.Minute, defaultLimiterKeys),
		hashes:       newHashGate(o.HashSlots, o.HashQueueTimeout),
		cache:        newCredCache(o.CacheTTL, o.CacheSize, !o.CrossReplica),
		crossReplica: o.CrossReplica,
	}
}

var usernamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$`)

// MinPasswordLen is the shortest password accepted.
const MinPasswordLen = 12

func validateNewAdmin(username, password string) error {
	var v errcode.Validation
	v.Check(usernamePattern.MatchString(username), "username", "1-64 characters of letters, digits, '.', '_', '@' or '-', starting with a letter or digit")
	// The audit names the command line "system": nobody may pass for it.
	v.Check(!strings.EqualFold(username, SystemActor.Username), "username", "%q is reserved for the command line in the audit", SystemActor.Username)
	checkNewPassword(&v, "password", password)
	return v.Err()
}

// checkNewPassword records what is wrong with a password being set: too
// short or long, bytes that are not text (a password every door must
// accept, the API's JSON included), or only spaces.
func checkNewPassword(v *errcode.Validation, field, password string) {
	v.Check(len(password) >= MinPasswordLen, field, "at least %d characters", MinPasswordLen)
	v.Check(len(password) <= MaxPasswordLen, field, "at most %d characters", MaxPasswordLen)
	v.Check(utf8.ValidString(password) && !strings.ContainsFunc(password, unicode.IsControl), field,
		"may not hold control characters or invalid UTF-8")
	v.Check(strings.TrimSpace(password) != "", field, "may not be only spaces")
}

// CreateAdmin adds an administrator as SystemActor (the command line, a
// test). Errors: validation_failed, ErrUsernameTaken, ErrOverloaded.
func (s *Service) CreateAdmin(ctx context.Context, username, password string) (User, error) {
	return s.AddAdmin(ctx, SystemActor, username, password, "")
}

// addAdmin validates and hashes the new administrator's password, then in
// one transaction runs check (the caller's precondition) and creates them,
// audited as actor's.
func (s *Service) addAdmin(ctx context.Context, actor, remote, username, password string, check func(tx Store) error) (User, error) {
	if err := validateNewAdmin(username, password); err != nil {
		return User{}, err
	}
	hash, err := s.hashPassword(ctx, password)
	if err != nil {
		return User{}, err
	}
	var u User
	err = s.store.Tx(ctx, func(tx Store) error {
		if err := check(tx); err != nil {
			return err
		}
		var err error
		u, err = s.createAdminTx(ctx, tx, actor, remote, username, hash)
		return err
	})
	return u, err
}

func (s *Service) createAdminTx(ctx context.Context, tx Store, actor, remote, username, hash string) (User, error) {
	// Names that differ only in case would be told apart by nobody reading
	// the audit (and share one sign-in limit).
	if _, err := tx.UserByNameFold(ctx, username); err == nil {
		return User{}, ErrUsernameTaken
	} else if !errors.Is(err, ErrNoRows) {
		return User{}, err
	}
	u := User{ID: uuid.NewString(), Username: username, PasswordHash: hash, CreatedAt: s.now()}
	if err := tx.InsertUser(ctx, u); err != nil {
		if errors.Is(err, ErrDuplicate) {
			return User{}, ErrUsernameTaken
		}
		return User{}, err
	}
	return u, s.audit(ctx, tx, AuditEntry{Actor: actor, Action: "admin.create", Target: username, Outcome: "ok", RemoteAddr: remote})
}

// HasAdmin reports whether any administrator exists.
func (s *Service) HasAdmin(ctx context.Context) (bool, error) {
	n, err := s.store.CountUsers(ctx)
	return n > 0, err
}

// OpenSetup mints the one-time setup token that lets the first administrator
// in through the console, when none exists yet. It lives in this process
// only and is spent by CompleteSetup. It returns "" when setup is closed.
func (s *Service) OpenSetup(ctx context.Context) (string, error) {
	has, err := s.HasAdmin(ctx)
	if err != nil || has {
		return "", err
	}
	tok, err := randomToken(setupTokenPrefix)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	s.setupToken = tok
	s.mu.Unlock()
	return tok, nil
}

// SetupOpen reports whether token is the live setup token.
func (s *Service) SetupOpen(token string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.setupToken != "" && subtle.ConstantTimeCompare([]byte(token), []byte(s.setupToken)) == 1
}

// CompleteSetup creates the first administrator with the setup token. Errors:
// ErrUnauthenticated (wrong or spent token), ErrSetupClosed,
// validation_failed, ErrOverloaded.
func (s *Service) CompleteSetup(ctx context.Context, token, username, password, remote string) (User, error) {
	if !s.SetupOpen(token) {
		return User{}, ErrUnauthenticated
	}
	u, err := s.addAdmin(ctx, SystemActor.Username, "", username, password, func(tx Store) error {
		n, err := tx.CountUsers(ctx)
		if err == nil && n > 0 {
			return ErrSetupClosed
		}
		return err
	})
	if err != nil {
		return u, err
	}
	s.mu.Lock()
	s.setupToken = ""
	s.mu.Unlock()
	return u, s.audit(ctx, s.store, AuditEntry{Actor: username, Action: "setup.complete", Target: username, Outcome: "ok", RemoteAddr: remote})
}

// Login checks a username and password and opens a console session. It
// answers the cookie value (a JWT naming the session row) and its expiry.
// A username or password beyond MaxUsernameLen or MaxPasswordLen is an
// ordinary failure. Errors: ErrUnauthenticated, ErrRateLimited,
// ErrOverloaded.
func (s *Service) Login(ctx context.Context, username, password, remote string) (string, time.Time, error) {
	now := s.now()
	host := remoteHost(remote)
	key := limiterKey(username, host)
	if !s.limiter.reserve(key, now) {
		s.auditRefusal(ctx, username, "login", "rate_limited", host)
		return "", time.Time{}, ErrRateLimited
	}
	if len(username) > MaxUsernameLen || len(password) > MaxPasswordLen {
		s.limiter.fail(key, now)
		s.auditRefusal(ctx, username, "login", "failed", host)
		return "", time.Time{}, ErrUnauthenticated
	}
	u, err := s.store.UserByName(ctx, username)
	if err != nil && !errors.Is(err, ErrNoRows) {
		s.limiter.release(key)
		return "", time.Time{}, err
	}
	hash := u.PasswordHash
	if hash == "" {
		// Spend the same work for an unknown user, so timing does not tell
		// which usernames exist.
		hash = dummyHash
	}
	ok, err := s.checkPassword(ctx, hash, password)
	if errors.Is(err, ErrOverloaded) || (err != nil && ctx.Err() != nil) {
		// Shed or abandoned before the password was judged: not a guess.
		s.limiter.release(key)
		return "", time.Time{}, err
	}
	if err != nil || !ok || u.ID == "" {
		s.limiter.fail(key, now)
		s.auditRefusal(ctx, username, "login", "failed", host)
		return "", time.Time{}, ErrUnauthenticated
	}
	if u.DisabledAt != nil {
		// The right password of a disabled account: refused like any
		// other failure (the caller learns nothing), audited as what it is.
		s.limiter.fail(key, now)
		s.auditRefusal(ctx, username, "login", "disabled", host)
		return "", time.Time{}, ErrUnauthenticated
	}
	s.limiter.reset(key)
	tok, expires, err := s.openSession(ctx, u.ID, remote)
	if err != nil {
		return "", time.Time{}, err
	}
	_ = s.audit(ctx, s.store, AuditEntry{Actor: u.Username, Action: "login", Outcome: "ok", RemoteAddr: remote})
	return tok, expires, nil
}

// openSession records a console session for userID and answers its cookie
// value (a JWT naming the row) and expiry.
func (s *Service) openSession(ctx context.Context, userID, remote string) (string, time.Time, error) {
	now := s.now()
	sess := ConsoleSession{
		ID: uuid.NewString(), UserID: userID, CreatedAt: now,
		ExpiresAt: now.Add(s.sessionTTL).Truncate(time.Second), RemoteAddr: remote,
	}
	if err := s.store.InsertSession(ctx, sess); err != nil {
		return "", time.Time{}, err
	}
	tok, err := s.sessions.Sign(consoleClaims{
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   userID,
			ID:        sess.ID,
			Audience:  jwt.ClaimStrings{s.sessions.Audience()},
			IssuedAt:  jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(sess.ExpiresAt),
		},
	})
	return tok, sess.ExpiresAt, err
}

var dummyHash = func() string {
	h, _ := HashPassword("not-a-real-password-just-timing")
	return h
}()

type consoleClaims struct {
	jwt.RegisteredClaims
}

// AuthenticateSession verifies a console cookie and its session row.
// Errors: ErrUnauthenticated.
func (s *Service) AuthenticateSession(ctx context.Context, cookie string) (Principal, error) {
	var c consoleClaims
	if err := s.sessions.Verify(cookie, &c); err != nil {
		return Principal{}, ErrUnauthenticated
	}
	k, now := keyOf(cookie), s.now()
	if e, ok := s.cache.get(k, now); ok && e.p.Via == "session" && e.p.SessionID == c.ID {
		return e.p, nil
	}
	return s.cache.read(ctx, k, now, func(ctx context.Context, epoch uint64) (Principal, error) {
		sess, u, err := s.store.Session(ctx, c.ID, c.Subject)
		if errors.Is(err, ErrNoRows) {
			return Principal{}, ErrUnauthenticated
		}
		if err != nil {
			return Principal{}, err
		}
		if sess.RevokedAt != nil || !now.Before(sess.ExpiresAt) || u.DisabledAt != nil {
			return Principal{}, ErrUnauthenticated
		}
		p := Principal{Kind: KindAdmin, UserID: u.ID, Username: u.Username, Via: "session", SessionID: sess.ID}
		s.cache.put(k, cacheEntry{p: p, subject: SessionSubject(sess.ID), user: UserSubject(u.ID)}, epoch, now, sess.ExpiresAt)
		return p, nil
	})
}

// Logout revokes a console session. Revoking twice is harmless. The
// session stops working on this replica when Logout returns, and on the
// others when they hear the announcement (cache.go).
func (s *Service) Logout(ctx context.Context, p Principal, remote string) error {
	if p.SessionID == "" {
		return nil
	}
	if err := s.store.RevokeSession(ctx, p.SessionID, s.now()); err != nil {
		return err
	}
	// Committed: forget it here, then tell the other replicas.
	s.cache.forget(SessionSubject(p.SessionID), "local")
	if err := s.store.AnnounceRevoked(ctx, SessionSubject(p.SessionID)); err != nil {
		return err
	}
	return s.audit(ctx, s.store, AuditEntry{Actor: p.Username, Action: "logout", Outcome: "ok", RemoteAddr: remote})
}

// CreateToken mints an API token for the principal's user. The token is in
// the answer only; the store keeps its digest. Errors: validation_failed.
func (s *Service) CreateToken(ctx context.Context, p Principal, name, remote string) (string, APIToken, error) {
	tok, row, _, err := s.CreateTokenOnce(ctx, p, name, "", remote)
	return tok, row, err
}

// CreateTokenOnce is CreateToken for a form that may be sent twice: the
// first request under requestID (per user; "" is none) mints the token, and
// a later one answers that token's row, replayed, without the token (it
// was shown once, to the first). Errors: validation_failed.
func (s *Service) CreateTokenOnce(ctx context.Context, p Principal, name, requestID, remote string) (tok string, row APIToken, replayed bool, err error) {
	var v errcode.Validation
	v.Check(strings.TrimSpace(name) != "" && utf8.RuneCountInString(name) <= 128, "name", "1-128 characters")
	if err := v.Err(); err != nil {
		return "", APIToken{}, false, err
	}
	if requestID != "" {
		if row, err := s.store.TokenByRequest(ctx, p.UserID, requestID); err == nil {
			return "", row, true, nil
		} else if !errors.Is(err, ErrNoRows) {
			return "", APIToken{}, false, err
		}
	}
	tok, err = randomToken(apiTokenPrefix)
	if err != nil {
		return "", APIToken{}, false, err
	}
	row = APIToken{ID: uuid.NewString(), Name: name, UserID: p.UserID, TokenHash: digest(tok), CreatedAt: s.now(), RequestID: requestID}
	err = s.store.Tx(ctx, func(tx Store) error {
		if err := tx.InsertToken(ctx, row); err != nil {
			return err
		}
		return s.audit(ctx, tx, AuditEntry{Actor: p.Username, Action: "token.create", Target: row.ID, Outcome: "ok",
			RemoteAddr: remote, Detail: "name=" + name})
	})
	if errors.Is(err, ErrDuplicate) && requestID != "" {
		// The same form, sent twice at once: the other one minted it.
		if first, ferr := s.store.TokenByRequest(ctx, p.UserID, requestID); ferr == nil {
			return "", first, true, nil
		}
	}
	if err != nil {
		return "", APIToken{}, false, err
	}
	return tok, row, false, nil
}

// CreateTokenFor mints a token for the named user; used by the CLI.
// Errors: not_found, conflict (the administrator is disabled),
// validation_failed.
func (s *Service) CreateTokenFor(ctx context.Context, username, name string) (string, APIToken, error) {
	u, err := s.store.UserByName(ctx, username)
	if errors.Is(err, ErrNoRows) {
		return "", APIToken{}, errcode.Errorf(errcode.NotFound, "no administrator named %q", username)
	}
	if err != nil {
		return "", APIToken{}, err
	}
	if u.DisabledAt != nil {
		// The token would be refused until they are enabled: say so now.
		return "", APIToken{}, errcode.Errorf(errcode.Conflict, "administrator %q is disabled: enable them first", username)
	}
	return s.CreateToken(ctx, Principal{Kind: KindAdmin, UserID: u.ID, Username: u.Username}, name, "cli")
}

// FirstAdmin returns the oldest enabled administrator, for the CLI's
// default owner. Errors: not_found.
func (s *Service) FirstAdmin(ctx context.Context) (User, error) {
	u, err := s.store.FirstUser(ctx)
	if errors.Is(err, ErrNoRows) {
		return u, errcode.New(errcode.NotFound, "no enabled administrator exists: run `admin create` (or `admin enable`) first")
	}
	return u, err
}

// ListTokens lists API tokens newest first (never the token itself): those
// created before before (nil: from the newest), at most limit (0: every
// one).
func (s *Service) ListTokens(ctx context.Context, before *PageKey, limit int) ([]APIToken, error) {
	return s.store.Tokens(ctx, before, limit)
}

// RevokeToken revokes a token; revoking a revoked token is harmless. The
// token stops working on this replica when RevokeToken returns, and on the
// others when they hear the announcement committed with the revocation
// (cache.go). Errors: ErrTokenNotFound.
func (s *Service) RevokeToken(ctx context.Context, p Principal, id, remote string) (APIToken, error) {
	var row APIToken
	err := s.store.Tx(ctx, func(tx Store) error {
		var err error
		row, err = tx.Token(ctx, id)
		if errors.Is(err, ErrNoRows) {
			return ErrTokenNotFound
		}
		if err != nil || row.RevokedAt != nil {
			return err
		}
		now := s.now()
		row.RevokedAt = &now
		if err := tx.RevokeToken(ctx, id, now); err != nil {
			return err
		}
		if err := tx.AnnounceRevoked(ctx, TokenSubject(id)); err != nil {
			return err
		}
		return s.audit(ctx, tx, AuditEntry{Actor: p.Username, Action: "token.revoke", Target: id, Outcome: "ok", RemoteAddr: remote})
	})
	if err == nil {
		// Committed (or revoked before): forget it here.
		s.cache.forget(TokenSubject(id), "local")
	}
	return row, err
}

// lastUsedResolution coalesces last-used writes: a busy script does not
// cost one write per request (one a minute per token and replica; on a
// cache hit the first request past the minute claims the write).
const lastUsedResolution = time.Minute

// AuthenticateToken verifies an API token: from the cache when this
// replica verified it lately (cache.go), else by its digest in the store.
// Errors: ErrUnauthenticated.
func (s *Service) AuthenticateToken(ctx context.Context, token string) (Principal, error) {
	if !strings.HasPrefix(token, apiTokenPrefix) {
		return Principal{}, ErrUnauthenticated
	}
	k, now := keyOf(token), s.now()
	if e, ok := s.cache.get(k, now); ok && e.p.Via == "token" {
		if now.Sub(e.lastUsed) >= lastUsedResolution && s.cache.claimTouch(k, now, lastUsedResolution) {
			if err := s.store.TouchToken(ctx, e.p.TokenID, now); err != nil {
				return Principal{}, err
			}
		}
		return e.p, nil
	}
	return s.cache.read(ctx, k, now, func(ctx context.Context, epoch uint64) (Principal, error) {
		row, u, err := s.store.TokenByHash(ctx, hex.EncodeToString(k[:]))
		if errors.Is(err, ErrNoRows) {
			return Principal{}, ErrUnauthenticated
		}
		if err != nil {
			return Principal{}, err
		}
		if row.RevokedAt != nil || u.DisabledAt != nil {
			return Principal{}, ErrUnauthenticated
		}
		var lastUsed time.Time
		if row.LastUsedAt != nil {
			lastUsed = *row.LastUsedAt
		}
		if now.Sub(lastUsed) >= lastUsedResolution {
			if err := s.store.TouchToken(ctx, row.ID, now); err != nil {
				return Principal{}, err
			}
			lastUsed = now
		}
		p := Principal{Kind: KindAdmin, UserID: u.ID, Username: u.Username, Via: "token", TokenID: row.ID}
		s.cache.put(k, cacheEntry{p: p, subject: TokenSubject(row.ID), user: UserSubject(u.ID), lastUsed: lastUsed}, epoch, now, time.Time{})
		return p, nil
	})
}

// AuditPage is one page of the admin audit log, newest first: entries with
// an id below before (0: from the newest).
func (s *Service) AuditPage(ctx context.Context, before int64, limit int) ([]AuditEntry, error) {
	return s.store.Audit(ctx, before, limit)
}

// audit appends e, stamped now, through st (the store or a transaction).
func (s *Service) audit(ctx context.Context, st Store, e AuditEntry) error {
	e.At = s.now()
	e.Count = 1
	return st.AppendAudit(ctx, e)
}

func randomToken(prefix string) (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random: %w", err)
	}
	return prefix + base64.RawURLEncoding.EncodeToString(b), nil
}

func digest(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// remoteHost is the client's address without its port: one client opens
// many connections.
func remoteHost(remote string) string {
	if i := strings.LastIndex(remote, ":"); i > 0 {
		return strings.Trim(remote[:i], "[]")
	}
	return remote
}
