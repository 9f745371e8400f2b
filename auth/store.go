package auth

import (
	"context"
	"errors"
	"time"
)

// ErrNoRows is what a Store returns when a looked-up row does not exist.
var ErrNoRows = errors.New("no rows")

// ErrDuplicate is what a Store returns when an insert hits a unique key.
var ErrDuplicate = errors.New("duplicate key")

// PrincipalKind says what kind of caller a Principal is (DECISIONS.md §15).
type PrincipalKind string

// Principal kinds.
const (
	// KindAdmin is an administrator, by console session or API token.
	KindAdmin PrincipalKind = "admin"
	// KindPackageHost is an automation service, by its bearer token: it
	// may submit operations of its granted families and read its own.
	KindPackageHost PrincipalKind = "package_host"
)

// User is an administrator who signs in to the console.
type User struct {
	ID           string
	Username     string
	PasswordHash string
	CreatedAt    time.Time
	// DisabledAt is when the administrator was disabled; nil while
	// enabled. A disabled administrator cannot sign in and their API
	// tokens are refused.
	DisabledAt *time.Time
	// PasswordChangedAt is when the password was last set after the
	// account was created; nil when never.
	PasswordChangedAt *time.Time
	// LiveSessions is how many console sessions are open now, as
	// listings answer it (Store.Users); 0 elsewhere.
	LiveSessions int64
}

// APIToken is an administrator's token for scripts; only its SHA-256 is kept.
type APIToken struct {
	ID     string
	Name   string
	UserID string
	// Username is the owner's, as listings answer it (Store.Tokens).
	Username   string
	TokenHash  string
	CreatedAt  time.Time
	LastUsedAt *time.Time
	RevokedAt  *time.Time
	// RequestID is the console form's request id the token was made
	// under ("" for none): the same form sent again finds it.
	RequestID string
}

// PageKey is a row's place in a listing ordered newest first by creation
// (API tokens, administrators): a page's cursor.
type PageKey struct {
	CreatedAt time.Time
	ID        string
}

// ConsoleSession is one console login; the cookie's JWT names it, and
// logging out revokes it.
type ConsoleSession struct {
	ID         string
	UserID     string
	CreatedAt  time.Time
	ExpiresAt  time.Time
	RevokedAt  *time.Time
	RemoteAddr string
}

// AuditEntry is one row of the administrators' audit log. It never holds a
// secret. A coalesced entry stands for Count events of one client, the
// first at At and the latest at LastAt.
type AuditEntry struct {
	ID         int64
	At         time.Time
	Actor      string
	Action     string
	Target     string
	Outcome    string
	RemoteAddr string
	Detail     string
	// Count is how many events the entry stands for (1 unless coalesced).
	Count int64
	// LastAt is the time of the latest coalesced event; nil when Count is 1.
	LastAt *time.Time
}

