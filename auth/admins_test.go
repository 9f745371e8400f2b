package auth_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// actor answers the principal of the administrator named username.
func actor(t *testing.T, s *auth.Service, username string) auth.Principal {
	t.Helper()
	u, err := s.Admin(ctx, username)
	require.NoError(t, err)
	return auth.Principal{Kind: auth.KindAdmin, UserID: u.ID, Username: u.Username, Via: "token"}
}

func actions(t *testing.T, s *auth.Service, target string) []string {
	t.Helper()
	rows, err := s.AuditPage(ctx, 0, 500)
	require.NoError(t, err)
	var out []string
	for i := len(rows) - 1; i >= 0; i-- {
		if rows[i].Target == target {
			out = append(out, rows[i].Action)
		}
	}
	return out
}

func TestAdminDisable(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := newService(t, db, auth.Options{})
		root := actor(t, s, adminName)
		_, err := s.AddAdmin(ctx, root, "bob", "bobs-long-password", "127.0.0.1:1")
		require.NoError(t, err)
		cookie, _, err := s.Login(ctx, "bob", "bobs-long-password", "127.0.0.1:1")
		require.NoError(t, err)
		bob, err := s.AuthenticateSession(ctx, cookie)
		require.NoError(t, err)
		token, _, err := s.CreateToken(ctx, bob, "bobs-script", "127.0.0.1:1")
		require.NoError(t, err)
		_, err = s.AuthenticateToken(ctx, token) // cached from here
		require.NoError(t, err)

		t.Run("NamesAndPasswordsRefused", func(t *testing.T) {
			for name, c := range map[string]struct{ username, password, field string }{
				"TheCommandLinesName": {"System", "a-long-enough-password", "username"},
				"OnlySpaces":          {"carol", "              ", "password"},
				"ControlCharacters":   {"carol", "a-long-enough\x00password", "password"},
				"NotUTF8":             {"carol", "a-long-enough-\xffpassword", "password"},
			} {
				_, err := s.AddAdmin(ctx, root, c.username, c.password, "")
				var ce *errcode.Error
				require.True(t, errors.As(err, &ce), name)
				require.Equal(t, c.field, ce.Fields[0].Field, name)
			}
			_, err := s.AddAdmin(ctx, root, "BOB", "a-long-enough-password", "")
			require.ErrorIs(t, err, auth.ErrUsernameTaken, "usernames are compared without case")
		})
		t.Run("SelfIsRefused", func(t *testing.T) {
			_, _, err := s.DisableAdmin(ctx, bob, "bob", "")
			require.ErrorIs(t, err, auth.ErrSelfDisable)
			_, err = s.AuthenticateSession(ctx, cookie)
			require.NoError(t, err, "nothing changed")
		})
		t.Run("UnknownIsNotFound", func(t *testing.T) {
			_, _, err := s.DisableAdmin(ctx, root, "nobody", "")
			require.ErrorIs(t, err, auth.ErrAdminNotFound)
		})

		u, ended, err := s.DisableAdmin(ctx, root, "bob", "10.0.0.1:5")
		require.NoError(t, err)
		require.NotNil(t, u.DisabledAt)
		require.EqualValues(t, 1, ended)

		t.Run("EveryCredentialIsRefused", func(t *testing.T) {
			_, err := s.AuthenticateSession(ctx, cookie)
			require.ErrorIs(t, err, auth.ErrUnauthenticated, "the session ended")
			_, err = s.AuthenticateToken(ctx, token)
			require.ErrorIs(t, err, auth.ErrUnauthenticated, "the cached token is forgotten")
			_, _, err = s.Login(ctx, "bob", "bobs-long-password", "127.0.0.2:1")
			require.ErrorIs(t, err, auth.ErrUnauthenticated, "the right password signs nobody in")
			var disabled int
			for _, e := range refusals(t, s) {
				if e.Outcome == "disabled" && e.Actor == "bob" {
					disabled++
				}
			}
			require.Equal(t, 1, disabled, "the refusal is audited as what it was")
		})
		t.Run("WhatTheyAskedOnTheWayDoesNotHappen", func(t *testing.T) {
			// bob was authenticated before he was disabled.
			_, err := s.AddAdmin(ctx, bob, "mallory", "a-long-enough-password", "")
			require.ErrorIs(t, err, auth.ErrUnauthenticated)
			_, err = s.EnableAdmin(ctx, bob, "bob", "")
			require.ErrorIs(t, err, auth.ErrUnauthenticated)
			_, _, err = s.SignOutAdmin(ctx, bob, adminName, "")
			require.ErrorIs(t, err, auth.ErrUnauthenticated)
			_, _, err = s.DisableAdmin(ctx, bob, adminName, "")
			require.ErrorIs(t, err, auth.ErrUnauthenticated)
			_, err = s.ChangePassword(ctx, bob, "bobs-long-password", "another-long-password", "127.0.0.5:1")
			require.ErrorIs(t, err, auth.ErrUnauthenticated)
			_, err = s.Admin(ctx, "mallory")
			require.ErrorIs(t, err, auth.ErrAdminNotFound)
		})
		t.Run("AgainChangesNothing", func(t *testing.T) {
			again, ended, err := s.DisableAdmin(ctx, root, "bob", "")
			require.NoError(t, err)
			require.Zero(t, ended)
			require.True(t, again.DisabledAt.Equal(*u.DisabledAt))
			require.Equal(t, []string{"admin.create", "admin.disable"}, actions(t, s, "bob"))
		})
		t.Run("EnableBringsTheTokenBack", func(t *testing.T) {
			u, err := s.EnableAdmin(ctx, root, "bob", "")
			require.NoError(t, err)
			require.Nil(t, u.DisabledAt)
			p, err := s.AuthenticateToken(ctx, token)
			require.NoError(t, err)
			require.Equal(t, "bob", p.Username)
			_, err = s.AuthenticateSession(ctx, cookie)
			require.ErrorIs(t, err, auth.ErrUnauthenticated, "an ended session stays ended")
			_, _, err = s.Login(ctx, "bob", "bobs-long-password", "127.0.0.3:1")
			require.NoError(t, err)
			_, err = s.EnableAdmin(ctx, root, "bob", "")
			require.NoError(t, err)
			require.Equal(t, []string{"admin.create", "admin.disable", "admin.enable"}, actions(t, s, "bob"))
		})
		t.Run("TheLastEnabledStays", func(t *testing.T) {
			_, _, err := s.DisableAdmin(ctx, root, "bob", "")
			require.NoError(t, err)
			_, _, err = s.DisableAdmin(ctx, auth.SystemActor, adminName, "")
			require.ErrorIs(t, err, auth.ErrLastAdministrator)
			require.Equal(t, errcode.LastAdministrator, errcode.Of(err))
			_, err = s.AuthenticateToken(ctx, token)
			require.ErrorIs(t, err, auth.ErrUnauthenticated)
		})
	})
}

