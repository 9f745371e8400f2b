package diagnose_test

import (
	"context"
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/diagnose"
	"github.com/nodeward/nodeward/errcode"
)

// fakeDNS answers fixed addresses per name.
type fakeDNS map[string][]string

func (f fakeDNS) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, a := range f[host] {
		out = append(out, netip.MustParseAddr(a))
	}
	if len(out) == 0 {
		return nil, &net404{host}
	}
	return out, nil
}

type net404 struct{ host string }

func (e *net404) Error() string { return "no such host " + e.host }

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := diagnose.ParseURL(s)
	require.NoError(t, err)
	return u
}

func prober(t *testing.T, allow string, dns fakeDNS) *diagnose.Prober {
	t.Helper()
	a, err := diagnose.ParseAllowlist(allow)
	require.NoError(t, err)
	return &diagnose.Prober{Allow: a, Resolver: dns}
}

func TestAllowlist(t *testing.T) {
	_, err := diagnose.ParseAllowlist("10.0.0.0/8, not a host!")
	require.Error(t, err)
	dns := fakeDNS{"api.example.com": {"203.0.113.10"}, "internal.example": {"10.1.2.3"}, "mixed.example": {"10.1.2.3", "198.51.100.1"}}
	for _, c := range []struct {
		allow, url string
		ok         bool
	}{
		{"", "https://api.example.com/", false},
		{"api.example.com", "https://api.example.com/health", true},
		{"API.example.com.", "https://api.example.com/health", true},
		{"api.example.com", "https://other.example.com/", false},
		{"10.0.0.0/8", "http://10.9.9.9:8080/", true},
		{"10.0.0.0/8", "http://11.0.0.1/", false},
		{"10.0.0.0/8", "http://internal.example/", true},
		{"10.0.0.0/8", "http://mixed.example/", false},
		{"192.0.2.7", "http://192.0.2.7/", true},
		{"192.0.2.7", "http://192.0.2.8/", false},
	} {
		err := prober(t, c.allow, dns).Check(context.Background(), mustURL(t, c.url))
		if c.ok {
			require.NoError(t, err, "%s under %q", c.url, c.allow)
		} else {
			require.Equal(t, errcode.DestinationNotAllowed, errcode.Of(err), "%s under %q", c.url, c.allow)
		}
	}
}

func TestParseURL(t *testing.T) {
	for _, bad := range []string{"ftp://x/", "/relative", "https://user:pw@x/", "https:///nohost", "http://x/#frag"} {
		_, err := diagnose.ParseURL(bad)
		require.Error(t, err, bad)
	}
}

// A name allowed by name that resolves (or rebinds) to a loopback, private
// or metadata address is refused when the probe connects, unless a listed
// CIDR covers it.
func TestProbeRefusesRebinding(t *testing.T) {
	for _, addr := range []string{"127.0.0.1", "169.254.169.254", "10.0.0.5", "::1", "fd00::1",
		// Not public either, though not private: carrier-grade NAT (a
		// cloud's metadata address among them), benchmarking,
		// documentation, reserved, and IPv6 forms embedding IPv4.
		"100.100.100.200", "100.64.0.1", "198.18.0.1", "203.0.113.9", "240.0.0.1", "0.1.2.3",
		"64:ff9b::7f00:1", "2002:7f00:1::1", "2001:0:4136:e378::1", "::7f00:1", "2001:db8::1"} {
		p := prober(t, "api.example.com", fakeDNS{"api.example.com": {addr}})
		_, err := p.Probe(context.Background(), mustURL(t, "http://api.example.com/"), "")
		require.ErrorIs(t, err, diagnose.ErrNotAllowed, addr)
	}
}

func TestProbe(t *testing.T) {
	var seen atomic.Value
	var otherHits atomic.Int64
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { otherHits.Add(1) }))
	defer other.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r.Header.Get("Authorization"))
		if r.URL.Path == "/moved" {
			http.Redirect(w, r, other.URL+"/elsewhere", http.StatusFound)
			return
		}
		w.WriteHeader(http.StatusTeapot)
	}))
	defer srv.Close()
	p := prober(t, "127.0.0.1/32", nil)

	ev, err := p.Probe(context.Background(), mustURL(t, srv.URL+"/health"), "s3cret-token")
	require.NoError(t, err)
	require.True(t, ev.Reached)
	require.Equal(t, http.StatusTeapot, ev.Status)
	require.True(t, ev.CredentialSent)
	require.Equal(t, "Bearer s3cret-token", seen.Load())
	require.Nil(t, ev.TLS)

	ev, err = p.Probe(context.Background(), mustURL(t, srv.URL+"/moved"), "")
	require.NoError(t, err)
	require.Equal(t, http.StatusFound, ev.Status)
	require.NotNil(t, ev.Redirect)
	require.False(t, ev.Redirect.Followed)
	require.False(t, ev.Redirect.SameHost)
	require.Equal(t, other.URL+"/elsewhere", ev.Redirect.Location)
	require.Zero(t, otherHits.Load(), "a redirect to another host is not followed")

	// A closed port is evidence.
	closed := httptest.NewServer(http.NotFoundHandler())
	closedURL := closed.URL
	closed.Close()
	ev, err = p.Probe(context.Background(), mustURL(t, closedURL), "tok")
	require.NoError(t, err)
	require.False(t, ev.Reached)
	require.NotEmpty(t, ev.Error)
	require.False(t, ev.CredentialSent)
}

func TestProbeTLS(t *testing.T) {
	var auth atomic.Value
	auth.Store("")
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth.Store(r.Header.Get("Authorization"))
	}))
	defer srv.Close()
	u := mustURL(t, srv.URL)
	p := prober(t, "127.0.0.1/32", nil)

	// Untrusted (the system roots do not know it): reported with its
	// expiry, and no request — no credential — reaches it.
	ev, err := p.Probe(context.Background(), u, "tls-secret")
	require.NoError(t, err)
	require.False(t, ev.Reached)
	require.NotNil(t, ev.TLS)
	require.False(t, ev.TLS.Verified)
	require.NotEmpty(t, ev.TLS.VerifyError)
	require.False(t, ev.TLS.NotAfter.IsZero())
	require.False(t, ev.CredentialSent)
	require.Equal(t, "", auth.Load())
	require.NotContains(t, ev.Error, "tls-secret")

	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	p.RootCAs = pool
	ev, err = p.Probe(context.Background(), u, "tls-secret")
	require.NoError(t, err)
	require.True(t, ev.Reached, ev.Error)
	require.True(t, ev.TLS.Verified)
	require.Equal(t, srv.Certificate().NotAfter.UTC(), ev.TLS.NotAfter)
	require.Positive(t, ev.TLS.ExpiresInSeconds)
	require.True(t, strings.HasPrefix(ev.TLS.Version, "TLS"))
}
