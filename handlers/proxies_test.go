package handlers_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/handlers"
	"github.com/nodeward/nodeward/server/controlplane"
)

func TestParseTrustedProxies(t *testing.T) {
	got, err := handlers.ParseTrustedProxies(" 10.0.0.0/8, 192.0.2.7 ,::ffff:198.51.100.1, 2001:db8::/32,::ffff:172.16.0.0/108,")
	require.NoError(t, err)
	var s []string
	for _, p := range got {
		s = append(s, p.String())
	}
	require.Equal(t, []string{"10.0.0.0/8", "192.0.2.7/32", "198.51.100.1/32", "2001:db8::/32", "172.16.0.0/12"}, s,
		"a mapped IPv4 prefix is read as the IPv4 one it names")
	none, err := handlers.ParseTrustedProxies("")
	require.NoError(t, err)
	require.Empty(t, none)
	for _, bad := range []string{"10.0.0.0/33", "proxy.internal", "10.0.0.1:80", "fe80::1%eth0"} {
		_, err := handlers.ParseTrustedProxies(bad)
		require.Error(t, err, bad)
		require.Contains(t, err.Error(), "NODEWARD_TRUSTED_PROXIES")
	}
}

func TestClientAddr(t *testing.T) {
	trusted, err := handlers.ParseTrustedProxies("10.0.0.0/8, 2001:db8::1")
	require.NoError(t, err)
	for _, c := range []struct {
		name, remote string
		forwarded    []string
		want         string
	}{
		{"PeerNotAProxy", "198.51.100.9:4000", []string{"203.0.113.5"}, "198.51.100.9:4000"},
		{"OneProxy", "10.0.0.2:4000", []string{"203.0.113.5"}, "203.0.113.5:0"},
		{"ForgedEntriesLeftAreNotRead", "10.0.0.2:4000", []string{"1.2.3.4, 203.0.113.5"}, "203.0.113.5:0"},
		{"ProxyChain", "10.0.0.2:4000", []string{"203.0.113.5, 10.0.0.7", "10.0.0.8"}, "203.0.113.5:0"},
		{"EntryWithPort", "10.0.0.2:4000", []string{"203.0.113.5:51000"}, "203.0.113.5:0"},
		{"IPv6Client", "[2001:db8::1]:443", []string{"2001:db8:ffff::9"}, "[2001:db8:ffff::9]:0"},
		{"MappedPeer", "[::ffff:10.0.0.2]:4000", []string{"203.0.113.5"}, "203.0.113.5:0"},
		{"NoHeader", "10.0.0.2:4000", nil, "10.0.0.2:4000"},
		{"OnlyProxies", "10.0.0.2:4000", []string{"10.1.1.1"}, "10.0.0.2:4000"},
		{"Garbage", "10.0.0.2:4000", []string{"not-an-address"}, "10.0.0.2:4000"},
		{"GarbageLeftOfTheClient", "10.0.0.2:4000", []string{"junk, 203.0.113.5"}, "203.0.113.5:0"},
	} {
		got, fromChain := handlers.ClientAddr(c.remote, c.forwarded, trusted)
		require.Equal(t, c.want, got, c.name)
		require.Equal(t, c.want != c.remote, fromChain, "%s: read from the chain", c.name)
	}
}