// TestAdminDisableConcurrent: two administrators disabling each other at
// once cannot both succeed, which would leave nobody able to sign in.
func TestAdminDisableConcurrent(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := newService(t, db, auth.Options{})
		root := actor(t, s, adminName)
		for round := 0; round < 5; round++ {
			a, b := "a"+string(rune('0'+round)), "b"+string(rune('0'+round))
			for _, n := range []string{a, b} {
				_, err := s.AddAdmin(ctx, root, n, "a-long-enough-password", "")
				require.NoError(t, err)
			}
			// Only a and b are enabled now.
			_, _, err := s.DisableAdmin(ctx, actor(t, s, a), root.Username, "")
			require.NoError(t, err)
			pa, pb := actor(t, s, a), actor(t, s, b)

			var wg sync.WaitGroup
			errs := make([]error, 2)
			for i, pair := range [][2]any{{pa, b}, {pb, a}} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, _, errs[i] = s.DisableAdmin(ctx, pair[0].(auth.Principal), pair[1].(string), "")
				}()
			}
			wg.Wait()
			ok := 0
			for _, err := range errs {
				if err == nil {
					ok++
				} else {
					// The loser is either the last one left, or already
					// disabled by the winner when its turn came.
					require.True(t, errors.Is(err, auth.ErrLastAdministrator) || errors.Is(err, auth.ErrUnauthenticated),
						"round %d: %v", round, err)
				}
			}
			require.Equal(t, 1, ok, "round %d: exactly one wins", round)

			// Hand over to the next round: root back, a and b out of it.
			_, err = s.EnableAdmin(ctx, auth.SystemActor, root.Username, "")
			require.NoError(t, err)
			for _, n := range []string{a, b} {
				_, _, err := s.DisableAdmin(ctx, auth.SystemActor, n, "")
				require.NoError(t, err)
			}
		}
	})
}

