package handlers_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
	"github.com/nodeward/nodeward/server/controlplane"
)

// The credential cache (auth/cache.go) through the real server. Its TTL is
// an hour here, so nothing below is explained by an entry expiring: a
// refusal after a revocation comes from the invalidation itself.
var longCacheTTL = apitest.WithConfig(func(c *controlplane.Config) { c.CredentialCacheTTL = time.Hour })

func cacheStats(s *apitest.Server) auth.CacheStats { return s.App.Auth.CacheStats() }

// waitCacheOn waits until the replica's cache is on: on Postgres only
// once its listener hears the other replicas.
func waitCacheOn(t *testing.T, s *apitest.Server) {
	t.Helper()
	require.Eventually(t, func() bool { return cacheStats(s).Enabled }, 30*time.Second, 5*time.Millisecond,
		"the credential cache never turned on")
}

func capabilitiesStatus(t *testing.T, s *apitest.Server, token string) int {
	t.Helper()
	status, _, raw := s.Do(t, http.MethodGet, "/api/v1/capabilities", nil, token)
	if status != http.StatusOK {
		require.NotContains(t, string(raw), token, "an authentication failure names the credential")
	}
	return status
}

// requireHit: the request is answered and from the cache (no store read).
func requireHit(t *testing.T, s *apitest.Server, token string) {
	t.Helper()
	before := cacheStats(s)
	require.Equal(t, http.StatusOK, capabilitiesStatus(t, s, token))
	after := cacheStats(s)
	require.Equal(t, before.StoreReads, after.StoreReads, "a cached credential read the store")
	require.Equal(t, before.Hits+1, after.Hits)
}

// requireCached: the first of two requests (ask answers its status and
// whether it was a cache hit) verifies the credential on s and caches it,
// the second is answered from the cache. A replica alone until its peer
// watch sees another tells every replica to resync then, at a moment of
// its own (models.FleetStore.OthersListening); a resync heard between the
// two requests empties the cache, and the pair is asked again.
func requireCached(t *testing.T, s *apitest.Server, ask func() (int, bool)) {
	t.Helper()
	for try := 1; ; try++ {
		resyncs := cacheStats(s).Invalidations["resync"]
		status, _ := ask()
		require.Equal(t, http.StatusOK, status)
		status, hit := ask()
		require.Equal(t, http.StatusOK, status)
		if !hit && try < 3 && cacheStats(s).Invalidations["resync"] != resyncs {
			continue
		}
		require.True(t, hit, "a cached credential read the store")
		return
	}
}

// bearerAsk is requireCached's ask for a Bearer credential.
func bearerAsk(t *testing.T, s *apitest.Server, token string) func() (int, bool) {
	return func() (int, bool) {
		before := cacheStats(s)
		status := capabilitiesStatus(t, s, token)
		after := cacheStats(s)
		return status, after.StoreReads == before.StoreReads && after.Hits == before.Hits+1
	}
}

// requireRefusedFromStore: the request is refused, and the refusal came
// from a store read (the revoked credential was no longer cached).
func requireRefusedFromStore(t *testing.T, s *apitest.Server, token string) {
	t.Helper()
	before := cacheStats(s)
	require.Equal(t, http.StatusUnauthorized, capabilitiesStatus(t, s, token))
	require.Equal(t, before.StoreReads+1, cacheStats(s).StoreReads)
	require.Equal(t, before.Hits, cacheStats(s).Hits)
}

func randomBearer(prefix string) string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return prefix + base64.RawURLEncoding.EncodeToString(b)
}

