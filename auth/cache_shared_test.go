package auth_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/internal/testwait"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// gate holds the first token read it is asked for (once armed) until
// released or its caller's context ends (hookedStore.beforeRead).
type gate struct {
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (g *gate) hold(ctx context.Context) error {
	if g.armed.CompareAndSwap(true, false) {
		close(g.entered)
		select {
		case <-g.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// TestCredentialReadsShared: when a busy script's cached token expires,
// its concurrent requests share one store read and one last-used stamp,
// never the answer of a read from before a revocation.
func TestCredentialReadsShared(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		// setup answers a service with the default TTL over a gated store,
		// a token it verified once, and the clock moved past both the
		// cache's TTL and the last-used stamp's minute.
		setup := func(t *testing.T, name string) (*auth.Service, *gate, *hookedStore, string, auth.APIToken, auth.CacheStats) {
			clk := &fakeClock{t: time.Now().UTC()}
			g := &gate{entered: make(chan struct{}), release: make(chan struct{})}
			hs := &hookedStore{Store: models.NewAuthStore(db)}
			hold := g.hold
			hs.beforeRead.Store(&hold)
			s := replicaOf(db, auth.Options{Store: hs, Now: clk.Now})
			tok, row := newToken(t, cacheService(t, db, auth.Options{}), name)
			_, err := s.AuthenticateBearer(ctx, tok)
			require.NoError(t, err)
			clk.Add(auth.DefaultCacheTTL + time.Minute)
			g.armed.Store(true)
			return s, g, hs, tok, row, s.CacheStats()
		}
		authenticateAll := func(s *auth.Service, tok string, n int) (*sync.WaitGroup, []error) {
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, errs[i] = s.AuthenticateBearer(ctx, tok)
				}()
			}
			return &wg, errs
		}

		t.Run("ConcurrentMissesReadOnce", func(t *testing.T) {
			s, g, hs, tok, _, before := setup(t, "busy")
			const n = 32
			wg, errs := authenticateAll(s, tok, n)
			<-g.entered
			testwait.For(t, "every other request to join the read", time.Minute, func() bool { return auth.SharedWaiters(s, tok) == n-1 })
			close(g.release)
			wg.Wait()
			for _, err := range errs {
				require.NoError(t, err)
			}
			after := s.CacheStats()
			require.Equal(t, before.StoreReads+1, after.StoreReads, "one store read for the concurrent misses")
			require.Equal(t, before.Shared+n-1, after.Shared)
			require.Equal(t, int64(2), hs.touches.Load(), "one stamp at the first use, one for the burst past the minute")
			_, err, hit := authOnce(t, s, tok)
			require.NoError(t, err)
			require.True(t, hit, "the shared read was not cached")
		})

		t.Run("RevocationStartsAFreshRead", func(t *testing.T) {
			s, g, _, tok, row, before := setup(t, "revoked")
			early, _ := authenticateAll(s, tok, 1)
			<-g.entered
			_, err := s.RevokeToken(ctx, adminPrincipal(t, s), row.ID, "test")
			require.NoError(t, err)
			// Bounded: joining the held read from before the revocation
			// would wait for it until the deadline.
			later, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			_, err = s.AuthenticateBearer(later, tok)
			require.ErrorIs(t, err, auth.ErrUnauthenticated, "a request after the revocation joined the read from before it")
			close(g.release)
			early.Wait()
			_, err = s.AuthenticateBearer(ctx, tok)
			require.ErrorIs(t, err, auth.ErrUnauthenticated, "the read from before the revocation was cached")
			require.Equal(t, before.Shared, s.CacheStats().Shared)
		})

		t.Run("FirstCallerGoneOthersReadAgain", func(t *testing.T) {
			s, g, _, tok, _, before := setup(t, "hangup")
			first, cancel := context.WithCancel(ctx)
			var firstErr error
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, firstErr = s.AuthenticateBearer(first, tok)
			}()
			<-g.entered
			const n = 8
			wg, errs := authenticateAll(s, tok, n)
			testwait.For(t, "the others to join the read", time.Minute, func() bool { return auth.SharedWaiters(s, tok) == n })
			cancel()
			<-done
			wg.Wait()
			require.ErrorIs(t, firstErr, context.Canceled)
			for _, err := range errs {
				require.NoError(t, err, "a request took the answer of another's ended context")
			}
			after := s.CacheStats()
			require.Equal(t, before.StoreReads+2, after.StoreReads, "the abandoned read and one more")
			require.Equal(t, int64(n-1), after.Shared-before.Shared+after.Hits-before.Hits,
				"the rest took that read: sharing it, or from the cache it filled")
		})
	})
}
