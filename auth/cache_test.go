package auth_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/keys"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// hookedStore lets a test act before a token read (its error is the
// read's) and between the read and its caching, and counts last-used
// stamps.
type hookedStore struct {
	auth.Store
	beforeRead atomic.Pointer[func(context.Context) error]
	afterRead  atomic.Pointer[func()]
	touches    atomic.Int64
}

func (h *hookedStore) TouchToken(ctx context.Context, id string, at time.Time) error {
	h.touches.Add(1)
	return h.Store.TouchToken(ctx, id, at)
}

func (h *hookedStore) TokenByHash(ctx2 context.Context, hash string) (auth.APIToken, auth.User, error) {
	if fn := h.beforeRead.Load(); fn != nil {
		if err := (*fn)(ctx2); err != nil {
			return auth.APIToken{}, auth.User{}, err
		}
	}
	t, u, err := h.Store.TokenByHash(ctx2, hash)
	if fn := h.afterRead.Load(); fn != nil {
		(*fn)()
	}
	return t, u, err
}

// replicaOf is another service over db (no administrator created).
func replicaOf(db *models.DB, o auth.Options) *auth.Service {
	if o.Store == nil {
		o.Store = models.NewAuthStore(db)
	}
	o.Keys = keys.NewRing(bytes.Repeat([]byte{7}, 32))
	return auth.New(o)
}

// cacheService is a service over db with its administrator (created by
// the first one).
func cacheService(t *testing.T, db *models.DB, o auth.Options) *auth.Service {
	t.Helper()
	s := replicaOf(db, o)
	if has, err := s.HasAdmin(ctx); err == nil && !has {
		_, err = s.CreateAdmin(ctx, adminName, adminPassword)
		require.NoError(t, err)
	}
	return s
}

func adminPrincipal(t *testing.T, s *auth.Service) auth.Principal {
	t.Helper()
	u, err := s.FirstAdmin(ctx)
	require.NoError(t, err)
	return auth.Principal{Kind: auth.KindAdmin, UserID: u.ID, Username: u.Username}
}

func newToken(t *testing.T, s *auth.Service, name string) (string, auth.APIToken) {
	t.Helper()
	tok, row, err := s.CreateToken(ctx, adminPrincipal(t, s), name, "test")
	require.NoError(t, err)
	return tok, row
}

// authOnce authenticates tok and answers whether it was a cache hit.
func authOnce(t *testing.T, s *auth.Service, tok string) (auth.Principal, error, bool) {
	t.Helper()
	before := s.CacheStats()
	p, err := s.AuthenticateBearer(ctx, tok)
	after := s.CacheStats()
	hit := after.Hits == before.Hits+1
	require.Equal(t, hit, after.StoreReads == before.StoreReads, "each authentication is a hit or a store read")
	return p, err, hit
}

