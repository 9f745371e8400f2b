package auth_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/handlers"
	"github.com/nodeward/nodeward/keys"
	"github.com/nodeward/nodeward/metrics"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

const (
	adminName     = "admin"
	adminPassword = "correct-horse-battery-staple"
)

var ctx = context.Background()

func newService(t *testing.T, db *models.DB, o auth.Options) *auth.Service {
	t.Helper()
	o.Store = models.NewAuthStore(db)
	o.Keys = keys.NewRing(bytes.Repeat([]byte{7}, 32))
	s := auth.New(o)
	_, err := s.CreateAdmin(ctx, adminName, adminPassword)
	require.NoError(t, err)
	return s
}

// refusals answers the audit's refused-login entries.
func refusals(t *testing.T, s *auth.Service) []auth.AuditEntry {
	t.Helper()
	rows, err := s.AuditPage(ctx, 0, 500)
	require.NoError(t, err)
	var out []auth.AuditEntry
	for _, e := range rows {
		if e.Action == "login" && e.Outcome != "ok" {
			out = append(out, e)
		}
	}
	return out
}

func TestLoginRefusals(t *testing.T) {
	t.Run("OneClientIsOneAuditEntry", func(t *testing.T) {
		dbtest.Each(t, func(t *testing.T, db *models.DB) {
			s := newService(t, db, auth.Options{})
			// Distinct usernames, so the rate limiter (per username and
			// client) stays out of the way: every attempt hashes and fails.
			const n = 12
			for i := range n {
				_, _, err := s.Login(ctx, fmt.Sprintf("guess%02d", i), "wrong password", fmt.Sprintf("198.51.100.7:%d", 40000+i))
				require.ErrorIs(t, err, auth.ErrUnauthenticated)
			}
			rows := refusals(t, s)
			require.Len(t, rows, 1, "one entry for one client, whatever its ports and usernames")
			require.Equal(t, int64(n), rows[0].Count)
			require.Equal(t, "guess00", rows[0].Actor)
			require.Equal(t, `last_username="guess11" tried="guess00","guess01","guess02","guess03","guess04","guess05","guess06","guess07",…`,
				rows[0].Detail, "the latest, and the first eight distinct")
			require.Equal(t, "198.51.100.7", rows[0].RemoteAddr)

			_, _, err := s.Login(ctx, "guess", "wrong password", "198.51.100.8:1")
			require.ErrorIs(t, err, auth.ErrUnauthenticated)
			require.Len(t, refusals(t, s), 2, "another client has its own entry")
		})
	})

	t.Run("HostileUsernamesAreStoredBoundedAndEscaped", func(t *testing.T) {
		dbtest.Each(t, func(t *testing.T, db *models.DB) {
			s := newService(t, db, auth.Options{})
			var hashes atomic.Int64
			auth.HoldHashes(s, func() { hashes.Add(1) })
			for i, name := range []string{
				strings.Repeat("A", 1<<20),
				"evil\n2026-01-01 login admin ok\x1b[0m",
			} {
				_, _, err := s.Login(ctx, name, "wrong password", fmt.Sprintf("203.0.113.%d:1", i+1))
				require.ErrorIs(t, err, auth.ErrUnauthenticated, "the ordinary failure")
			}
			require.Equal(t, int64(1), hashes.Load(), "an over-long username is refused before any hashing")
			require.Equal(t, 2, auth.LimiterSize(s))

			rows := refusals(t, s)
			require.Len(t, rows, 2)
			long, ctl := rows[1], rows[0]
			require.Equal(t, strings.Repeat("A", 64)+"…", long.Actor)
			require.Less(t, len(long.Detail), 200, "the name cut, in last_username and tried")
			require.Equal(t, `evil\x0a2026-01-01 login admin ok\x1b[0m`, ctl.Actor)
			require.NotContains(t, ctl.Detail, "\n")
		})
	})

	t.Run("ParallelGuessesAreLimitedToo", func(t *testing.T) {
		dbtest.Each(t, func(t *testing.T, db *models.DB) {
			// The limiter is under test, not shedding: on a busy machine a
			// guess queued past the default 2 s for a hashing slot would be
			// shed (503, not counted as a guess), and fewer than five judged.
			s := newService(t, db, auth.Options{HashQueueTimeout: 5 * time.Minute})
			var judged, limited atomic.Int64
			var wg sync.WaitGroup
			for i := range 40 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, _, err := s.Login(ctx, adminName, fmt.Sprintf("guess-%d", i), "192.0.2.77:1")
					switch {
					case errors.Is(err, auth.ErrUnauthenticated):
						judged.Add(1)
					case errors.Is(err, auth.ErrRateLimited):
						limited.Add(1)
					default:
						t.Errorf("guess %d: %v", i, err)
					}
				}()
			}
			wg.Wait()
			require.Equal(t, int64(5), judged.Load(), "at most five guesses judged in the window, however they arrive")
			require.Equal(t, int64(35), limited.Load())
			_, _, err := s.Login(ctx, adminName, adminPassword, "192.0.2.77:1")
			require.ErrorIs(t, err, auth.ErrRateLimited, "the right password is no way past the limit")
		})
	})

	t.Run("OverLongPasswordIsTheOrdinaryFailure", func(t *testing.T) {
		dbtest.Each(t, func(t *testing.T, db *models.DB) {
			s := newService(t, db, auth.Options{})
			_, _, err := s.Login(ctx, adminName, adminPassword+strings.Repeat("x", auth.MaxPasswordLen), "192.0.2.50:1")
			require.ErrorIs(t, err, auth.ErrUnauthenticated)
			_, _, err = s.Login(ctx, adminName, adminPassword, "192.0.2.50:1")
			require.NoError(t, err, "the real password still works")
		})
	})
}

