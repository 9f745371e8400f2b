package models_test

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// The auth store conformance suite: every dialect keeps the same promises.

func withAuthStore(t *testing.T, fn func(t *testing.T, s *models.AuthStore)) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) { fn(t, models.NewAuthStore(db)) })
}

func sampleUser(id, name string) auth.User {
	return auth.User{ID: id, Username: name, PasswordHash: "$argon2id$hash-of-" + name, CreatedAt: t0}
}

func TestAuthStoreUsers(t *testing.T) {
	withAuthStore(t, func(t *testing.T, s *models.AuthStore) {
		n, err := s.CountUsers(ctx)
		require.NoError(t, err)
		require.Zero(t, n)
		_, err = s.FirstUser(ctx)
		require.ErrorIs(t, err, auth.ErrNoRows, "no users yet")

		u := sampleUser("u1", "alice")
		require.NoError(t, s.InsertUser(ctx, u))
		require.ErrorIs(t, s.InsertUser(ctx, sampleUser("u2", "alice")), auth.ErrDuplicate, "same username")
		require.ErrorIs(t, s.InsertUser(ctx, sampleUser("u1", "bob")), auth.ErrDuplicate, "same id")
		later := sampleUser("u0", "bob")
		later.CreatedAt = t0.Add(time.Second)
		require.NoError(t, s.InsertUser(ctx, later))

		got, err := s.UserByName(ctx, "alice")
		require.NoError(t, err)
		require.Equal(t, u.ID, got.ID)
		require.Equal(t, u.PasswordHash, got.PasswordHash)
		require.True(t, u.CreatedAt.Equal(got.CreatedAt))
		_, err = s.UserByName(ctx, "ALICE")
		require.ErrorIs(t, err, auth.ErrNoRows, "usernames match exactly")

		first, err := s.FirstUser(ctx)
		require.NoError(t, err)
		require.Equal(t, "alice", first.Username, "oldest first, whatever the id")
		alice, err := s.LockUser(ctx, "alice")
		require.NoError(t, err)
		off := t0
		alice.DisabledAt = &off
		require.NoError(t, s.UpdateUser(ctx, alice))
		first, err = s.FirstUser(ctx)
		require.NoError(t, err)
		require.Equal(t, "bob", first.Username, "the oldest enabled")
		alice.DisabledAt = nil
		require.NoError(t, s.UpdateUser(ctx, alice))
		n, err = s.CountUsers(ctx)
		require.NoError(t, err)
		require.Equal(t, int64(2), n)
	})
}

func TestAuthStoreManagedUsers(t *testing.T) {
	withAuthStore(t, func(t *testing.T, s *models.AuthStore) {
		for i, name := range []string{"alice", "bob", "carol"} {
			u := sampleUser("u"+name, name)
			u.CreatedAt = t0.Add(time.Duration(i) * time.Second)
			require.NoError(t, s.InsertUser(ctx, u))
		}
		now := t0.Add(time.Hour)
		for _, cs := range []auth.ConsoleSession{
			{ID: "s1", UserID: "ubob", CreatedAt: t0, ExpiresAt: now.Add(time.Hour)},
			{ID: "s2", UserID: "ubob", CreatedAt: t0, ExpiresAt: now.Add(time.Hour)},
			{ID: "s3", UserID: "ubob", CreatedAt: t0, ExpiresAt: now.Add(-time.Second)}, // expired
			{ID: "s4", UserID: "ualice", CreatedAt: t0, ExpiresAt: now.Add(time.Hour)},
		} {
			require.NoError(t, s.InsertSession(ctx, cs))
		}

		page, err := s.Users(ctx, nil, 2, now)
		require.NoError(t, err)
		require.Equal(t, []string{"carol", "bob"}, []string{page[0].Username, page[1].Username}, "newest first")
		require.Equal(t, []int64{0, 2}, []int64{page[0].LiveSessions, page[1].LiveSessions}, "open sessions only")
		require.Empty(t, page[1].PasswordHash, "a listing carries no hash")
		rest, err := s.Users(ctx, &auth.PageKey{CreatedAt: page[1].CreatedAt, ID: page[1].ID}, 2, now)
		require.NoError(t, err)
		require.Len(t, rest, 1)
		require.Equal(t, "alice", rest[0].Username)

		bob, err := s.LockUser(ctx, "bob")
		require.NoError(t, err)
		disabled, changed := now, now.Add(time.Second)
		bob.DisabledAt, bob.PasswordChangedAt, bob.PasswordHash = &disabled, &changed, "$argon2id$new"
		require.NoError(t, s.UpdateUser(ctx, bob))
		got, err := s.UserByName(ctx, "bob")
		require.NoError(t, err)
		require.True(t, disabled.Equal(*got.DisabledAt))
		require.True(t, changed.Equal(*got.PasswordChangedAt))
		require.Equal(t, "$argon2id$new", got.PasswordHash)
		_, _, err = s.Session(ctx, "s1", "ubob")
		require.NoError(t, err)
		enabled, err := s.EnabledUsers(ctx)
		require.NoError(t, err)
		require.Equal(t, []string{"ualice", "ucarol"}, []string{enabled[0].ID, enabled[1].ID})
		_, err = s.LockUser(ctx, "nobody")
		require.ErrorIs(t, err, auth.ErrNoRows)

		n, err := s.RevokeUserSessions(ctx, "ubob", "s2", now)
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "open sessions but the one kept; the expired one is left alone")
		cs, u, err := s.Session(ctx, "s1", "ubob")
		require.NoError(t, err)
		require.NotNil(t, cs.RevokedAt)
		require.NotNil(t, u.DisabledAt, "a session answers its user's state")
		cs, _, err = s.Session(ctx, "s2", "ubob")
		require.NoError(t, err)
		require.Nil(t, cs.RevokedAt)
		n, err = s.RevokeUserSessions(ctx, "ubob", "", now)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		cs, _, err = s.Session(ctx, "s4", "ualice")
		require.NoError(t, err)
		require.Nil(t, cs.RevokedAt, "another administrator's sessions are untouched")
	})
}

