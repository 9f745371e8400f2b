package handlers_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/server/controlplane"
)

// hangBound is how long a test waits for the server to give up on a slow
// client: far above the configured read timeout, far below "forever".
const hangBound = 30 * time.Second

// readUntilClosed reads what the server sends on conn until it closes the
// connection (a reset counts), failing the test when it has not within
// hangBound.
func readUntilClosed(t *testing.T, conn net.Conn) string {
	t.Helper()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(hangBound)))
	got, err := io.ReadAll(conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the server kept the connection of a slow client open; read so far: %q", got)
	}
	return string(got)
}

// A client that sends headers, or a body, and then stalls is cut off after
// the read timeout rather than holding its connection. A body that stops
// midway is answered 408 request_timeout, not 400 invalid_json (the JSON
// was not wrong, the client was slow), saying the limit and nothing of the
// body, and the connection is closed: the rest of the body is unread.
func TestSlowClientsAreCutOff(t *testing.T) {
	t.Parallel()
	s := apitest.Start(t, apitest.WithConfig(func(c *controlplane.Config) { c.ReadTimeout = time.Second }))
	addr := strings.TrimPrefix(s.URL, "http://")
	cookie, _ := consoleSignIn(t, s)
	const secret = "half-sent-secret"
	cases := []struct {
		name, raw string
		page      bool // a console page rather than a problem
	}{
		{"PartialEnrollBody", "POST /agent/v1/enroll HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{\"enrollment_token\":\"" + secret, false},
		{"PartialAPIBody", "POST /api/v1/tokens HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + s.AdminToken + "\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{\"name\":\"" + secret, false},
		{"ChunkedBodyThatStops", "POST /agent/v1/enroll HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n40\r\n{\"enrollment_token\":\"" + secret, false},
		{"PartialLoginForm", "POST /console/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 200\r\n\r\nusername=" + secret, true},
		{"PartialConsoleForm", "POST /console/tokens HTTP/1.1\r\nHost: x\r\nCookie: nodeward_session=" + cookie + "\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 200\r\n\r\nname=" + secret, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			conn, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			defer conn.Close()
			_, err = io.WriteString(conn, tc.raw)
			require.NoError(t, err)
			got := readUntilClosed(t, conn)
			resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(got)), nil)
			require.NoError(t, err, "answer: %q", got)
			raw, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.True(t, resp.Close, "Connection: close; answer: %q", got)
			require.NotContains(t, got, secret, "the answer echoes nothing of the body")
			if tc.page {
				require.Equal(t, http.StatusRequestTimeout, resp.StatusCode, "answer: %q", got)
				require.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"))
				require.Contains(t, string(raw), "Request Timeout")
				return
			}
			p := apitest.RequireProblem(t, resp.StatusCode, resp.Header, raw, http.StatusRequestTimeout, "request_timeout")
			require.Equal(t, "Request Timeout", p.Title)
			require.Contains(t, p.Detail, "read timeout (1 s)")
		})
	}
	t.Run("PartialHeaders", func(t *testing.T) {
		t.Parallel()
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer conn.Close()
		_, err = io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
		require.NoError(t, err)
		readUntilClosed(t, conn)
	})
	t.Run("MalformedBodyInTime", func(t *testing.T) {
		t.Parallel()
		s.Problem(t, http.MethodPost, "/agent/v1/enroll", apitest.Raw(`{"enrollment_token":`), "", http.StatusBadRequest, "invalid_json")
		s.Problem(t, http.MethodPost, "/api/v1/tokens", apitest.Raw(`{"name":"x"`), s.AdminToken, http.StatusBadRequest, "invalid_json")
	})
}

// A long-poll has no body: the read timeout does not end it.
func TestLongPollOutlivesReadTimeout(t *testing.T) {
	t.Parallel()
	s := apitest.Start(t, apitest.WithConfig(func(c *controlplane.Config) { c.ReadTimeout = time.Second }))
	_, enrolled := inviteAndEnroll(t, s)
	var out struct {
		Commands []any `json:"commands"`
	}
	s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=3", nil, enrolled.SessionToken, http.StatusOK, &out)
	require.Empty(t, out.Commands)
	require.Zero(t, testutil.ToFloat64(s.App.Metrics.HTTPRequests.WithLabelValues("/agent/v1/commands", "GET", "499")))
}

