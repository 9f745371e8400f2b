// Package auth owns the administrators: users with argon2id passwords,
// console sessions (rows referenced by a JWT in the cookie, revoked at
// logout), API tokens for scripts (random, shown once, stored as SHA-256,
// revocable) and the administrators' audit log. It knows nothing of HTTP.
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

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/keys"
	"github.com/nodeward/nodeward/models"
)

// Errors returned by the service.
var (
	// ErrUnauthenticated is every credential failure; it never says which
	// part was wrong.
	ErrUnauthenticated = errcode.New(errcode.Unauthenticated, "missing or invalid credentials")
	// ErrRateLimited refuses logins after repeated failures.
	ErrRateLimited = errcode.New(errcode.RateLimited, "too many failed logins; try again later")
	// ErrUsernameTaken refuses a second user of one name.
	ErrUsernameTaken = errcode.New(errcode.Conflict, "an administrator with that username exists")
	// ErrSetupClosed refuses the first-run setup once an administrator exists.
	ErrSetupClosed = errcode.New(errcode.PermissionDenied, "setup is closed: an administrator already exists")
	// ErrTokenNotFound is a revoke of a token that does not exist.
	ErrTokenNotFound = errcode.New(errcode.NotFound, "no such API token")
)

// Token prefixes make a leaked credential recognisable to secret scanners.
const (
	apiTokenPrefix   = "nwa_"
	setupTokenPrefix = "nws_"
)

// Console session lifetime.
const DefaultSessionTTL = 12 * time.Hour

// Principal is an authenticated administrator.
type Principal struct {
	UserID   string
	Username string
	// Via is "token" or "session".
	Via       string
	SessionID string
	TokenID   string
}

// Service is the administrators' service.
type Service struct {
	db         *models.DB
	sessions   *keys.Signer
	now        func() time.Time
	sessionTTL time.Duration
	limiter    *loginLimiter

	mu         sync.Mutex // guards the following
	setupToken string
}

// New returns the service. now may be nil.
func New(db *models.DB, ring *keys.Ring, now func() time.Time) *Service {
	if now == nil {
		now = time.Now
	}
	// Answers carry the precision both databases keep, so a time answered
	// equals the same time read back later.
	clock := now
	now = func() time.Time { return clock().UTC().Truncate(time.Microsecond) }
	return &Service{
		db:         db,
		sessions:   keys.NewSigner(ring, keys.LabelConsoleSession, "nodeward-console", "console+jwt", now),
		now:        now,
		sessionTTL: DefaultSessionTTL,
		limiter:    newLoginLimiter(5, 15*time.Minute),
	}
}

var usernamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$`)

// MinPasswordLen is the shortest password accepted.
const MinPasswordLen = 12

func validateNewAdmin(username, password string) error {
	var v errcode.Validation
	v.Check(usernamePattern.MatchString(username), "username", "1-64 characters of letters, digits, '.', '_', '@' or '-', starting with a letter or digit")
	v.Check(len(password) >= MinPasswordLen, "password", "at least %d characters", MinPasswordLen)
	v.Check(len(password) <= 1024, "password", "at most 1024 characters")
	return v.Err()
}

// CreateAdmin adds an administrator. Errors: validation_failed, ErrUsernameTaken.
func (s *Service) CreateAdmin(ctx context.Context, username, password string) (models.AdminUser, error) {
	if err := validateNewAdmin(username, password); err != nil {
		return models.AdminUser{}, err
	}
	var u models.AdminUser
	err := s.db.Tx(ctx, func(tx *gorm.DB) error {
		var err error
		u, err = s.createAdminTx(tx, username, password)
		return err
	})
	return u, err
}

func (s *Service) createAdminTx(tx *gorm.DB, username, password string) (models.AdminUser, error) {
	hash, err := HashPassword(password)
	if err != nil {
		return models.AdminUser{}, err
	}
	var n int64
	if err := tx.Model(&models.AdminUser{}).Where("username = ?", username).Count(&n).Error; err != nil {
		return models.AdminUser{}, err
	}
	if n > 0 {
		return models.AdminUser{}, ErrUsernameTaken
	}
	u := models.AdminUser{ID: uuid.NewString(), Username: username, PasswordHash: hash, CreatedAt: s.now().UTC()}
	if err := tx.Create(&u).Error; err != nil {
		if errors.Is(err, gorm.ErrDuplicatedKey) {
			return models.AdminUser{}, ErrUsernameTaken
		}
		return models.AdminUser{}, err
	}
	return u, s.auditTx(tx, "system", "admin.create", username, "ok", "", "")
}

// HasAdmin reports whether any administrator exists.
func (s *Service) HasAdmin(ctx context.Context) (bool, error) {
	var n int64
	err := s.db.WithContext(ctx).Model(&models.AdminUser{}).Count(&n).Error
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
// ErrUnauthenticated (wrong or spent token), ErrSetupClosed, validation_failed.
func (s *Service) CompleteSetup(ctx context.Context, token, username, password, remote string) (models.AdminUser, error) {
	if !s.SetupOpen(token) {
		return models.AdminUser{}, ErrUnauthenticated
	}
	if err := validateNewAdmin(username, password); err != nil {
		return models.AdminUser{}, err
	}
	var u models.AdminUser
	err := s.db.Tx(ctx, func(tx *gorm.DB) error {
		var n int64
		if err := tx.Model(&models.AdminUser{}).Count(&n).Error; err != nil {
			return err
		}
		if n > 0 {
			return ErrSetupClosed
		}
		var err error
		u, err = s.createAdminTx(tx, username, password)
		return err
	})
	if err != nil {
		return u, err
	}
	s.mu.Lock()
	s.setupToken = ""
	s.mu.Unlock()
	return u, s.audit(ctx, username, "setup.complete", username, "ok", remote, "")
}

// Login checks a username and password and opens a console session. It
// answers the cookie value (a JWT naming the session row) and its expiry.
// Errors: ErrUnauthenticated, ErrRateLimited.
func (s *Service) Login(ctx context.Context, username, password, remote string) (string, time.Time, error) {
	now := s.now()
	key := strings.ToLower(username) + "|" + remoteHost(remote)
	if !s.limiter.allow(key, now) {
		_ = s.audit(ctx, username, "login", "", "rate_limited", remote, "")
		return "", time.Time{}, ErrRateLimited
	}
	var u models.AdminUser
	err := s.db.WithContext(ctx).Where("username = ?", username).Take(&u).Error
	if err != nil && !errors.Is(err, gorm.ErrRecordNotFound) {
		return "", time.Time{}, err
	}
	hash := u.PasswordHash
	if hash == "" {
		// Spend the same work for an unknown user, so timing does not tell
		// which usernames exist.
		hash = dummyHash
	}
	ok, err := CheckPassword(hash, password)
	if err != nil || !ok || u.ID == "" {
		s.limiter.fail(key, now)
		_ = s.audit(ctx, username, "login", "", "failed", remote, "")
		return "", time.Time{}, ErrUnauthenticated
	}
	s.limiter.reset(key)
	sess := models.ConsoleSession{
		ID: uuid.NewString(), UserID: u.ID, CreatedAt: now.UTC(),
		ExpiresAt: now.Add(s.sessionTTL).UTC().Truncate(time.Second), RemoteAddr: remote,
	}
	if err := s.db.WithContext(ctx).Create(&sess).Error; err != nil {
		return "", time.Time{}, err
	}
	tok, err := s.sessions.Sign(consoleClaims{
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   u.ID,
			ID:        sess.ID,
			Audience:  jwt.ClaimStrings{s.sessions.Audience()},
			IssuedAt:  jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(sess.ExpiresAt),
		},
	})
	if err != nil {
		return "", time.Time{}, err
	}
	_ = s.audit(ctx, u.Username, "login", "", "ok", remote, "")
	return tok, sess.ExpiresAt, nil
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
	var row struct {
		models.ConsoleSession
		Username string
	}
	err := s.db.WithContext(ctx).Table("console_sessions").
		Select("console_sessions.*, admin_users.username").
		Joins("JOIN admin_users ON admin_users.id = console_sessions.user_id").
		Where("console_sessions.id = ? AND console_sessions.user_id = ?", c.ID, c.Subject).
		Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Principal{}, ErrUnauthenticated
	}
	if err != nil {
		return Principal{}, err
	}
	if row.RevokedAt != nil || !s.now().Before(row.ExpiresAt) {
		return Principal{}, ErrUnauthenticated
	}
	return Principal{UserID: row.UserID, Username: row.Username, Via: "session", SessionID: row.ID}, nil
}

// Logout revokes a console session. Revoking twice is harmless.
func (s *Service) Logout(ctx context.Context, p Principal, remote string) error {
	if p.SessionID == "" {
		return nil
	}
	now := s.now().UTC()
	err := s.db.WithContext(ctx).Model(&models.ConsoleSession{}).
		Where("id = ? AND revoked_at IS NULL", p.SessionID).Update("revoked_at", now).Error
	if err != nil {
		return err
	}
	return s.audit(ctx, p.Username, "logout", "", "ok", remote, "")
}

// CreateToken mints an API token for the principal's user. The token is in
// the answer only; the store keeps its digest.
func (s *Service) CreateToken(ctx context.Context, p Principal, name, remote string) (string, models.APIToken, error) {
	var v errcode.Validation
	v.Check(strings.TrimSpace(name) != "" && len(name) <= 128, "name", "1-128 characters")
	if err := v.Err(); err != nil {
		return "", models.APIToken{}, err
	}
	tok, err := randomToken(apiTokenPrefix)
	if err != nil {
		return "", models.APIToken{}, err
	}
	row := models.APIToken{ID: uuid.NewString(), Name: name, UserID: p.UserID, TokenHash: digest(tok), CreatedAt: s.now().UTC()}
	err = s.db.Tx(ctx, func(tx *gorm.DB) error {
		if err := tx.Create(&row).Error; err != nil {
			return err
		}
		return s.auditTx(tx, p.Username, "token.create", row.ID, "ok", remote, "name="+name)
	})
	return tok, row, err
}

// CreateTokenFor mints a token for the named user; used by the CLI.
func (s *Service) CreateTokenFor(ctx context.Context, username, name string) (string, models.APIToken, error) {
	var u models.AdminUser
	err := s.db.WithContext(ctx).Where("username = ?", username).Take(&u).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return "", models.APIToken{}, errcode.Errorf(errcode.NotFound, "no administrator named %q", username)
	}
	if err != nil {
		return "", models.APIToken{}, err
	}
	return s.CreateToken(ctx, Principal{UserID: u.ID, Username: u.Username}, name, "cli")
}

// FirstAdmin returns the oldest administrator, for the CLI's default owner.
func (s *Service) FirstAdmin(ctx context.Context) (models.AdminUser, error) {
	var u models.AdminUser
	err := s.db.WithContext(ctx).Order("created_at, id").Take(&u).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return u, errcode.New(errcode.NotFound, "no administrator exists yet: run `admin create` first")
	}
	return u, err
}

// ListTokens lists every API token, newest first (never the token itself).
func (s *Service) ListTokens(ctx context.Context) ([]models.APIToken, error) {
	var rows []models.APIToken
	err := s.db.WithContext(ctx).Order("created_at DESC, id DESC").Find(&rows).Error
	return rows, err
}

// RevokeToken revokes a token; revoking a revoked token is harmless.
// Errors: ErrTokenNotFound.
func (s *Service) RevokeToken(ctx context.Context, p Principal, id, remote string) (models.APIToken, error) {
	var row models.APIToken
	err := s.db.Tx(ctx, func(tx *gorm.DB) error {
		if err := tx.Where("id = ?", id).Take(&row).Error; err != nil {
			if errors.Is(err, gorm.ErrRecordNotFound) {
				return ErrTokenNotFound
			}
			return err
		}
		if row.RevokedAt != nil {
			return nil
		}
		now := s.now().UTC()
		row.RevokedAt = &now
		if err := tx.Model(&row).Update("revoked_at", now).Error; err != nil {
			return err
		}
		return s.auditTx(tx, p.Username, "token.revoke", id, "ok", remote, "")
	})
	return row, err
}

// lastUsedResolution coalesces last-used writes: a busy script does not
// cost one write per request.
const lastUsedResolution = time.Minute

// AuthenticateToken verifies an API token. Errors: ErrUnauthenticated.
func (s *Service) AuthenticateToken(ctx context.Context, token string) (Principal, error) {
	if !strings.HasPrefix(token, apiTokenPrefix) {
		return Principal{}, ErrUnauthenticated
	}
	var row struct {
		models.APIToken
		Username string
	}
	err := s.db.WithContext(ctx).Table("api_tokens").
		Select("api_tokens.*, admin_users.username").
		Joins("JOIN admin_users ON admin_users.id = api_tokens.user_id").
		Where("api_tokens.token_hash = ?", digest(token)).Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Principal{}, ErrUnauthenticated
	}
	if err != nil {
		return Principal{}, err
	}
	if row.RevokedAt != nil {
		return Principal{}, ErrUnauthenticated
	}
	now := s.now().UTC()
	if row.LastUsedAt == nil || now.Sub(*row.LastUsedAt) >= lastUsedResolution {
		if err := s.db.WithContext(ctx).Model(&models.APIToken{}).Where("id = ?", row.ID).
			Update("last_used_at", now).Error; err != nil {
			return Principal{}, err
		}
	}
	return Principal{UserID: row.UserID, Username: row.Username, Via: "token", TokenID: row.ID}, nil
}

// AuditPage is one page of the admin audit log, newest first.
func (s *Service) AuditPage(ctx context.Context, before int64, limit int) ([]models.AdminAudit, error) {
	q := s.db.WithContext(ctx).Order("id DESC").Limit(limit)
	if before > 0 {
		q = q.Where("id < ?", before)
	}
	var rows []models.AdminAudit
	return rows, q.Find(&rows).Error
}

func (s *Service) audit(ctx context.Context, actor, action, target, outcome, remote, detail string) error {
	return s.auditTx(s.db.WithContext(ctx), actor, action, target, outcome, remote, detail)
}

func (s *Service) auditTx(tx *gorm.DB, actor, action, target, outcome, remote, detail string) error {
	return tx.Create(&models.AdminAudit{
		At: s.now().UTC(), Actor: actor, Action: action, Target: target,
		Outcome: outcome, RemoteAddr: remote, Detail: detail,
	}).Error
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

func remoteHost(remote string) string {
	if i := strings.LastIndex(remote, ":"); i > 0 {
		return strings.Trim(remote[:i], "[]")
	}
	return remote
}