func TestChangePassword(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		clk := &fakeClock{t: time.Now().UTC().Truncate(time.Second)}
		s := newService(t, db, auth.Options{Now: clk.Now})
		first, _, err := s.Login(ctx, adminName, adminPassword, "127.0.0.1:1")
		require.NoError(t, err)
		second, _, err := s.Login(ctx, adminName, adminPassword, "127.0.0.2:1")
		require.NoError(t, err)
		p, err := s.AuthenticateSession(ctx, first)
		require.NoError(t, err)
		_, err = s.AuthenticateSession(ctx, second) // cached from here
		require.NoError(t, err)
		const next = "a-brand-new-passphrase"

		t.Run("Refusals", func(t *testing.T) {
			for name, c := range map[string]struct{ current, next, field string }{
				"WrongCurrent": {"not-the-password", next, "current_password"},
				"TooShort":     {adminPassword, "short", "new_password"},
				"Unchanged":    {adminPassword, adminPassword, "new_password"},
				"NoCurrent":    {"", next, "current_password"},
			} {
				_, err := s.ChangePassword(ctx, p, c.current, c.next, "127.0.0.1:1")
				var ce *errcode.Error
				require.True(t, errors.As(err, &ce), name)
				require.Equal(t, errcode.ValidationFailed, ce.Code, name)
				require.Equal(t, c.field, ce.Fields[0].Field, name)
				if c.current != "" {
					require.NotContains(t, ce.Error(), c.current, "%s: no password in the message", name)
				}
			}
		})

		ended, err := s.ChangePassword(ctx, p, adminPassword, next, "127.0.0.1:1")
		require.NoError(t, err)
		require.EqualValues(t, 2, ended, "every session, the one that asked too")
		for _, c := range []string{first, second} {
			_, err = s.AuthenticateSession(ctx, c)
			require.ErrorIs(t, err, auth.ErrUnauthenticated)
		}
		fresh, _, err := s.SessionAfterPasswordChange(ctx, p, "127.0.0.1:1")
		require.NoError(t, err)
		_, err = s.AuthenticateSession(ctx, fresh)
		require.NoError(t, err, "the browser that changed it carries on, on a new cookie")
		_, _, err = s.Login(ctx, adminName, adminPassword, "127.0.0.3:1")
		require.ErrorIs(t, err, auth.ErrUnauthenticated, "the old password is gone")
		_, _, err = s.Login(ctx, adminName, next, "127.0.0.3:1")
		require.NoError(t, err)
		u, err := s.Admin(ctx, adminName)
		require.NoError(t, err)
		require.NotNil(t, u.PasswordChangedAt)

		t.Run("WrongGuessesAreLimited", func(t *testing.T) {
			var last error
			for i := 0; i < 6; i++ {
				_, last = s.ChangePassword(ctx, p, "guess-number-"+string(rune('a'+i)), "another-new-passphrase", "127.0.0.9:1")
			}
			require.ErrorIs(t, last, auth.ErrRateLimited)
			_, err := s.ChangePassword(ctx, p, next, "another-new-passphrase", "127.0.0.9:1")
			require.ErrorIs(t, err, auth.ErrRateLimited, "the right one too, until the window passes")
			clk.Add(16 * time.Minute)
			_, err = s.ChangePassword(ctx, p, next, "another-new-passphrase", "127.0.0.9:1")
			require.NoError(t, err)
		})
	})
}

func TestResetPassword(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := newService(t, db, auth.Options{})
		cookie, _, err := s.Login(ctx, adminName, adminPassword, "127.0.0.1:1")
		require.NoError(t, err)
		u, ended, err := s.ResetPassword(ctx, auth.SystemActor, adminName, "reset-by-the-operator", "cli")
		require.NoError(t, err)
		require.EqualValues(t, 1, ended)
		require.Equal(t, adminName, u.Username)
		require.NotNil(t, u.PasswordChangedAt)
		_, err = s.AuthenticateSession(ctx, cookie)
		require.ErrorIs(t, err, auth.ErrUnauthenticated)
		_, _, err = s.Login(ctx, adminName, "reset-by-the-operator", "127.0.0.1:1")
		require.NoError(t, err)
		_, _, err = s.ResetPassword(ctx, auth.SystemActor, "nobody", "reset-by-the-operator", "cli")
		require.ErrorIs(t, err, auth.ErrAdminNotFound)
		_, _, err = s.ResetPassword(ctx, auth.SystemActor, adminName, "short", "cli")
		require.Equal(t, errcode.ValidationFailed, errcode.Of(err))
		require.Equal(t, []string{"admin.create", "admin.password_reset"}, actions(t, s, adminName))
	})
}