// A client that hangs up is counted apart (499), logged at debug, and is
// never a 5xx.
func TestClientHangUpIsNoServerError(t *testing.T) {
	t.Parallel()
	logs := &apitest.LogBuffer{}
	s := apitest.Start(t, apitest.WithLog(logs))
	requests := s.App.Metrics.HTTPRequests

	t.Run("ConsolePage", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/console/login", nil)
		s.App.Handler.ServeHTTP(httptest.NewRecorder(), req)
		require.Equal(t, 1.0, testutil.ToFloat64(requests.WithLabelValues("/console/login", "GET", "499")))
		require.Zero(t, testutil.ToFloat64(requests.WithLabelValues("/console/login", "GET", "500")))
	})

	t.Run("ConsoleSignedInPage", func(t *testing.T) {
		cookie, _ := consoleSignIn(t, s)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/console/tokens", nil)
		req.AddCookie(&http.Cookie{Name: "nodeward_session", Value: cookie})
		s.App.Handler.ServeHTTP(httptest.NewRecorder(), req)
		require.Equal(t, 1.0, testutil.ToFloat64(requests.WithLabelValues("/console/tokens", "GET", "499")))
		require.Zero(t, testutil.ToFloat64(requests.WithLabelValues("/console/tokens", "GET", "500")))
	})

	t.Run("API", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/api/v1/tokens", nil)
		req.Header.Set("Authorization", "Bearer "+s.AdminToken)
		s.App.Handler.ServeHTTP(httptest.NewRecorder(), req)
		require.Equal(t, 1.0, testutil.ToFloat64(requests.WithLabelValues("/api/*", "GET", "499")))
		for _, code := range []string{"500", "503"} {
			require.Zero(t, testutil.ToFloat64(requests.WithLabelValues("/api/*", "GET", code)))
		}
	})

	t.Run("LongPoll", func(t *testing.T) {
		_, enrolled := inviteAndEnroll(t, s)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req := s.NewRequest(t, http.MethodGet, "/agent/v1/commands?wait=60", nil, enrolled.SessionToken).WithContext(ctx)
		done := make(chan error, 1)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			done <- err
		}()
		waitFor(t, func() bool { return testutil.ToFloat64(s.App.Metrics.OpenLongPolls) == 1 }, "the poll is held")
		cancel()
		require.Error(t, <-done)
		waitFor(t, func() bool {
			return testutil.ToFloat64(requests.WithLabelValues("/agent/v1/commands", "GET", "499")) == 1
		}, "the hang-up is counted as 499")
		require.Zero(t, testutil.ToFloat64(requests.WithLabelValues("/agent/v1/commands", "GET", "200")))
	})

	for _, line := range strings.Split(logs.String(), "\n") {
		require.NotContains(t, line, "level=ERROR", "a hang-up is not logged as an error")
	}
}

// waitFor polls cond until it holds, failing after a generous deadline.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(hangBound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Client-controlled text is clipped in the log: a 100 KB path does not
// write a 100 KB line.
func TestAccessLogClipsClientText(t *testing.T) {
	t.Parallel()
	logs := &apitest.LogBuffer{}
	s := apitest.Start(t, apitest.WithLog(logs))
	long := strings.Repeat("p", 100<<10)
	req, err := http.NewRequest(http.MethodGet, s.URL+"/console/"+long, nil)
	require.NoError(t, err)
	req.Header.Set("User-Agent", strings.Repeat("u", 8<<10))
	req.Header.Set("X-Request-Id", "clip-test")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)

	found := false
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		require.Less(t, len(line), 2048, "log line of %d bytes", len(line))
		if strings.Contains(line, "request_id=clip-test") && strings.Contains(line, "msg=http") {
			found = true
			require.Contains(t, line, "/console/ppp")
			require.Contains(t, line, "bytes)")
		}
	}
	require.NoError(t, sc.Err())
	require.True(t, found, "the request was logged")
}

