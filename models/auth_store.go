package models

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/dbtime"
)

// AuthStore implements auth.Store over GORM for both dialects.
type AuthStore struct {
	db *DB
	// g is the database, or the transaction when inTx.
	g    *gorm.DB
	inTx bool
	// batched: g is a group commit's shared transaction, which
	// carries its own context (a caller's must not cancel a statement
	// others depend on).
	batched bool
	// ftx is the ledger's transaction this store joined (authStoreIn):
	// announcements ride on its notifications.
	ftx *fleetTx
	// notify names this replica and its NOTIFY channel (Postgres).
	notify *authNotify
}

// authNotify is what AnnounceRevoked needs outside a ledger transaction.
type authNotify struct {
	replica string
	once    sync.Once
	channel string
}

var _ auth.Store = (*AuthStore)(nil)

// NewAuthStore returns the administrators' store.
func NewAuthStore(db *DB) *AuthStore { return &AuthStore{db: db, g: db.DB, notify: &authNotify{}} }

// WithReplica names this replica in the revocations it announces, so its
// own listener skips them (it forgot them when they committed). It answers
// s.
func (s *AuthStore) WithReplica(replica string) *AuthStore {
	s.notify = &authNotify{replica: replica}
	return s
}

// Tx runs fn in one transaction; inside one, fn joins it.
func (s *AuthStore) Tx(ctx context.Context, fn func(auth.Store) error) error {
	if s.inTx {
		return fn(s)
	}
	return s.db.Tx(ctx, func(g *gorm.DB) error {
		return fn(&AuthStore{db: s.db, g: g, inTx: true, notify: s.notify})
	})
}

// authStoreIn is the administrators' store inside a fleet transaction (the
// ledger's: a credential operation and its end commit together).
func authStoreIn(db *DB, t *fleetTx) *AuthStore {
	return &AuthStore{db: db, g: t.g, inTx: true, batched: t.batched, ftx: t}
}

// AnnounceRevoked implements auth.Store. In a ledger transaction it is one
// more of the batch's notifications (sent with its commit, and handed to
// this replica's hook after it); otherwise, on Postgres, one pg_notify in
// the transaction (or on its own, after the change committed).
func (s *AuthStore) AnnounceRevoked(ctx context.Context, subject string) error {
	n := fleet.Notification{Kind: fleet.NotifyCredentials, NodeID: subject}
	if s.ftx != nil {
		return s.ftx.Notify(ctx, n)
	}
	if s.db.Dialect != Postgres {
		return nil // one process (DECISIONS.md §23): nobody else to tell
	}
	no := s.notify
	if no == nil {
		no = &authNotify{}
		s.notify = no
	}
	no.once.Do(func() { no.channel = NotifyChannel(s.db) })
	return s.q(ctx).Exec("SELECT pg_notify(?, ?)", no.channel, n.Encode(no.replica)).Error
}

func (s *AuthStore) q(ctx context.Context) *gorm.DB {
	if s.ftx != nil {
		return s.ftx.db(ctx) // the transaction's, after what it kept back (later.go)
	}
	if s.batched {
		return s.g
	}
	return s.g.WithContext(ctx)
}

// write runs a write the service makes outside its transactions (a
// login's session, a logout, a token's last use) where writes go
// (DB.Write: on SQLite the one writer, so it does not meet the group
// commit in SQLite's busy handler); inside a transaction, on it.
func (s *AuthStore) write(ctx context.Context, fn func(g *gorm.DB) error) error {
	if s.inTx {
		return fn(s.q(ctx))
	}
	return s.db.Write(ctx, fn)
}

func authErr(err error) error {
	switch {
	case errors.Is(err, gorm.ErrRecordNotFound):
		return auth.ErrNoRows
	case errors.Is(err, gorm.ErrDuplicatedKey):
		return auth.ErrDuplicate
	}
	return err
}

func userOf(u AdminUser) auth.User {
	return auth.User{ID: u.ID, Username: u.Username, PasswordHash: u.PasswordHash, CreatedAt: u.CreatedAt,
		DisabledAt: dbtime.NormPtr(u.DisabledAt), PasswordChangedAt: dbtime.NormPtr(u.PasswordChangedAt)}
}