func TestAuthStoreSessions(t *testing.T) {
	withAuthStore(t, func(t *testing.T, s *models.AuthStore) {
		require.NoError(t, s.InsertUser(ctx, sampleUser("u1", "alice")))
		cs := auth.ConsoleSession{ID: "s1", UserID: "u1", CreatedAt: t0, ExpiresAt: t0.Add(time.Hour), RemoteAddr: "192.0.2.1:5"}
		require.NoError(t, s.InsertSession(ctx, cs))
		require.ErrorIs(t, s.InsertSession(ctx, cs), auth.ErrDuplicate)

		got, u, err := s.Session(ctx, "s1", "u1")
		require.NoError(t, err)
		require.Equal(t, "alice", u.Username)
		require.Equal(t, "u1", u.ID)
		require.True(t, t0.Equal(u.CreatedAt))
		require.Equal(t, cs.RemoteAddr, got.RemoteAddr)
		require.True(t, cs.ExpiresAt.Equal(got.ExpiresAt))
		require.Nil(t, got.RevokedAt)

		_, _, err = s.Session(ctx, "s1", "someone-else")
		require.ErrorIs(t, err, auth.ErrNoRows, "a session of another user")
		_, _, err = s.Session(ctx, "missing", "u1")
		require.ErrorIs(t, err, auth.ErrNoRows)

		at := t0.Add(time.Minute)
		require.NoError(t, s.RevokeSession(ctx, "s1", at))
		require.NoError(t, s.RevokeSession(ctx, "s1", at.Add(time.Minute)), "revoking twice is harmless")
		require.NoError(t, s.RevokeSession(ctx, "missing", at), "revoking nothing is harmless")
		got, _, err = s.Session(ctx, "s1", "u1")
		require.NoError(t, err, "a revoked session is still answered")
		require.NotNil(t, got.RevokedAt)
		require.True(t, at.Equal(*got.RevokedAt), "the first revocation stands")
	})
}

