package auth

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/nodeward/nodeward/errcode"
)

// Administrators manage one another: add, disable and enable, end
// another's console sessions; each changes their own password. The CLI
// (through the running server's admin socket, or the database directly)
// does the same as SystemActor, which is how a fleet whose every
// administrator is locked out gets back in.

// Errors of the administrators' management.
var (
	// ErrAdminNotFound names an administrator that does not exist.
	ErrAdminNotFound = errcode.New(errcode.NotFound, "no such administrator")
	// ErrLastAdministrator refuses to disable the only enabled
	// administrator: nobody could sign in afterwards.
	ErrLastAdministrator = errcode.New(errcode.LastAdministrator,
		"that is the only enabled administrator: enable or add another first")
	// ErrSelfDisable refuses an administrator disabling their own account.
	ErrSelfDisable = errcode.New(errcode.SelfDisable,
		"you cannot disable your own account: another administrator, or the CLI, can")
)

// MsgNotCurrentPassword is ChangePassword's refusal of a wrong current
// password (the message of its current_password field).
const MsgNotCurrentPassword = "is not your current password"

// SystemActor is who the CLI acts as: the operator at the machine, with
// the data folder or the database in reach.
var SystemActor = Principal{Kind: KindAdmin, Username: "system", Via: "cli"}

// AddAdmin adds an administrator on another's behalf. Errors:
// validation_failed, ErrUsernameTaken, ErrOverloaded, ErrUnauthenticated
// (the actor was disabled meanwhile).
func (s *Service) AddAdmin(ctx context.Context, actor Principal, username, password, remote string) (User, error) {
	return s.addAdmin(ctx, actor.Username, remote, username, password, func(tx Store) error {
		return actorStanding(ctx, tx, actor)
	})
}

// ListAdmins lists administrators newest first: those created before
// before (nil: from the newest), at most limit, each with how many console
// sessions it has open now.
func (s *Service) ListAdmins(ctx context.Context, before *PageKey, limit int) ([]User, error) {
	return s.store.Users(ctx, before, limit, s.now())
}

// Admin answers the administrator of that username. Errors:
// ErrAdminNotFound.
func (s *Service) Admin(ctx context.Context, username string) (User, error) {
	u, err := s.store.UserByName(ctx, username)
	if errors.Is(err, ErrNoRows) {
		return User{}, ErrAdminNotFound
	}
	return u, err
}

// DisableAdmin disables an administrator: they cannot sign in, their
// console sessions end and their API tokens are refused (not revoked:
// enabling them again brings the tokens back). Disabling a disabled
// administrator changes nothing. It answers the administrator and how many
// sessions it ended. Every replica stops honouring their credentials when
// it hears the announcement committed with the change (cache.go). Errors:
// ErrAdminNotFound, ErrSelfDisable, ErrLastAdministrator,
// ErrUnauthenticated (the actor was disabled meanwhile).
func (s *Service) DisableAdmin(ctx context.Context, actor Principal, username, remote string) (User, int64, error) {
	var (
		u     User
		ended int64
	)
	err := s.store.Tx(ctx, func(tx Store) error {
		// Lock every enabled administrator first (in one order, so two
		// disabling each other at once wait rather than deadlock), so they
		// cannot both pass the count below.
		enabled, err := tx.EnabledUsers(ctx)
		if err != nil {
			return err
		}
		if actor.UserID != "" && !slices.ContainsFunc(enabled, func(e User) bool { return e.ID == actor.UserID }) {
			// Disabled while this request was on its way.
			return ErrUnauthenticated
		}
		if u, err = lockAdmin(ctx, tx, username); err != nil {
			return err
		}
		if actor.UserID != "" && actor.UserID == u.ID {
			return ErrSelfDisable
		}
		if u.DisabledAt != nil {
			return nil
		}
		if !others(enabled, u.ID) {
			return ErrLastAdministrator
		}
		now := s.now()
		u.DisabledAt = &now
		if err := tx.UpdateUser(ctx, u); err != nil {
			return err
		}
		if ended, err = tx.RevokeUserSessions(ctx, u.ID, "", now); err != nil {
			return err
		}
		if err := tx.AnnounceRevoked(ctx, UserSubject(u.ID)); err != nil {
			return err
		}
		return s.audit(ctx, tx, AuditEntry{Actor: actor.Username, Action: "admin.disable", Target: u.Username,
			Outcome: "ok", RemoteAddr: remote, Detail: sessionsDetail(ended)})
	})
	if err == nil {
		s.cache.forget(UserSubject(u.ID), "local")
	}
	return u, ended, err
}