func tokenOf(t APIToken) auth.APIToken {
	out := auth.APIToken{ID: t.ID, Name: t.Name, UserID: t.UserID, TokenHash: t.TokenHash,
		CreatedAt: t.CreatedAt, LastUsedAt: t.LastUsedAt, RevokedAt: t.RevokedAt}
	if t.RequestID != nil {
		out.RequestID = *t.RequestID
	}
	return out
}

func auditOf(a AdminAudit) auth.AuditEntry {
	return auth.AuditEntry{ID: a.ID, At: a.At, Actor: a.Actor, Action: a.Action, Target: a.Target,
		Outcome: a.Outcome, RemoteAddr: a.RemoteAddr, Detail: a.Detail, Count: a.Count, LastAt: a.LastAt}
}

// CountUsers implements auth.Store.
func (s *AuthStore) CountUsers(ctx context.Context) (int64, error) {
	var n int64
	err := s.q(ctx).Model(&AdminUser{}).Count(&n).Error
	return n, err
}

// InsertUser implements auth.Store.
func (s *AuthStore) InsertUser(ctx context.Context, u auth.User) error {
	return authErr(s.q(ctx).Create(&AdminUser{ID: u.ID, Username: u.Username, PasswordHash: u.PasswordHash, CreatedAt: u.CreatedAt}).Error)
}

// UserByName implements auth.Store.
func (s *AuthStore) UserByName(ctx context.Context, username string) (auth.User, error) {
	var u AdminUser
	if err := s.q(ctx).Where("username = ?", username).Take(&u).Error; err != nil {
		return auth.User{}, authErr(err)
	}
	return userOf(u), nil
}

// UserByNameFold implements auth.Store (usernames are ASCII, which lower()
// folds alike on both dialects).
func (s *AuthStore) UserByNameFold(ctx context.Context, username string) (auth.User, error) {
	var u AdminUser
	if err := s.q(ctx).Where("lower(username) = lower(?)", username).Take(&u).Error; err != nil {
		return auth.User{}, authErr(err)
	}
	return userOf(u), nil
}

// LockUser implements auth.Store; inside a transaction on Postgres the row
// is locked (SQLite transactions hold the write lock from their start).
func (s *AuthStore) LockUser(ctx context.Context, username string) (auth.User, error) {
	q := s.q(ctx).Where("username = ?", username)
	if s.inTx && s.db.Dialect == Postgres {
		q = q.Clauses(clause.Locking{Strength: "UPDATE"})
	}
	var u AdminUser
	if err := q.Take(&u).Error; err != nil {
		return auth.User{}, authErr(err)
	}
	return userOf(u), nil
}

// EnabledUsers implements auth.Store. On Postgres, inside a transaction, a
// row another transaction disabled meanwhile is read again after its lock
// is released and drops out of the answer (READ COMMITTED re-checks the
// WHERE of a locked row).
func (s *AuthStore) EnabledUsers(ctx context.Context) ([]auth.User, error) {
	q := s.q(ctx).Where("disabled_at IS NULL").Order("id")
	if s.inTx && s.db.Dialect == Postgres {
		q = q.Clauses(clause.Locking{Strength: "UPDATE"})
	}
	var rows []AdminUser
	if err := q.Find(&rows).Error; err != nil {
		return nil, err
	}
	out := make([]auth.User, 0, len(rows))
	for _, u := range rows {
		out = append(out, userOf(u))
	}
	return out, nil
}

// newestFirst orders q by (created_at, id) newest first, from below
// before (nil: from the newest), at most limit rows (0: all).
func newestFirst(q *gorm.DB, before *auth.PageKey, limit int) *gorm.DB {
	q = q.Order("created_at DESC, id DESC")
	if before != nil {
		at := dbtime.Norm(before.CreatedAt)
		q = q.Where("(created_at < ? OR (created_at = ? AND id < ?))", at, at, before.ID)
	}
	if limit > 0 {
		q = q.Limit(limit)
	}
	return q
}