// A client that invents methods does not mint a metric series per method.
func TestMetricsLabelsAreBounded(t *testing.T) {
	t.Parallel()
	s := apitest.Start(t)
	for _, m := range []string{"BREW", "WHEN", "X-" + strings.Repeat("A", 200)} {
		req, err := http.NewRequest(m, s.URL+"/healthz", nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	}
	require.Equal(t, 3.0, testutil.ToFloat64(s.App.Metrics.HTTPRequests.WithLabelValues("unmatched", "other", "405")))
	series := testutil.CollectAndCount(s.App.Metrics.HTTPRequests)
	require.LessOrEqual(t, series, 2, "one series for the invented methods (and none per method)")
}

// Authentication before routing keeps each door's own rule: a retired
// node's session still reports (results, events) but asks for nothing, and
// is a session (404, not 401) on an unknown path.
func TestAgentDoorsOfARetiredNode(t *testing.T) {
	t.Parallel()
	s := apitest.Start(t)
	boot, enrolled := inviteAndEnroll(t, s)
	s.Admin(t, http.MethodPost, "/api/v1/nodes/"+boot.NodeID+"/retire", nil, http.StatusOK, nil)
	var settled struct {
		Settled []any `json:"settled"`
	}
	s.JSON(t, http.MethodPost, "/agent/v1/results", map[string]any{"results": []any{}}, enrolled.SessionToken, http.StatusOK, &settled)
	s.Problem(t, http.MethodGet, "/agent/v1/commands?wait=0", nil, enrolled.SessionToken, http.StatusGone, "node_retired")
	s.Problem(t, http.MethodGet, "/agent/v1/xyz", nil, enrolled.SessionToken, http.StatusNotFound, "not_found")
}

// TestLongPollAnswersCarryTheEdgeHeaders: the long-poll is served past the
// router and sets the headers every answer carries only as it answers
// (lateHeaders); its answers — work, a refusal, a bad request — carry them
// all the same, with the caller's request id, and a header the answer sets
// itself is its own.
func TestLongPollAnswersCarryTheEdgeHeaders(t *testing.T) {
	t.Parallel()
	s := apitest.Start(t)
	bs := &benchServer{Server: s, hc: s.Client}
	c, _ := bs.enrolled(t)
	for _, tc := range []struct {
		name, query, token string
		status             int
		code               string
	}{
		{"an answer", "?wait=0", c.SessionToken(), http.StatusOK, ""},
		{"a refusal", "?wait=0", "not-a-session", http.StatusUnauthorized, "session_invalid"},
		{"a bad request", "?wait=forever", c.SessionToken(), http.StatusBadRequest, "invalid_parameter"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := s.NewRequest(t, http.MethodGet, "/agent/v1/commands"+tc.query, nil, tc.token)
			req.Header.Set("X-Request-Id", "poll-"+strings.ReplaceAll(tc.name, " ", "-"))
			status, h, raw := s.Send(t, req)
			if tc.code != "" {
				p := apitest.RequireProblem(t, status, h, raw, tc.status, tc.code)
				require.Equal(t, req.Header.Get("X-Request-Id"), p.RequestID)
			} else {
				require.Equal(t, tc.status, status, string(raw))
				require.Equal(t, "application/json", h.Get("Content-Type"))
			}
			require.Equal(t, req.Header.Get("X-Request-Id"), h.Get("X-Request-Id"))
			require.Equal(t, []string{"nosniff"}, h.Values("X-Content-Type-Options"))
			require.Equal(t, "DENY", h.Get("X-Frame-Options"))
			require.Equal(t, "no-referrer", h.Get("Referrer-Policy"))
			require.Equal(t, "same-origin", h.Get("Cross-Origin-Opener-Policy"))
			require.Contains(t, h.Get("Content-Security-Policy"), "default-src 'self'")
			require.Empty(t, h.Get("Strict-Transport-Security"), "plain HTTP")
			if tc.status == http.StatusUnauthorized {
				require.Equal(t, `Bearer realm="nodeward-agent"`, h.Get("WWW-Authenticate"))
			}
		})
	}
}