func TestCredentialCacheHTTP(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		waitCacheOn(t, s)

		// An API token: one store read, then hits; revoked, it is refused
		// by the very next request.
		tok := createToken(t, s, "cache")
		reads := cacheStats(s).StoreReads
		require.Equal(t, http.StatusOK, capabilitiesStatus(t, s, tok.Token))
		require.Equal(t, reads+1, cacheStats(s).StoreReads)
		for i := 0; i < 5; i++ {
			requireHit(t, s, tok.Token)
		}
		// Its last-used stamp was written by the first request, not lost
		// to the cache.
		var listed struct {
			Tokens []tokenJSON `json:"tokens"`
		}
		s.Admin(t, http.MethodGet, "/api/v1/tokens", nil, http.StatusOK, &listed)
		for _, row := range listed.Tokens {
			if row.ID == tok.ID {
				require.NotNil(t, row.LastUsedAt, "last_used_at")
			}
		}
		local := cacheStats(s).Invalidations["local"]
		s.Admin(t, http.MethodPost, "/api/v1/tokens/"+tok.ID+"/revoke", nil, http.StatusOK, nil)
		require.Greater(t, cacheStats(s).Invalidations["local"], local)
		requireRefusedFromStore(t, s, tok.Token)
		requireRefusedFromStore(t, s, tok.Token) // and never cached as refused or valid

		// A package host: revoking it (a ledger operation) stops its
		// cached token at once; so does issuing a new one (a generation
		// bump), for the previous token.
		h := createHost(t, s, apitest.RandomID("cache-host-"), "nodes")
		require.Equal(t, http.StatusOK, capabilitiesStatus(t, s, h.Token))
		requireHit(t, s, h.Token)
		var issued packageHostJSON
		s.Admin(t, http.MethodPost, "/api/v1/package-hosts/"+h.PackageHostID+"/tokens", nil, http.StatusCreated, &issued)
		requireRefusedFromStore(t, s, h.Token)
		require.Equal(t, http.StatusOK, capabilitiesStatus(t, s, issued.Token))
		requireHit(t, s, issued.Token)
		s.Admin(t, http.MethodPost, "/api/v1/package-hosts/"+h.PackageHostID+"/revoke", nil, http.StatusOK, nil)
		requireRefusedFromStore(t, s, issued.Token)

		// A flood of forged tokens: every one refused by a store read,
		// none cached, nobody evicted.
		requireHit(t, s, s.AdminToken)
		before := cacheStats(s)
		const flood = 300
		for i := 0; i < flood; i++ {
			prefix := "nwa_"
			if i%2 == 1 {
				prefix = "nwh_"
			}
			require.Equal(t, http.StatusUnauthorized, capabilitiesStatus(t, s, randomBearer(prefix)))
		}
		after := cacheStats(s)
		require.Equal(t, before.Entries, after.Entries, "forged tokens entered the cache")
		require.Equal(t, before.StoreReads+flood, after.StoreReads)
		require.Equal(t, before.Hits, after.Hits)
		requireHit(t, s, s.AdminToken)

		// The counters are on /metrics.
		_, _, raw := s.Do(t, http.MethodGet, "/metrics", nil, "")
		require.Contains(t, string(raw), `nodeward_credential_lookups_total{result="hit"}`)
		require.Contains(t, string(raw), `nodeward_credential_cache_invalidations_total{source="local"}`)
	}, longCacheTTL)
}