// Users implements auth.Store.
func (s *AuthStore) Users(ctx context.Context, before *auth.PageKey, limit int, now time.Time) ([]auth.User, error) {
	var rows []AdminUser
	if err := newestFirst(s.q(ctx), before, limit).Find(&rows).Error; err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(rows))
	for _, u := range rows {
		ids = append(ids, u.ID)
	}
	// The page's open sessions, counted in one read.
	var counts []struct {
		UserID string
		N      int64
	}
	if len(ids) > 0 {
		err := s.q(ctx).Model(&ConsoleSession{}).Select("user_id, COUNT(*) AS n").
			Where("user_id IN ? AND revoked_at IS NULL AND expires_at > ?", ids, dbtime.Norm(now)).
			Group("user_id").Find(&counts).Error
		if err != nil {
			return nil, err
		}
	}
	live := make(map[string]int64, len(counts))
	for _, c := range counts {
		live[c.UserID] = c.N
	}
	out := make([]auth.User, 0, len(rows))
	for _, r := range rows {
		u := userOf(r)
		u.PasswordHash = "" // a listing has no use for it
		u.LiveSessions = live[r.ID]
		out = append(out, u)
	}
	return out, nil
}

// UpdateUser implements auth.Store.
func (s *AuthStore) UpdateUser(ctx context.Context, u auth.User) error {
	return s.q(ctx).Model(&AdminUser{}).Where("id = ?", u.ID).Updates(map[string]any{
		"password_hash": u.PasswordHash, "password_changed_at": dbtime.NormPtr(u.PasswordChangedAt),
		"disabled_at": dbtime.NormPtr(u.DisabledAt),
	}).Error
}

// FirstUser implements auth.Store.
func (s *AuthStore) FirstUser(ctx context.Context) (auth.User, error) {
	var u AdminUser
	if err := s.q(ctx).Where("disabled_at IS NULL").Order("created_at, id").Take(&u).Error; err != nil {
		return auth.User{}, authErr(err)
	}
	return userOf(u), nil
}

// InsertSession implements auth.Store.
func (s *AuthStore) InsertSession(ctx context.Context, cs auth.ConsoleSession) error {
	return authErr(s.write(ctx, func(g *gorm.DB) error {
		return g.Create(&ConsoleSession{ID: cs.ID, UserID: cs.UserID, CreatedAt: cs.CreatedAt,
			ExpiresAt: cs.ExpiresAt, RevokedAt: cs.RevokedAt, RemoteAddr: cs.RemoteAddr}).Error
	}))
}

// withUser is a row joined with its administrator, whose columns are
// renamed so they do not shadow the row's own.
type withUser struct {
	UserName         string
	UserPasswordHash string
	UserCreatedAt    time.Time
	UserDisabledAt   *time.Time
}

const userColumns = "admin_users.username AS user_name, admin_users.password_hash AS user_password_hash, " +
	"admin_users.created_at AS user_created_at, admin_users.disabled_at AS user_disabled_at"

func (w withUser) user(id string) auth.User {
	return auth.User{ID: id, Username: w.UserName, PasswordHash: w.UserPasswordHash, CreatedAt: w.UserCreatedAt,
		DisabledAt: dbtime.NormPtr(w.UserDisabledAt)}
}

// Session implements auth.Store: one query, the session with its user.
func (s *AuthStore) Session(ctx context.Context, id, userID string) (auth.ConsoleSession, auth.User, error) {
	var row struct {
		ConsoleSession
		User withUser `gorm:"embedded"`
	}
	err := s.q(ctx).Table("console_sessions").
		Select("console_sessions.*, "+userColumns).
		Joins("JOIN admin_users ON admin_users.id = console_sessions.user_id").
		Where("console_sessions.id = ? AND console_sessions.user_id = ?", id, userID).
		Take(&row).Error
	if err != nil {
		return auth.ConsoleSession{}, auth.User{}, authErr(err)
	}
	cs := row.ConsoleSession
	return auth.ConsoleSession{ID: cs.ID, UserID: cs.UserID, CreatedAt: cs.CreatedAt, ExpiresAt: cs.ExpiresAt,
		RevokedAt: cs.RevokedAt, RemoteAddr: cs.RemoteAddr}, row.User.user(cs.UserID), nil
}