// TestSignInLimitBehindAProxy: with the balancer named, the sign-in
// limit and the audit key on the client it forwards; without, the
// forwarded header changes nothing (a client cannot pick its own key).
func TestSignInLimitBehindAProxy(t *testing.T) {
	t.Parallel()
	login := func(s *apitest.Server, forwardedFor, password string) int {
		form := url.Values{"username": {apitest.AdminUsername}, "password": {password}}
		req := s.NewRequest(t, http.MethodPost, "/console/login",
			apitest.Body{ContentType: "application/x-www-form-urlencoded", Data: []byte(form.Encode())}, "")
		req.Header.Set("X-Forwarded-For", forwardedFor)
		status, _, _ := s.Send(t, req)
		return status
	}
	guess := func(s *apitest.Server, forwardedFor string) {
		for i := 0; i < 5; i++ {
			require.Equal(t, http.StatusUnauthorized, login(s, forwardedFor, "a-wrong-password"))
		}
		require.Equal(t, http.StatusTooManyRequests, login(s, forwardedFor, "a-wrong-password"))
	}
	noRedirects := func(s *apitest.Server) {
		s.Client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	}

	t.Run("ProxyNamed", func(t *testing.T) {
		s := apitest.Start(t, apitest.WithConfig(func(c *controlplane.Config) { c.TrustedProxies = "127.0.0.1" }))
		noRedirects(s)
		guess(s, "203.0.113.5")
		require.Equal(t, http.StatusSeeOther, login(s, "203.0.113.6", apitest.AdminPassword), "another client is not held back")
		var audit struct {
			Entries []struct {
				Action, Outcome string
				RemoteAddr      string `json:"remote_addr"`
			} `json:"entries"`
		}
		_, _, raw := s.Do(t, http.MethodGet, "/api/v1/admin-audit", nil, s.AdminToken)
		require.NoError(t, json.Unmarshal(raw, &audit))
		remotes := map[string]string{}
		for _, e := range audit.Entries {
			if e.Action == "login" {
				remotes[e.Outcome] = e.RemoteAddr
			}
		}
		require.Equal(t, "203.0.113.5", remotes["failed"])
		require.Equal(t, "203.0.113.6:0", remotes["ok"])
	})
	t.Run("NoneNamed", func(t *testing.T) {
		s := apitest.Start(t)
		noRedirects(s)
		guess(s, "203.0.113.5")
		require.Equal(t, http.StatusTooManyRequests, login(s, "203.0.113.6", apitest.AdminPassword),
			"a forwarded header from an unnamed peer is not read")
	})
}

// TestAccessLogNamesTheProxy: behind a named proxy the access log's
// remote is the client it forwarded for and proxy is the proxy itself
// (the TCP peer), so an operator still sees which balancer a request came
// through — on the long-poll's edge as on every other. A request whose
// client is its peer has no proxy attribute.
func TestAccessLogNamesTheProxy(t *testing.T) {
	t.Parallel()
	peer := regexp.MustCompile(`^127\.0\.0\.1:[1-9][0-9]*$`)
	// send sends one request and answers its access line's attributes.
	send := func(t *testing.T, s *apitest.Server, logs *apitest.LogBuffer, path, token, forwardedFor string) map[string]string {
		t.Helper()
		id := apitest.RandomID("proxy-log-")
		req := s.NewRequest(t, http.MethodGet, path, nil, token)
		req.Header.Set("X-Request-Id", id)
		if forwardedFor != "" {
			req.Header.Set("X-Forwarded-For", forwardedFor)
		}
		status, _, raw := s.Send(t, req)
		require.Equal(t, http.StatusOK, status, "%s", raw)
		// The line is written once the answer has gone out.
		var attrs map[string]string
		waitFor(t, func() bool {
			for _, line := range strings.Split(logs.String(), "\n") {
				if strings.Contains(line, " msg=http ") && strings.Contains(line, " request_id="+id+" ") {
					attrs = map[string]string{}
					for _, f := range strings.Fields(line) {
						if k, v, ok := strings.Cut(f, "="); ok {
							attrs[k] = v
						}
					}
					return true
				}
			}
			return false
		}, "the request's access line")
		return attrs
	}

	t.Run("ProxyNamed", func(t *testing.T) {
		t.Parallel()
		logs := &apitest.LogBuffer{}
		s := apitest.Start(t, apitest.WithLog(logs), apitest.WithConfig(func(c *controlplane.Config) { c.TrustedProxies = "127.0.0.1" }))
		_, enrolled := inviteAndEnroll(t, s)
		for _, tc := range []struct{ name, path, token string }{
			{"Page", "/healthz", ""},
			{"LongPoll", "/agent/v1/commands?wait=0", enrolled.SessionToken},
		} {
			t.Run(tc.name, func(t *testing.T) {
				got := send(t, s, logs, tc.path, tc.token, "198.51.100.1, 203.0.113.5")
				require.Equal(t, "203.0.113.5:0", got["remote"], "the client the proxy forwarded for")
				require.Regexp(t, peer, got["proxy"], "the proxy that connected")

				got = send(t, s, logs, tc.path, tc.token, "")
				require.Regexp(t, peer, got["remote"], "no forwarded client: the peer is the client")
				require.NotContains(t, got, "proxy")
			})
		}
	})
	t.Run("NoneNamed", func(t *testing.T) {
		t.Parallel()
		logs := &apitest.LogBuffer{}
		s := apitest.Start(t, apitest.WithLog(logs))
		got := send(t, s, logs, "/healthz", "", "203.0.113.5")
		require.Regexp(t, peer, got["remote"], "the forwarded header of an unnamed peer is not read")
		require.NotContains(t, got, "proxy")
	})
}