// Store is the persistence the administrators' rules need. Every method
// may run inside a transaction opened by Tx (the store handed to fn) or on
// its own.
type Store interface {
	// Tx runs fn in one transaction with a Store bound to it; a non-nil
	// error rolls it back and is returned as is.
	Tx(ctx context.Context, fn func(tx Store) error) error

	// CountUsers answers how many administrators exist.
	CountUsers(ctx context.Context) (int64, error)
	// InsertUser adds an administrator; ErrDuplicate when the id or the
	// username exists.
	InsertUser(ctx context.Context, u User) error
	// UserByName answers the administrator of that exact username, or
	// ErrNoRows.
	UserByName(ctx context.Context, username string) (User, error)
	// UserByNameFold answers an administrator whose username equals
	// username but for ASCII case, or ErrNoRows.
	UserByNameFold(ctx context.Context, username string) (User, error)
	// FirstUser answers the oldest administrator not disabled, or
	// ErrNoRows when none is.
	FirstUser(ctx context.Context) (User, error)
	// LockUser answers the administrator of that exact username, or
	// ErrNoRows. Inside a transaction the row is locked until it ends.
	LockUser(ctx context.Context, username string) (User, error)
	// EnabledUsers answers every administrator not disabled. Inside a
	// transaction their rows are locked until it ends, so two
	// transactions each disabling another administrator are serialised
	// and the second sees the first's change.
	EnabledUsers(ctx context.Context) ([]User, error)
	// Users answers administrators newest first: only those created
	// before before (nil: from the newest), at most limit, each with its
	// LiveSessions counted at now.
	Users(ctx context.Context, before *PageKey, limit int, now time.Time) ([]User, error)
	// UpdateUser writes the administrator's password hash, its change time
	// and DisabledAt.
	UpdateUser(ctx context.Context, u User) error

	// InsertSession adds a console session; ErrDuplicate when the id exists.
	InsertSession(ctx context.Context, s ConsoleSession) error
	// Session answers the session of that id belonging to userID, with its
	// user; ErrNoRows when there is none (revoked and expired sessions are
	// answered: the caller judges them).
	Session(ctx context.Context, id, userID string) (ConsoleSession, User, error)
	// RevokeSession marks the session revoked at at; a missing or already
	// revoked session is left alone and is not an error.
	RevokeSession(ctx context.Context, id string, at time.Time) error
	// RevokeUserSessions marks every session of userID still open at at
	// revoked at at, except the session exceptID (""; none), and answers
	// how many it ended.
	RevokeUserSessions(ctx context.Context, userID, exceptID string, at time.Time) (int64, error)

	// InsertToken adds an API token; ErrDuplicate when the id or the digest
	// exists.
	InsertToken(ctx context.Context, t APIToken) error
	// TokenByRequest answers the token userID made under requestID, or
	// ErrNoRows.
	TokenByRequest(ctx context.Context, userID, requestID string) (APIToken, error)
	// Token answers the token of that id, or ErrNoRows. Inside a
	// transaction the row is locked until it ends.
	Token(ctx context.Context, id string) (APIToken, error)
	// TokenByHash answers the token with that digest and its user, or
	// ErrNoRows.
	TokenByHash(ctx context.Context, hash string) (APIToken, User, error)
	// Tokens answers tokens newest first: only those created before
	// before (nil: from the newest), at most limit (0: every one).
	Tokens(ctx context.Context, before *PageKey, limit int) ([]APIToken, error)
	// RevokeToken marks the token revoked at at; a missing or already
	// revoked token is left alone and is not an error.
	RevokeToken(ctx context.Context, id string, at time.Time) error
	// TouchToken records a use of the token at at; a missing token is not
	// an error.
	TouchToken(ctx context.Context, id string, at time.Time) error

	// InsertPackageHost adds a package host; ErrDuplicate when the id or
	// the name exists.
	InsertPackageHost(ctx context.Context, h PackageHost) error
	// PackageHost answers the package host of that id, or ErrNoRows. Inside
	// a transaction the row is locked until it ends, so a revocation and a
	// submission checking the host's generation are serialised.
	PackageHost(ctx context.Context, id string) (PackageHost, error)
	// PackageHostByName answers the package host of that exact name, or
	// ErrNoRows.
	PackageHostByName(ctx context.Context, name string) (PackageHost, error)
	// PackageHosts answers up to limit package hosts with a cursor below
	// before (any when before is 0), newest first.
	PackageHosts(ctx context.Context, before int64, limit int) ([]PackageHost, error)
	// UpdatePackageHost writes the host's generation and revocation.
	UpdatePackageHost(ctx context.Context, h PackageHost) error
	// InsertPackageHostToken records a minted token's digest;
	// ErrDuplicate when the digest exists.
	InsertPackageHostToken(ctx context.Context, t PackageHostToken) error
	// PackageHostByToken answers the token with that digest and its host,
	// or ErrNoRows.
	PackageHostByToken(ctx context.Context, hash string) (PackageHostToken, PackageHost, error)

	// AnnounceRevoked tells the other replicas that the credentials of
	// subject (TokenSubject, HostSubject, SessionSubject, UserSubject)
	// changed, so they drop what they cached of it. Inside a transaction
	// it is sent when, and only if, it commits (on Postgres, a NOTIFY); a
	// single-process database (SQLite) has nobody to tell. Inside a ledger transaction the
	// commit also hands it to this replica (the fleet's commit hook).
	AnnounceRevoked(ctx context.Context, subject string) error

	// AppendAudit adds an audit entry (its ID is assigned; Count below 1
	// is stored as 1).
	AppendAudit(ctx context.Context, e AuditEntry) error
	// CoalesceAudit folds e into the newest entry with the same Action,
	// Outcome and RemoteAddr whose At is at or after since: one more in its
	// Count, its LastAt set to e.At and its Detail to merge(its Detail).
	// When there is none it appends e. Inside a transaction the entry is
	// locked while merged; outside one two concurrent calls may both
	// append (every event is still counted) or merge one detail twice.
	CoalesceAudit(ctx context.Context, e AuditEntry, since time.Time, merge func(detail string) string) error
	// Audit answers up to limit entries with ID below before (any ID when
	// before is 0), newest first.
	Audit(ctx context.Context, before int64, limit int) ([]AuditEntry, error)
}