// EnableAdmin enables a disabled administrator again: they may sign in,
// and their API tokens that were not revoked work again. Enabling an
// enabled administrator changes nothing. Errors: ErrAdminNotFound,
// ErrUnauthenticated (the actor was disabled meanwhile).
func (s *Service) EnableAdmin(ctx context.Context, actor Principal, username, remote string) (User, error) {
	var u User
	err := s.store.Tx(ctx, func(tx Store) error {
		if err := actorStanding(ctx, tx, actor); err != nil {
			return err
		}
		var err error
		if u, err = lockAdmin(ctx, tx, username); err != nil || u.DisabledAt == nil {
			return err
		}
		u.DisabledAt = nil
		if err := tx.UpdateUser(ctx, u); err != nil {
			return err
		}
		return s.audit(ctx, tx, AuditEntry{Actor: actor.Username, Action: "admin.enable", Target: u.Username,
			Outcome: "ok", RemoteAddr: remote})
	})
	return u, err
}

// SignOutAdmin ends every open console session of an administrator (a lost
// laptop, a shared browser), without disabling them; their API tokens are
// untouched. An actor signing themselves out keeps the session they ask
// from. It answers how many sessions it ended. Errors: ErrAdminNotFound,
// ErrUnauthenticated (the actor was disabled meanwhile).
func (s *Service) SignOutAdmin(ctx context.Context, actor Principal, username, remote string) (User, int64, error) {
	var (
		u     User
		ended int64
	)
	err := s.store.Tx(ctx, func(tx Store) error {
		if err := actorStanding(ctx, tx, actor); err != nil {
			return err
		}
		var err error
		if u, err = lockAdmin(ctx, tx, username); err != nil {
			return err
		}
		keep := ""
		if actor.UserID == u.ID {
			keep = actor.SessionID
		}
		if ended, err = tx.RevokeUserSessions(ctx, u.ID, keep, s.now()); err != nil {
			return err
		}
		if err := tx.AnnounceRevoked(ctx, UserSubject(u.ID)); err != nil {
			return err
		}
		return s.audit(ctx, tx, AuditEntry{Actor: actor.Username, Action: "admin.sign_out", Target: u.Username,
			Outcome: "ok", RemoteAddr: remote, Detail: sessionsDetail(ended)})
	})
	if err == nil {
		s.cache.forget(UserSubject(u.ID), "local")
	}
	return u, ended, err
}

// ChangePassword changes the signed-in administrator's own password,
// given the current one, and ends every console session of theirs, the
// one asking too (a cookie that was stolen dies with the old password: the
// console hands its user a fresh session, SessionAfterPasswordChange); API
// tokens are untouched. A wrong current password counts against the same
// limit as a failed sign-in. Errors: validation_failed (current_password,
// new_password), ErrRateLimited, ErrOverloaded, ErrUnauthenticated (the
// account is gone or disabled).
func (s *Service) ChangePassword(ctx context.Context, p Principal, current, next, remote string) (int64, error) {
	var v errcode.Validation
	v.Check(current != "", "current_password", "required")
	checkNewPassword(&v, "new_password", next)
	v.Check(next != current, "new_password", "must differ from the current password")
	if err := v.Err(); err != nil {
		return 0, err
	}
	now := s.now()
	host := remoteHost(remote)
	key := limiterKey(p.Username, host)
	if !s.limiter.reserve(key, now) {
		s.auditRefusal(ctx, p.Username, "password.change", "rate_limited", host)
		return 0, ErrRateLimited
	}
	u, err := s.store.UserByName(ctx, p.Username)
	if errors.Is(err, ErrNoRows) || (err == nil && (u.ID != p.UserID || u.DisabledAt != nil)) {
		s.limiter.release(key)
		return 0, ErrUnauthenticated
	}
	if err != nil {
		s.limiter.release(key)
		return 0, err
	}
	ok := len(current) <= MaxPasswordLen
	if ok {
		ok, err = s.checkPassword(ctx, u.PasswordHash, current)
		if errors.Is(err, ErrOverloaded) || (err != nil && ctx.Err() != nil) {
			s.limiter.release(key)
			return 0, err
		}
	}
	if err != nil || !ok {
		s.limiter.fail(key, now)
		s.auditRefusal(ctx, p.Username, "password.change", "failed", host)
		var v errcode.Validation
		v.Add("current_password", MsgNotCurrentPassword)
		return 0, v.Err()
	}
	s.limiter.reset(key)
	_, ended, err := s.setPassword(ctx, p, p.Username, next, "", "admin.password_change", remote)
	return ended, err
}