// RevokeSession implements auth.Store.
func (s *AuthStore) RevokeSession(ctx context.Context, id string, at time.Time) error {
	return s.write(ctx, func(g *gorm.DB) error {
		return g.Model(&ConsoleSession{}).Where("id = ? AND revoked_at IS NULL", id).Update("revoked_at", at).Error
	})
}

// RevokeUserSessions implements auth.Store.
func (s *AuthStore) RevokeUserSessions(ctx context.Context, userID, exceptID string, at time.Time) (int64, error) {
	var n int64
	err := s.write(ctx, func(g *gorm.DB) error {
		res := g.Model(&ConsoleSession{}).
			Where("user_id = ? AND id <> ? AND revoked_at IS NULL AND expires_at > ?", userID, exceptID, dbtime.Norm(at)).
			Update("revoked_at", dbtime.Norm(at))
		n = res.RowsAffected
		return res.Error
	})
	return n, err
}

// InsertToken implements auth.Store.
func (s *AuthStore) InsertToken(ctx context.Context, t auth.APIToken) error {
	row := &APIToken{ID: t.ID, Name: t.Name, UserID: t.UserID, TokenHash: t.TokenHash,
		CreatedAt: t.CreatedAt, LastUsedAt: t.LastUsedAt, RevokedAt: t.RevokedAt}
	if t.RequestID != "" {
		row.RequestID = &t.RequestID
	}
	return authErr(s.q(ctx).Create(row).Error)
}

// TokenByRequest implements auth.Store.
func (s *AuthStore) TokenByRequest(ctx context.Context, userID, requestID string) (auth.APIToken, error) {
	var t APIToken
	if err := s.q(ctx).Where("user_id = ? AND request_id = ?", userID, requestID).Take(&t).Error; err != nil {
		return auth.APIToken{}, authErr(err)
	}
	return tokenOf(t), nil
}

// Token implements auth.Store; inside a transaction on Postgres the row is
// locked (SQLite transactions hold the write lock from their start).
func (s *AuthStore) Token(ctx context.Context, id string) (auth.APIToken, error) {
	q := s.q(ctx).Where("id = ?", id)
	if s.inTx && s.db.Dialect == Postgres {
		q = q.Clauses(clause.Locking{Strength: "UPDATE"})
	}
	var t APIToken
	if err := q.Take(&t).Error; err != nil {
		return auth.APIToken{}, authErr(err)
	}
	return tokenOf(t), nil
}

// TokenByHash implements auth.Store: one query, the token with its user.
func (s *AuthStore) TokenByHash(ctx context.Context, hash string) (auth.APIToken, auth.User, error) {
	var row struct {
		APIToken
		User withUser `gorm:"embedded"`
	}
	err := s.q(ctx).Table("api_tokens").
		Select("api_tokens.*, "+userColumns).
		Joins("JOIN admin_users ON admin_users.id = api_tokens.user_id").
		Where("api_tokens.token_hash = ?", hash).Take(&row).Error
	if err != nil {
		return auth.APIToken{}, auth.User{}, authErr(err)
	}
	return tokenOf(row.APIToken), row.User.user(row.UserID), nil
}

// Tokens implements auth.Store.
func (s *AuthStore) Tokens(ctx context.Context, before *auth.PageKey, limit int) ([]auth.APIToken, error) {
	var rows []APIToken
	if err := newestFirst(s.q(ctx), before, limit).Find(&rows).Error; err != nil {
		return nil, err
	}
	// The owners' names, so a listing says whose each token is: one
	// read of the page's owners (a handful of administrators).
	ids := make([]string, 0, len(rows))
	for _, t := range rows {
		ids = append(ids, t.UserID)
	}
	var owners []AdminUser
	if len(ids) > 0 {
		if err := s.q(ctx).Select("id", "username").Where("id IN ?", ids).Find(&owners).Error; err != nil {
			return nil, err
		}
	}
	names := make(map[string]string, len(owners))
	for _, u := range owners {
		names[u.ID] = u.Username
	}
	out := make([]auth.APIToken, 0, len(rows))
	for _, t := range rows {
		tok := tokenOf(t)
		tok.Username = names[t.UserID]
		out = append(out, tok)
	}
	return out, nil
}