func TestAuthStoreTokens(t *testing.T) {
	withAuthStore(t, func(t *testing.T, s *models.AuthStore) {
		require.NoError(t, s.InsertUser(ctx, sampleUser("u1", "alice")))
		older := auth.APIToken{ID: "t1", Name: "ci", UserID: "u1", TokenHash: "h1", CreatedAt: t0}
		newer := auth.APIToken{ID: "t2", Name: "backup", UserID: "u1", TokenHash: "h2", CreatedAt: t0.Add(time.Second)}
		require.NoError(t, s.InsertToken(ctx, older))
		require.NoError(t, s.InsertToken(ctx, newer))
		require.ErrorIs(t, s.InsertToken(ctx, auth.APIToken{ID: "t3", Name: "x", UserID: "u1", TokenHash: "h1", CreatedAt: t0}),
			auth.ErrDuplicate, "same digest")

		list, err := s.Tokens(ctx, nil, 0)
		require.NoError(t, err)
		require.Len(t, list, 2)
		require.Equal(t, []string{"t2", "t1"}, []string{list[0].ID, list[1].ID}, "newest first")
		// Pages resume after the last key, ties at one time told by id.
		require.NoError(t, s.InsertToken(ctx, auth.APIToken{ID: "t0", Name: "twin", UserID: "u1", TokenHash: "h0", CreatedAt: t0}))
		page, err := s.Tokens(ctx, nil, 2)
		require.NoError(t, err)
		require.Equal(t, []string{"t2", "t1"}, []string{page[0].ID, page[1].ID})
		rest, err := s.Tokens(ctx, &auth.PageKey{CreatedAt: page[1].CreatedAt, ID: page[1].ID}, 2)
		require.NoError(t, err)
		require.Len(t, rest, 1)
		require.Equal(t, "t0", rest[0].ID)

		// A form's request id finds its token; one id mints once per user.
		require.NoError(t, s.InsertToken(ctx, auth.APIToken{ID: "tr", Name: "form", UserID: "u1", TokenHash: "hr", CreatedAt: t0, RequestID: "console:r1"}))
		require.ErrorIs(t, s.InsertToken(ctx, auth.APIToken{ID: "tr2", Name: "form", UserID: "u1", TokenHash: "hr2", CreatedAt: t0, RequestID: "console:r1"}),
			auth.ErrDuplicate, "same user, same request id")
		byReq, err := s.TokenByRequest(ctx, "u1", "console:r1")
		require.NoError(t, err)
		require.Equal(t, "tr", byReq.ID)
		require.Equal(t, "console:r1", byReq.RequestID)
		_, err = s.TokenByRequest(ctx, "u2", "console:r1")
		require.ErrorIs(t, err, auth.ErrNoRows, "request ids are per user")

		tok, u, err := s.TokenByHash(ctx, "h1")
		require.NoError(t, err)
		require.Equal(t, "t1", tok.ID)
		require.Equal(t, "ci", tok.Name)
		require.Equal(t, "alice", u.Username)
		require.Nil(t, tok.LastUsedAt)
		_, _, err = s.TokenByHash(ctx, "nope")
		require.ErrorIs(t, err, auth.ErrNoRows)

		used := t0.Add(time.Minute)
		require.NoError(t, s.TouchToken(ctx, "t1", used))
		require.NoError(t, s.TouchToken(ctx, "missing", used), "touching nothing is harmless")
		tok, err = s.Token(ctx, "t1")
		require.NoError(t, err)
		require.True(t, used.Equal(*tok.LastUsedAt))

		_, err = s.Token(ctx, "missing")
		require.ErrorIs(t, err, auth.ErrNoRows)

		// Revocation inside a transaction: the locked read sees the row.
		revoked := t0.Add(2 * time.Minute)
		require.NoError(t, s.Tx(ctx, func(tx auth.Store) error {
			tok, err := tx.Token(ctx, "t1")
			if err != nil {
				return err
			}
			require.Nil(t, tok.RevokedAt)
			return tx.RevokeToken(ctx, "t1", revoked)
		}))
		require.NoError(t, s.RevokeToken(ctx, "t1", revoked.Add(time.Minute)), "revoking twice is harmless")
		tok, err = s.Token(ctx, "t1")
		require.NoError(t, err)
		require.True(t, revoked.Equal(*tok.RevokedAt), "the first revocation stands")

		// A failed transaction leaves nothing behind.
		boom := errors.New("boom")
		err = s.Tx(ctx, func(tx auth.Store) error {
			require.NoError(t, tx.InsertToken(ctx, auth.APIToken{ID: "t9", Name: "gone", UserID: "u1", TokenHash: "h9", CreatedAt: t0}))
			return boom
		})
		require.ErrorIs(t, err, boom)
		_, err = s.Token(ctx, "t9")
		require.ErrorIs(t, err, auth.ErrNoRows, "rolled back")
	})
}