// SessionAfterPasswordChange opens a fresh console session for p, whose
// session ChangePassword just ended with the rest: the browser that changed
// the password stays signed in, on a cookie nobody else has seen. Call it
// only after ChangePassword succeeded for p in the same request. Errors:
// ErrUnauthenticated (p is no longer an enabled administrator).
func (s *Service) SessionAfterPasswordChange(ctx context.Context, p Principal, remote string) (string, time.Time, error) {
	if err := actorStanding(ctx, s.store, p); err != nil {
		return "", time.Time{}, err
	}
	return s.openSession(ctx, p.UserID, remote)
}

// ResetPassword sets an administrator's password without the current one
// (the CLI's way back in) and ends all their console sessions; it answers
// the administrator and how many sessions ended. It does not enable a
// disabled administrator. Errors: validation_failed, ErrAdminNotFound,
// ErrOverloaded.
func (s *Service) ResetPassword(ctx context.Context, actor Principal, username, password, remote string) (User, int64, error) {
	var v errcode.Validation
	checkNewPassword(&v, "password", password)
	if err := v.Err(); err != nil {
		return User{}, 0, err
	}
	return s.setPassword(ctx, actor, username, password, "", "admin.password_reset", remote)
}

// setPassword hashes password, stores it for username and ends that
// administrator's sessions but keep; it answers the administrator and how
// many sessions ended.
func (s *Service) setPassword(ctx context.Context, actor Principal, username, password, keep, action, remote string) (User, int64, error) {
	hash, err := s.hashPassword(ctx, password)
	if err != nil {
		return User{}, 0, err
	}
	var (
		u     User
		ended int64
	)
	err = s.store.Tx(ctx, func(tx Store) error {
		if err := actorStanding(ctx, tx, actor); err != nil {
			return err
		}
		var err error
		if u, err = lockAdmin(ctx, tx, username); err != nil {
			return err
		}
		now := s.now()
		u.PasswordHash, u.PasswordChangedAt = hash, &now
		if err := tx.UpdateUser(ctx, u); err != nil {
			return err
		}
		if ended, err = tx.RevokeUserSessions(ctx, u.ID, keep, now); err != nil {
			return err
		}
		if err := tx.AnnounceRevoked(ctx, UserSubject(u.ID)); err != nil {
			return err
		}
		return s.audit(ctx, tx, AuditEntry{Actor: actor.Username, Action: action, Target: u.Username,
			Outcome: "ok", RemoteAddr: remote, Detail: sessionsDetail(ended)})
	})
	if err == nil {
		s.cache.forget(UserSubject(u.ID), "local")
	}
	return u, ended, err
}

// actorStanding refuses an administrator who was disabled (or removed)
// after their request was authenticated: a change they asked for in that
// window does not happen. SystemActor (no user) always stands.
func actorStanding(ctx context.Context, tx Store, actor Principal) error {
	if actor.UserID == "" {
		return nil
	}
	u, err := tx.UserByName(ctx, actor.Username)
	if errors.Is(err, ErrNoRows) || (err == nil && (u.ID != actor.UserID || u.DisabledAt != nil)) {
		return ErrUnauthenticated
	}
	return err
}

func lockAdmin(ctx context.Context, tx Store, username string) (User, error) {
	u, err := tx.LockUser(ctx, username)
	if errors.Is(err, ErrNoRows) {
		return User{}, ErrAdminNotFound
	}
	return u, err
}

// others reports whether users holds an administrator other than id.
func others(users []User, id string) bool {
	for _, u := range users {
		if u.ID != id {
			return true
		}
	}
	return false
}

func sessionsDetail(n int64) string {
	if n == 1 {
		return "ended 1 console session"
	}
	return "ended " + strconv.FormatInt(n, 10) + " console sessions"
}