// RevokeToken implements auth.Store.
func (s *AuthStore) RevokeToken(ctx context.Context, id string, at time.Time) error {
	return s.q(ctx).Model(&APIToken{}).Where("id = ? AND revoked_at IS NULL", id).Update("revoked_at", at).Error
}

// TouchToken implements auth.Store.
func (s *AuthStore) TouchToken(ctx context.Context, id string, at time.Time) error {
	return s.write(ctx, func(g *gorm.DB) error {
		return g.Model(&APIToken{}).Where("id = ?", id).Update("last_used_at", at).Error
	})
}

// AppendAudit implements auth.Store.
func (s *AuthStore) AppendAudit(ctx context.Context, e auth.AuditEntry) error {
	if e.Count < 1 {
		e.Count = 1
	}
	return s.q(ctx).Create(&AdminAudit{At: e.At, Actor: e.Actor, Action: e.Action, Target: e.Target,
		Outcome: e.Outcome, RemoteAddr: e.RemoteAddr, Detail: e.Detail, Count: e.Count, LastAt: e.LastAt}).Error
}

// CoalesceAudit implements auth.Store: the newest matching entry, read
// (locked in a transaction on Postgres; SQLite's holds the write lock) and
// updated by its id; the (remote_addr, action, outcome, id) index finds it.
func (s *AuthStore) CoalesceAudit(ctx context.Context, e auth.AuditEntry, since time.Time, merge func(string) string) error {
	q := s.q(ctx).Model(&AdminAudit{}).Select("id", "detail").
		Where("remote_addr = ? AND action = ? AND outcome = ? AND at >= ?", e.RemoteAddr, e.Action, e.Outcome, since).
		Order("id DESC").Limit(1)
	if s.inTx && s.db.Dialect == Postgres {
		q = q.Clauses(clause.Locking{Strength: "UPDATE"})
	}
	var newest []AdminAudit
	if err := q.Find(&newest).Error; err != nil {
		return err
	}
	if len(newest) == 0 {
		return s.AppendAudit(ctx, e)
	}
	return s.q(ctx).Model(&AdminAudit{}).Where("id = ?", newest[0].ID).
		Updates(map[string]any{"count": gorm.Expr("count + 1"), "last_at": e.At, "detail": merge(newest[0].Detail)}).Error
}

// Audit implements auth.Store.
func (s *AuthStore) Audit(ctx context.Context, before int64, limit int) ([]auth.AuditEntry, error) {
	q := s.q(ctx).Order("id DESC").Limit(limit)
	if before > 0 {
		q = q.Where("id < ?", before)
	}
	var rows []AdminAudit
	if err := q.Find(&rows).Error; err != nil {
		return nil, err
	}
	out := make([]auth.AuditEntry, 0, len(rows))
	for _, a := range rows {
		out = append(out, auditOf(a))
	}
	return out, nil
}

func packageHostOf(h PackageHost) auth.PackageHost {
	out := auth.PackageHost{Cursor: h.Seq, ID: h.ID, Name: h.Name, Generation: h.Generation,
		CreatedAt: h.CreatedAt.UTC(), UpdatedAt: h.UpdatedAt.UTC(), RevokedAt: dbtime.NormPtr(h.RevokedAt)}
	_ = json.Unmarshal([]byte(h.Families), &out.Families)
	if out.Families == nil {
		out.Families = []string{}
	}
	return out
}

// InsertPackageHost implements auth.Store.
func (s *AuthStore) InsertPackageHost(ctx context.Context, h auth.PackageHost) error {
	fams, err := json.Marshal(h.Families)
	if err != nil {
		return err
	}
	return authErr(s.q(ctx).Create(&PackageHost{ID: h.ID, Name: h.Name, Families: string(fams), Generation: h.Generation,
		CreatedAt: dbtime.Norm(h.CreatedAt), UpdatedAt: dbtime.Norm(h.UpdatedAt), RevokedAt: dbtime.NormPtr(h.RevokedAt)}).Error)
}