func TestAuthStoreAudit(t *testing.T) {
	withAuthStore(t, func(t *testing.T, s *models.AuthStore) {
		for i := range 3 {
			require.NoError(t, s.AppendAudit(ctx, auth.AuditEntry{At: t0.Add(time.Duration(i) * time.Second), Actor: "alice",
				Action: "token.create", Target: "t", Outcome: "ok", RemoteAddr: "192.0.2.1:7", Detail: "name=x"}))
		}
		page, err := s.Audit(ctx, 0, 2)
		require.NoError(t, err)
		require.Len(t, page, 2)
		require.Greater(t, page[0].ID, page[1].ID, "newest first")
		require.Equal(t, int64(1), page[0].Count, "a plain entry counts one")
		require.Nil(t, page[0].LastAt)
		require.Equal(t, "name=x", page[0].Detail)
		rest, err := s.Audit(ctx, page[1].ID, 10)
		require.NoError(t, err)
		require.Len(t, rest, 1, "keyset paging")
		require.Less(t, rest[0].ID, page[1].ID)
	})
}

func TestAuthStoreCoalesceAudit(t *testing.T) {
	withAuthStore(t, func(t *testing.T, s *models.AuthStore) {
		refusal := func(at time.Time, host, outcome, name string) auth.AuditEntry {
			return auth.AuditEntry{At: at, Actor: name, Action: "login", Outcome: outcome, RemoteAddr: host,
				Detail: "last_username=" + name, Count: 1}
		}
		window := t0.Add(-time.Minute)
		for i := range 5 {
			at := t0.Add(time.Duration(i) * time.Second)
			name := "u" + string(rune('a'+i))
			require.NoError(t, s.CoalesceAudit(ctx, refusal(at, "192.0.2.1", "failed", name), window,
				func(d string) string { return d + "," + name }))
		}
		// Another client, and another outcome of the same client, have
		// entries of their own.
		require.NoError(t, s.CoalesceAudit(ctx, refusal(t0, "192.0.2.2", "failed", "x"), window, keep))
		require.NoError(t, s.CoalesceAudit(ctx, refusal(t0, "192.0.2.1", "rate_limited", "x"), window, keep))

		rows, err := s.Audit(ctx, 0, 100)
		require.NoError(t, err)
		require.Len(t, rows, 3)
		first := rows[2]
		require.Equal(t, "192.0.2.1", first.RemoteAddr)
		require.Equal(t, int64(5), first.Count)
		require.Equal(t, "ua", first.Actor, "the first refusal names the entry")
		require.Equal(t, "last_username=ua,ub,uc,ud,ue", first.Detail, "the detail is merged from the entry's own")
		require.True(t, t0.Equal(first.At))
		require.NotNil(t, first.LastAt)
		require.True(t, t0.Add(4*time.Second).Equal(*first.LastAt))
		require.Equal(t, int64(1), rows[0].Count)
		require.Equal(t, int64(1), rows[1].Count)

		// Past the window, a refusal starts a new entry.
		later := t0.Add(time.Hour)
		require.NoError(t, s.CoalesceAudit(ctx, refusal(t0.Add(time.Hour), "192.0.2.1", "failed", "z"), later, keep))
		rows, err = s.Audit(ctx, 0, 100)
		require.NoError(t, err)
		require.Len(t, rows, 4)
		require.Equal(t, int64(1), rows[0].Count)
	})
}

// TestAuthStoreCoalesceAuditConcurrent: refusals of one client racing each
// other are all counted, in the one existing entry.
func TestAuthStoreCoalesceAuditConcurrent(t *testing.T) {
	withAuthStore(t, func(t *testing.T, s *models.AuthStore) {
		e := auth.AuditEntry{At: t0, Actor: "x", Action: "login", Outcome: "failed", RemoteAddr: "192.0.2.1", Count: 1}
		require.NoError(t, s.CoalesceAudit(ctx, e, t0, keep))
		const n = 20
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for range n {
			wg.Go(func() {
				errs <- s.Tx(ctx, func(tx auth.Store) error {
					return tx.CoalesceAudit(ctx, e, t0, func(d string) string { return d + "+" })
				})
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		rows, err := s.Audit(ctx, 0, 100)
		require.NoError(t, err)
		require.Len(t, rows, 1)
		require.Equal(t, int64(n+1), rows[0].Count)
		require.Equal(t, strings.Repeat("+", n), rows[0].Detail, "no merge lost to a race")
	})
}

func keep(d string) string { return d }