// Two replicas on one Postgres database: what replica A revokes, replica B
// refuses as soon as it hears A's notification — with an hour-long TTL, so
// B's refusal is the notification's doing — and a dropped listener
// connection empties B's cache.
func TestCredentialCacheAcrossReplicas(t *testing.T) {
	t.Parallel()
	if os.Getenv(dbtest.EnvURL) == "" {
		t.Skip("several replicas need Postgres (DECISIONS.md §23)")
	}
	a := apitest.Start(t, apitest.WithDialect(models.Postgres), longCacheTTL)
	b := apitest.Start(t, apitest.WithReplicaOf(a), longCacheTTL)
	waitCacheOn(t, a)
	waitCacheOn(t, b)

	heardOnB := func(before int64) {
		t.Helper()
		require.Eventually(t, func() bool { return cacheStats(b).Invalidations["notify"] > before },
			30*time.Second, time.Millisecond, "replica B never heard the revocation")
	}

	// An API token revoked on A.
	tok := createToken(t, a, "replicas")
	requireCached(t, b, bearerAsk(t, b, tok.Token))
	notified := cacheStats(b).Invalidations["notify"]
	a.Admin(t, http.MethodPost, "/api/v1/tokens/"+tok.ID+"/revoke", nil, http.StatusOK, nil)
	heardOnB(notified)
	requireRefusedFromStore(t, b, tok.Token)
	require.Zero(t, cacheStats(a).Invalidations["notify"], "A heard its own revocation back")

	// A package host revoked through A (a ledger operation: either
	// replica's dispatcher may claim and run it, so B learns it from A's
	// notification or from its own commit).
	h := createHost(t, a, apitest.RandomID("replica-host-"), "nodes")
	requireCached(t, b, bearerAsk(t, b, h.Token))
	learned := func() int64 { n := cacheStats(b).Invalidations; return n["notify"] + n["local"] }
	before := learned()
	a.Admin(t, http.MethodPost, "/api/v1/package-hosts/"+h.PackageHostID+"/revoke", nil, http.StatusOK, nil)
	require.Eventually(t, func() bool { return learned() > before },
		30*time.Second, time.Millisecond, "replica B never learned of the revocation")
	requireRefusedFromStore(t, b, h.Token)

	// A console session signed out on A.
	cookie, _, err := a.App.Auth.Login(context.Background(), apitest.AdminUsername, apitest.AdminPassword, "127.0.0.1:1")
	require.NoError(t, err)
	withCookie := func(s *apitest.Server) (int, bool) {
		before := cacheStats(s)
		req := s.NewRequest(t, http.MethodGet, "/api/v1/capabilities", nil, "")
		req.AddCookie(&http.Cookie{Name: "nodeward_session", Value: cookie})
		status, _, _ := s.Send(t, req)
		return status, cacheStats(s).Hits == before.Hits+1
	}
	requireCached(t, b, func() (int, bool) { return withCookie(b) })
	p, err := a.App.Auth.AuthenticateSession(context.Background(), cookie)
	require.NoError(t, err)
	notified = cacheStats(b).Invalidations["notify"]
	require.NoError(t, a.App.Auth.Logout(context.Background(), p, "127.0.0.1:1"))
	heardOnB(notified)
	status, hit := withCookie(b)
	require.Equal(t, http.StatusUnauthorized, status)
	require.False(t, hit)

	// An administrator disabled on A: every token of theirs cached on B
	// is refused at once (one announcement names them all).
	a.Admin(t, http.MethodPost, "/api/v1/admins", map[string]string{"username": "carol", "password": "carols-long-password"},
		http.StatusCreated, nil)
	carols, _, err := a.App.Auth.CreateTokenFor(context.Background(), "carol", "carols-script")
	require.NoError(t, err)
	requireCached(t, b, bearerAsk(t, b, carols))
	notified = cacheStats(b).Invalidations["notify"]
	a.Admin(t, http.MethodPost, "/api/v1/admins/carol/disable", nil, http.StatusOK, nil)
	heardOnB(notified)
	requireRefusedFromStore(t, b, carols)

	// B's listener connection drops: B empties its cache (it may have
	// missed a notification), and reads again once it listens again.
	requireCached(t, b, bearerAsk(t, b, b.AdminToken))
	resyncs := cacheStats(b).Invalidations["resync"]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var killed int
	// The listeners of this schema's channel (A's and B's: a connection
	// whose last statement was that LISTEN) are ended; no other test's.
	require.NoError(t, a.App.DB.WithContext(ctx).Raw(
		`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query = ? AND datname = current_database()`,
		"LISTEN "+`"`+models.NotifyChannel(a.App.DB)+`"`).Scan(&killed).Error)
	require.Positive(t, killed, "no listener connection found")
	require.Eventually(t, func() bool { return cacheStats(b).Invalidations["resync"] > resyncs },
		30*time.Second, time.Millisecond, "B kept its cache after its listener dropped")
	waitCacheOn(t, b)
	stats := cacheStats(b)
	require.Equal(t, http.StatusOK, capabilitiesStatus(t, b, b.AdminToken))
	require.Equal(t, stats.StoreReads+1, cacheStats(b).StoreReads, "an entry survived the dropped listener")
	requireHit(t, b, b.AdminToken)
}