func TestHashSlots(t *testing.T) {
	t.Run("ConcurrentLoginsNeverExceedTheSlots", func(t *testing.T) {
		db := dbtest.Open(t, models.SQLite)
		const slots, logins = 2, 8
		s := newService(t, db, auth.Options{HashSlots: slots, HashQueueTimeout: time.Minute})
		entered := make(chan struct{}, logins)
		release := make(chan struct{})
		auth.HoldHashes(s, func() {
			entered <- struct{}{}
			<-release
		})
		var wg sync.WaitGroup
		errs := make(chan error, logins)
		for i := range logins {
			wg.Go(func() {
				_, _, err := s.Login(ctx, fmt.Sprint("user", i), "wrong password", fmt.Sprintf("192.0.2.%d:1", i+1))
				errs <- err
			})
		}
		// Both slots fill; the rest queue behind them.
		for range slots {
			select {
			case <-entered:
			case <-time.After(time.Minute):
				t.Fatal("no login reached a hashing slot")
			}
		}
		close(release)
		wg.Wait()
		close(errs)
		for err := range errs {
			require.ErrorIs(t, err, auth.ErrUnauthenticated, "queued logins are served, not shed")
		}
		require.Equal(t, int64(slots), auth.HashPeak(s), "never more hashes at once than slots")
	})

	t.Run("OverflowIs503OverloadedWithRetryAfter", func(t *testing.T) {
		db := dbtest.Open(t, models.SQLite)
		s := newService(t, db, auth.Options{HashSlots: 1, HashQueueTimeout: 20 * time.Millisecond})
		entered := make(chan struct{})
		release := make(chan struct{})
		var holding atomic.Bool
		auth.HoldHashes(s, func() {
			if holding.CompareAndSwap(false, true) {
				close(entered)
				<-release
			}
		})
		h := handlers.New(handlers.Deps{Ready: db, Auth: s, Metrics: metrics.New(nil)})
		srv := httptest.NewServer(h)
		defer srv.Close()

		held := make(chan error, 1)
		go func() {
			_, _, err := s.Login(ctx, adminName, adminPassword, "192.0.2.1:1")
			held <- err
		}()
		<-entered

		res, err := http.PostForm(srv.URL+"/console/login", url.Values{"username": {adminName}, "password": {adminPassword}})
		require.NoError(t, err)
		defer res.Body.Close()
		require.Equal(t, http.StatusServiceUnavailable, res.StatusCode)
		require.NotEmpty(t, res.Header.Get("Retry-After"))
		var body bytes.Buffer
		_, _ = body.ReadFrom(res.Body)
		require.Contains(t, body.String(), "busy")
		require.Empty(t, refusals(t, s), "a shed login is no refusal: not audited")
		require.Zero(t, auth.LimiterSize(s), "nor counted against the username")

		_, _, err = s.Login(ctx, adminName, adminPassword, "192.0.2.2:1")
		require.ErrorIs(t, err, auth.ErrOverloaded)

		close(release)
		require.NoError(t, <-held, "the login holding the slot completes")
	})
}