func TestCredentialCache(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		t.Run("SessionLogout", func(t *testing.T) {
			s := cacheService(t, db, auth.Options{})
			cookie, _, err := s.Login(ctx, adminName, adminPassword, "127.0.0.1:1")
			require.NoError(t, err)
			before := s.CacheStats()
			p, err := s.AuthenticateSession(ctx, cookie)
			require.NoError(t, err)
			_, err = s.AuthenticateSession(ctx, cookie)
			require.NoError(t, err)
			require.Equal(t, before.StoreReads+1, s.CacheStats().StoreReads)
			require.Equal(t, before.Hits+1, s.CacheStats().Hits)
			require.NoError(t, s.Logout(ctx, p, "127.0.0.1:1"))
			_, err = s.AuthenticateSession(ctx, cookie)
			require.ErrorIs(t, err, auth.ErrUnauthenticated)
			require.Equal(t, before.StoreReads+2, s.CacheStats().StoreReads, "the logged-out session was served from the cache")
		})

		t.Run("SessionExpiresInTheCache", func(t *testing.T) {
			clk := &fakeClock{t: time.Now().UTC()}
			// A TTL beyond the session's life: the session's own expiry
			// still ends the entry.
			s := cacheService(t, db, auth.Options{Now: clk.Now, CacheTTL: 48 * time.Hour})
			cookie, exp, err := s.Login(ctx, adminName, adminPassword, "127.0.0.1:1")
			require.NoError(t, err)
			for i := 0; i < 2; i++ {
				_, err = s.AuthenticateSession(ctx, cookie)
				require.NoError(t, err)
			}
			clk.Add(exp.Sub(clk.Now()) + time.Second)
			_, err = s.AuthenticateSession(ctx, cookie)
			require.ErrorIs(t, err, auth.ErrUnauthenticated)
		})

		// A replica that misses the revocation's notification (here: no
		// notification at all, two services on one database) keeps the
		// token at most the TTL after it verified it.
		t.Run("MissedNotificationIsBoundedByTheTTL", func(t *testing.T) {
			clk := &fakeClock{t: time.Now().UTC()}
			a := cacheService(t, db, auth.Options{Now: clk.Now, CacheTTL: 5 * time.Second})
			b := replicaOf(db, auth.Options{Now: clk.Now, CacheTTL: 5 * time.Second})
			tok, row := newToken(t, a, "bounded")
			_, err, hit := authOnce(t, b, tok)
			require.NoError(t, err)
			require.False(t, hit)
			_, err = a.RevokeToken(ctx, adminPrincipal(t, a), row.ID, "test")
			require.NoError(t, err)
			_, err, hit = authOnce(t, a, tok)
			require.ErrorIs(t, err, auth.ErrUnauthenticated, "refused at once where it was revoked")
			require.False(t, hit)
			clk.Add(4 * time.Second)
			_, err, hit = authOnce(t, b, tok)
			require.NoError(t, err, "within the TTL the deaf replica still has it")
			require.True(t, hit)
			clk.Add(time.Second)
			_, err, hit = authOnce(t, b, tok)
			require.ErrorIs(t, err, auth.ErrUnauthenticated, "past the TTL it reads the revocation")
			require.False(t, hit)
			// What b hears (CredentialsChanged) drops it at once.
			tok2, row2 := newToken(t, a, "heard")
			_, err, _ = authOnce(t, b, tok2)
			require.NoError(t, err)
			_, err = a.RevokeToken(ctx, adminPrincipal(t, a), row2.ID, "test")
			require.NoError(t, err)
			b.CredentialsChanged(auth.TokenSubject(row2.ID), "notify")
			_, err, hit = authOnce(t, b, tok2)
			require.ErrorIs(t, err, auth.ErrUnauthenticated)
			require.False(t, hit)
		})

		// A read that began before a revocation was forgotten is answered
		// (it saw the row before) but not cached after it.
		t.Run("ReadRacingARevocationIsNotCached", func(t *testing.T) {
			s := cacheService(t, db, auth.Options{})
			hs := &hookedStore{Store: models.NewAuthStore(db)}
			r := replicaOf(db, auth.Options{Store: hs})
			tok, row := newToken(t, s, "racing")
			hook := func() {
				hs.afterRead.Store(nil)
				_, err := r.RevokeToken(ctx, adminPrincipal(t, s), row.ID, "test")
				require.NoError(t, err)
			}
			hs.afterRead.Store(&hook)
			_, err := r.AuthenticateBearer(ctx, tok)
			require.NoError(t, err, "the read saw the token before its revocation")
			_, err, hit := authOnce(t, r, tok)
			require.ErrorIs(t, err, auth.ErrUnauthenticated)
			require.False(t, hit, "a read from before the revocation was cached after it")
		})

		t.Run("Bounded", func(t *testing.T) {
			s := cacheService(t, db, auth.Options{CacheSize: 3})
			var toks []string
			for i := 0; i < 5; i++ {
				tok, _ := newToken(t, s, "bounded")
				toks = append(toks, tok)
				_, err := s.AuthenticateBearer(ctx, tok)
				require.NoError(t, err)
			}
			require.Equal(t, 3, s.CacheStats().Entries)
			for i, tok := range toks {
				_, err, hit := authOnce(t, s, tok)
				require.NoError(t, err, "an uncached token still works")
				require.Equal(t, i < 3, hit, "token %d", i)
			}
		})

		t.Run("ForgedTokensAreNeverCached", func(t *testing.T) {
			s := cacheService(t, db, auth.Options{CacheSize: 8})
			tok, _ := newToken(t, s, "kept")
			_, err := s.AuthenticateBearer(ctx, tok)
			require.NoError(t, err)
			for i := 0; i < 200; i++ {
				b := make([]byte, 32)
				_, _ = rand.Read(b)
				for _, prefix := range []string{"nwa_", "nwh_"} {
					forged := prefix + base64.RawURLEncoding.EncodeToString(b)
					_, err, hit := authOnce(t, s, forged)
					require.ErrorIs(t, err, auth.ErrUnauthenticated)
					require.NotContains(t, err.Error(), forged)
					require.False(t, hit)
				}
				// Without a known prefix it is refused before any lookup.
				_, err := s.AuthenticateBearer(ctx, base64.RawURLEncoding.EncodeToString(b))
				require.ErrorIs(t, err, auth.ErrUnauthenticated)
			}
			require.Equal(t, 1, s.CacheStats().Entries)
			_, err, hit := authOnce(t, s, tok)
			require.NoError(t, err)
			require.True(t, hit, "forged tokens evicted a valid one")
		})

		// The last-used stamp stays coalesced on cache hits: one write a
		// minute, claimed by one of many concurrent requests.
		t.Run("LastUsedCoalesced", func(t *testing.T) {
			clk := &fakeClock{t: time.Now().UTC()}
			hs := &hookedStore{Store: models.NewAuthStore(db)}
			s := replicaOf(db, auth.Options{Store: hs, Now: clk.Now, CacheTTL: time.Hour})
			admin := cacheService(t, db, auth.Options{})
			tok, row := newToken(t, admin, "stamp")
			_, err := s.AuthenticateBearer(ctx, tok)
			require.NoError(t, err)
			first := lastUsed(t, s, row.ID)
			require.NotNil(t, first)
			clk.Add(30 * time.Second)
			_, err = s.AuthenticateBearer(ctx, tok)
			require.NoError(t, err)
			require.Equal(t, *first, *lastUsed(t, s, row.ID), "stamped twice within a minute")
			clk.Add(31 * time.Second)
			var wg sync.WaitGroup
			for i := 0; i < 16; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := s.AuthenticateBearer(ctx, tok)
					require.NoError(t, err)
				}()
			}
			wg.Wait()
			require.True(t, lastUsed(t, s, row.ID).After(*first), "the stamp was not renewed past the minute")
			require.Equal(t, int64(2), hs.touches.Load(), "one stamp at the first use, one past the minute")
			require.Equal(t, int64(1), s.CacheStats().StoreReads, "the token was read once")
		})

		// Concurrent authentications and revocations (run with -race):
		// once RevokeToken returns, nobody is let in with the token.
		t.Run("ConcurrentRevocation", func(t *testing.T) {
			s := cacheService(t, db, auth.Options{CacheTTL: time.Hour})
			tok, row := newToken(t, s, "concurrent")
			var revoked atomic.Bool
			var wrong, after atomic.Int64
			var wg sync.WaitGroup
			stop := make(chan struct{})
			for i := 0; i < 4; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						was := revoked.Load()
						_, err := s.AuthenticateBearer(ctx, tok)
						if was {
							after.Add(1)
							if err == nil {
								wrong.Add(1)
							}
						}
					}
				}()
			}
			for s.CacheStats().Hits < 50 {
				time.Sleep(time.Millisecond)
			}
			_, err := s.RevokeToken(ctx, adminPrincipal(t, s), row.ID, "test")
			require.NoError(t, err)
			revoked.Store(true)
			for after.Load() < 200 {
				time.Sleep(time.Millisecond)
			}
			close(stop)
			wg.Wait()
			require.Zero(t, wrong.Load(), "a revoked token was let in after RevokeToken returned")
		})
	})
}

func lastUsed(t *testing.T, s *auth.Service, id string) *time.Time {
	t.Helper()
	rows, err := s.ListTokens(ctx, nil, 0)
	require.NoError(t, err)
	for _, r := range rows {
		if r.ID == id {
			return r.LastUsedAt
		}
	}
	t.Fatalf("token %s not listed", id)
	return nil
}