// PackageHost implements auth.Store; inside a transaction on Postgres the
// row is locked (SQLite transactions hold the write lock from their start).
func (s *AuthStore) PackageHost(ctx context.Context, id string) (auth.PackageHost, error) {
	q := s.q(ctx).Where("id = ?", id)
	if s.inTx && s.db.Dialect == Postgres {
		q = q.Clauses(clause.Locking{Strength: "UPDATE"})
	}
	var h PackageHost
	if err := q.Take(&h).Error; err != nil {
		return auth.PackageHost{}, authErr(err)
	}
	return packageHostOf(h), nil
}

// PackageHostByName implements auth.Store.
func (s *AuthStore) PackageHostByName(ctx context.Context, name string) (auth.PackageHost, error) {
	var h PackageHost
	if err := s.q(ctx).Where("name = ?", name).Take(&h).Error; err != nil {
		return auth.PackageHost{}, authErr(err)
	}
	return packageHostOf(h), nil
}

// PackageHosts implements auth.Store.
func (s *AuthStore) PackageHosts(ctx context.Context, before int64, limit int) ([]auth.PackageHost, error) {
	q := s.q(ctx).Order("seq DESC").Limit(limit)
	if before > 0 {
		q = q.Where("seq < ?", before)
	}
	var rows []PackageHost
	if err := q.Find(&rows).Error; err != nil {
		return nil, err
	}
	out := make([]auth.PackageHost, 0, len(rows))
	for _, h := range rows {
		out = append(out, packageHostOf(h))
	}
	return out, nil
}

// UpdatePackageHost implements auth.Store.
func (s *AuthStore) UpdatePackageHost(ctx context.Context, h auth.PackageHost) error {
	return s.q(ctx).Model(&PackageHost{}).Where("id = ?", h.ID).Updates(map[string]any{
		"generation": h.Generation, "revoked_at": dbtime.NormPtr(h.RevokedAt), "updated_at": dbtime.Norm(h.UpdatedAt),
	}).Error
}

// InsertPackageHostToken implements auth.Store.
func (s *AuthStore) InsertPackageHostToken(ctx context.Context, t auth.PackageHostToken) error {
	return authErr(s.q(ctx).Create(&PackageHostToken{TokenHash: t.TokenHash, HostID: t.HostID, Generation: t.Generation,
		OperationID: t.OperationID, CreatedAt: dbtime.Norm(t.CreatedAt)}).Error)
}

// PackageHostByToken implements auth.Store: one query, the token with its
// host.
func (s *AuthStore) PackageHostByToken(ctx context.Context, hash string) (auth.PackageHostToken, auth.PackageHost, error) {
	var row struct {
		PackageHostToken
		Host PackageHost `gorm:"embedded;embeddedPrefix:ph_"`
	}
	err := s.q(ctx).Table("package_host_tokens").
		Select("package_host_tokens.*, package_hosts.seq AS ph_seq, package_hosts.id AS ph_id, "+
			"package_hosts.name AS ph_name, package_hosts.families AS ph_families, "+
			"package_hosts.generation AS ph_generation, package_hosts.created_at AS ph_created_at, "+
			"package_hosts.updated_at AS ph_updated_at, package_hosts.revoked_at AS ph_revoked_at").
		Joins("JOIN package_hosts ON package_hosts.id = package_host_tokens.host_id").
		Where("package_host_tokens.token_hash = ?", hash).Take(&row).Error
	if err != nil {
		return auth.PackageHostToken{}, auth.PackageHost{}, authErr(err)
	}
	t := row.PackageHostToken
	return auth.PackageHostToken{TokenHash: t.TokenHash, HostID: t.HostID, Generation: t.Generation,
		OperationID: t.OperationID, CreatedAt: t.CreatedAt.UTC()}, packageHostOf(row.Host), nil
}
