package handlers_test

import (
	"database/sql/driver"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/internal/sqlcount"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
	"github.com/nodeward/nodeward/server/controlplane"
)

// BenchmarkAdminAuth is the price of authenticating an /api/ request
// through the real HTTP stack: GET /api/v1/capabilities, which reads
// nothing itself, with an administrator's API token and with a package
// host's token. On Postgres it reports the statements each request sends
// (every one a round trip), which is the authentication's own reads and
// writes. cache=off is the same server with the credential cache off (a
// store read per request, as before the cache).
func BenchmarkAdminAuth(b *testing.B) {
	for _, d := range dbtest.Dialects(b) {
		for _, cache := range []string{"on", "off"} {
			b.Run(d+"/cache="+cache, func(b *testing.B) { benchAdminAuth(b, d, cache == "on") })
		}
	}
}

func benchAdminAuth(b *testing.B, d string, cache bool) {
	counter := &sqlcount.Counter{}
	s := apitest.Start(b, apitest.WithDialect(d), apitest.WithLog(io.Discard), apitest.WithConfig(func(c *controlplane.Config) {
		c.WrapDBConnector = func(k driver.Connector) driver.Connector { return counter.Wrap(k) }
		if !cache {
			c.CredentialCacheTTL = -1
		}
	}))
	if cache {
		for i := 0; !s.App.Auth.CacheStats().Enabled; i++ {
			if i > 30000 {
				b.Fatal("the credential cache never turned on")
			}
			time.Sleep(time.Millisecond)
		}
	}
	status, _, raw := s.Do(b, http.MethodPost, "/api/v1/package-hosts", map[string]any{"name": benchName("bench-host-"), "families": []string{"nodes"}}, s.AdminToken)
	if status != http.StatusCreated {
		b.Fatalf("create package host: %d %s", status, raw)
	}
	var host struct {
		Token string `json:"token"`
	}
	if err := json.Unmarshal(raw, &host); err != nil {
		b.Fatal(err)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	b.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr}
	for _, c := range []struct{ name, token string }{{"api_token", s.AdminToken}, {"package_host", host.Token}} {
		b.Run(c.name, func(b *testing.B) {
			get := func() {
				req, _ := http.NewRequest(http.MethodGet, s.URL+"/api/v1/capabilities", nil)
				req.Header.Set("Authorization", "Bearer "+c.token)
				resp, err := hc.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
			get() // the connection, and a first verification
			before := counter.Snapshot()
			reads := authStoreReads(s)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				get()
			}
			b.StopTimer()
			if d == models.Postgres {
				b.ReportMetric(float64(counter.Snapshot().Sub(before).RoundTrips())/float64(b.N), "roundtrips/op")
			}
			b.ReportMetric(float64(authStoreReads(s)-reads)/float64(b.N), "storereads/op")
		})
	}
}

// authStoreReads counts the authentications that read the store.
func authStoreReads(s *apitest.Server) int64 { return s.App.Auth.CacheStats().StoreReads }
