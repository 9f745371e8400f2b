package apitest_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/apitest"
)

// fakeServer answers every request with a canned response, so the tests can
// hand the validator exactly the drift it must catch.
type fakeServer struct {
	status int
	header http.Header
	body   io.ReadCloser
	got    *http.Request
	gotRaw string
}

func (f *fakeServer) RoundTrip(r *http.Request) (*http.Response, error) {
	f.got = r
	if r.Body != nil {
		b, _ := io.ReadAll(r.Body)
		f.gotRaw = string(b)
	}
	h := f.header.Clone()
	if h == nil {
		h = http.Header{}
	}
	if h.Get("X-Request-Id") == "" {
		h.Set("X-Request-Id", "req-1")
	}
	body := f.body
	if body == nil {
		body = http.NoBody
	}
	return &http.Response{StatusCode: f.status, Header: h, Body: body, Request: r}, nil
}

func jsonAnswer(status int, ct, body string) *fakeServer {
	return &fakeServer{status: status, header: http.Header{"Content-Type": {ct}}, body: io.NopCloser(strings.NewReader(body))}
}

type recorder struct {
	mu sync.Mutex
	vs []apitest.Violation
}

func (r *recorder) report(v apitest.Violation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.vs = append(r.vs, v)
}

func (r *recorder) all() []apitest.Violation {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]apitest.Violation(nil), r.vs...)
}

// exchange sends one request through a validating transport over fake and
// answers the violations found and the body the caller saw.
func exchange(t *testing.T, fake *fakeServer, method, path, contentType, body, auth string) ([]apitest.Violation, string) {
	t.Helper()
	rec := &recorder{}
	tr := &apitest.Transport{Base: fake, Contract: apitest.ProductContract(t), Report: rec.report}
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://127.0.0.1:1"+path, rd)
	require.NoError(t, err)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	require.NoError(t, err)
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return rec.all(), string(got)
}

const problemTemplate = `{"type":"https://nodeward.dev/problems/%[1]s","title":"t","status":%[2]d,"detail":"d","code":"%[1]s","instance":"/x","request_id":"req-1"}`

func problem(code string, status int) string {
	return fmt.Sprintf(problemTemplate, code, status)
}

func TestContract(t *testing.T) {
	t.Run("ProductDocumentLoads", func(t *testing.T) {
		c := apitest.ProductContract(t)
		require.Equal(t, "3.0.3", c.Doc.OpenAPI)
		for _, p := range []string{"/healthz", "/api/v1/tokens", "/api/v1/nodes/invitations", "/agent/v1/commands", "/agent/v1/enroll"} {
			require.NotNil(t, c.Doc.Paths.Value(p), "path %s", p)
		}
	})
	t.Run("BrokenDocumentIsRefused", func(t *testing.T) {
		_, err := apitest.LoadContract([]byte("openapi: 3.0.3\ninfo: {title: x, version: '1'}\npaths:\n  /x:\n    get:\n      responses:\n        '200':\n          $ref: '#/components/responses/Nope'\n"))
		require.Error(t, err)
	})
}

func TestTransportCatchesDrift(t *testing.T) {
	const auth = "Bearer nwa_x"
	cases := []struct {
		name         string
		fake         *fakeServer
		method, path string
		ct, body     string
		auth         string
		wantPhase    string // "" = no violation
		wantMention  string
	}{
		{
			name: "ConformingAnswer", fake: jsonAnswer(200, "application/json", `{"user_id":"u","username":"admin","via":"token"}`),
			method: "GET", path: "/api/v1/whoami", auth: auth,
		},
		{
			name: "MissingRequiredField", fake: jsonAnswer(200, "application/json", `{"user_id":"u","username":"admin"}`),
			method: "GET", path: "/api/v1/whoami", auth: auth, wantPhase: "response", wantMention: "via",
		},
		{
			name: "WrongEnumValue", fake: jsonAnswer(200, "application/json", `{"user_id":"u","username":"admin","via":"password"}`),
			method: "GET", path: "/api/v1/whoami", auth: auth, wantPhase: "response", wantMention: "via",
		},
		{
			name: "UndocumentedStatus", fake: jsonAnswer(418, "application/problem+json", problem("internal", 418)),
			method: "GET", path: "/api/v1/whoami", auth: auth, wantPhase: "response", wantMention: "status",
		},
		{
			name: "ErrorNotProblemJSON", fake: jsonAnswer(401, "application/json", problem("unauthenticated", 401)),
			method: "GET", path: "/api/v1/whoami", wantPhase: "response", wantMention: "application/json",
		},
		{
			name: "ProblemWithWrongCode", fake: jsonAnswer(401, "application/problem+json", problem("not_found", 401)),
			method: "GET", path: "/api/v1/whoami", wantPhase: "response", wantMention: "code",
		},
		{
			name: "ProblemWithoutRequestIDHeader", fake: &fakeServer{status: 401, header: http.Header{"Content-Type": {"application/problem+json"}, "X-Request-Id": {"not valid!"}}, body: io.NopCloser(strings.NewReader(problem("unauthenticated", 401)))},
			method: "GET", path: "/api/v1/whoami", wantPhase: "response", wantMention: "X-Request-Id",
		},
		{
			name: "AcceptedUnknownField", fake: jsonAnswer(201, "application/json", `{"id":"i","name":"n","user_id":"u","created_at":"2026-01-01T00:00:00Z","last_used_at":null,"revoked_at":null,"token":"nwa_t"}`),
			method: "POST", path: "/api/v1/tokens", ct: "application/json", body: `{"name":"n","extra":1}`, auth: auth,
			wantPhase: "request", wantMention: "extra",
		},
		{
			name: "RefusedUnknownField", fake: jsonAnswer(400, "application/problem+json", problem("invalid_json", 400)),
			method: "POST", path: "/api/v1/tokens", ct: "application/json", body: `{"name":"n","extra":1}`, auth: auth,
		},
		{
			name: "AcceptedWithoutCredential", fake: jsonAnswer(200, "application/json", `{"user_id":"u","username":"admin","via":"token"}`),
			method: "GET", path: "/api/v1/whoami", wantPhase: "request", wantMention: "security",
		},
		{
			name: "AcceptedBadQuery", fake: jsonAnswer(200, "application/json", `{"entries":[],"next_before":null}`),
			method: "GET", path: "/api/v1/admin-audit?limit=0", auth: auth, wantPhase: "request", wantMention: "limit",
		},
		{
			name: "UndocumentedPathAnswered", fake: jsonAnswer(200, "application/json", `{}`),
			method: "GET", path: "/api/v1/secret-door", auth: auth, wantPhase: "request", wantMention: "no such operation",
		},
		{
			name: "UndocumentedMethodAnswered", fake: jsonAnswer(200, "application/json", `{}`),
			method: "DELETE", path: "/api/v1/tokens", auth: auth, wantPhase: "request", wantMention: "no such operation",
		},
		{
			name: "UndocumentedPathRefusedWithProblem", fake: jsonAnswer(404, "application/problem+json", problem("not_found", 404)),
			method: "GET", path: "/api/v1/secret-door", auth: auth,
		},
		{
			name: "UndocumentedPathRefusedWithoutProblem", fake: jsonAnswer(404, "text/plain", "404 page not found"),
			method: "GET", path: "/api/v1/secret-door", auth: auth, wantPhase: "response", wantMention: "problem+json",
		},
		{
			name: "UndocumentedPathBrokenProblem", fake: jsonAnswer(405, "application/problem+json", `{"title":"x","status":405}`),
			method: "PUT", path: "/api/v1/whoami", auth: auth, wantPhase: "response", wantMention: "code",
		},
		{
			name: "DrainingWithoutRetryAfter", fake: jsonAnswer(503, "application/problem+json", problem("draining", 503)),
			method: "GET", path: "/agent/v1/commands?wait=1", auth: "Bearer s", wantPhase: "response", wantMention: "Retry-After",
		},
		{
			name: "DrainingWithRetryAfter", fake: &fakeServer{status: 503, header: http.Header{"Content-Type": {"application/problem+json"}, "Retry-After": {"5"}}, body: io.NopCloser(strings.NewReader(problem("draining", 503)))},
			method: "GET", path: "/agent/v1/commands?wait=1", auth: "Bearer s",
		},
		{
			name: "ConsoleIsNotInTheContract", fake: jsonAnswer(200, "text/html", "<html></html>"),
			method: "GET", path: "/console/",
		},
		{
			name: "MetricsBodyNotRead", fake: jsonAnswer(200, "text/plain; version=0.0.4; charset=utf-8", "# HELP x\n"),
			method: "GET", path: "/metrics",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			vs, _ := exchange(t, tc.fake, tc.method, tc.path, tc.ct, tc.body, tc.auth)
			if tc.wantPhase == "" {
				require.Empty(t, vs)
				return
			}
			require.Len(t, vs, 1, "violations: %v", vs)
			v := vs[0]
			require.Equal(t, tc.wantPhase, v.Phase)
			require.Equal(t, tc.method, v.Method)
			require.Equal(t, tc.fake.status, v.Status)
			msg := v.Error()
			require.Contains(t, msg, tc.method+" "+tc.path)
			require.Contains(t, msg, tc.wantMention)
		})
	}
}

func TestTransportIsTransparent(t *testing.T) {
	t.Run("BodiesPassUnchanged", func(t *testing.T) {
		fake := jsonAnswer(201, "application/json", `{"id":"i","name":"n","user_id":"u","created_at":"2026-01-01T00:00:00Z","last_used_at":null,"revoked_at":null,"token":"nwa_t"}`)
		vs, got := exchange(t, fake, "POST", "/api/v1/tokens", "application/json", `{"name":"n"}`, "Bearer nwa_x")
		require.Empty(t, vs)
		require.Equal(t, `{"name":"n"}`, fake.gotRaw, "the server must see the request body")
		require.Contains(t, got, `"token":"nwa_t"`, "the caller must see the response body")
	})

	t.Run("EventStreamStreams", func(t *testing.T) {
		pr, pw := io.Pipe()
		fake := &fakeServer{status: 200, header: http.Header{"Content-Type": {"text/event-stream"}}, body: pr}
		rec := &recorder{}
		tr := &apitest.Transport{Base: fake, Contract: apitest.ProductContract(t), Report: rec.report}
		req, err := http.NewRequest("GET", "http://127.0.0.1:1/api/v1/whoami", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer nwa_x")
		// RoundTrip must return while the stream is still open.
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		go func() {
			_, _ = io.WriteString(pw, "event: x\ndata: {}\n\n")
			_ = pw.Close()
		}()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, "event: x\ndata: {}\n\n", string(b))
		// whoami documents no event stream: the content type is reported,
		// the body is not read by the validator.
		require.Len(t, rec.all(), 1)
		require.Contains(t, rec.all()[0].Error(), "text/event-stream")
	})
}

func TestServer(t *testing.T) {
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		var who struct {
			UserID   string `json:"user_id"`
			Username string `json:"username"`
			Via      string `json:"via"`
		}
		s.Admin(t, http.MethodGet, "/api/v1/whoami", nil, http.StatusOK, &who)
		require.Equal(t, apitest.AdminUsername, who.Username)
		require.Equal(t, s.AdminUserID, who.UserID)
		require.Equal(t, "token", who.Via)

		p := s.Problem(t, http.MethodGet, "/api/v1/whoami", nil, "", http.StatusUnauthorized, "unauthenticated")
		require.Equal(t, "/api/v1/whoami", p.Instance)
		require.NotEmpty(t, p.RequestID)

		_, ok := s.Client.Transport.(*apitest.Transport)
		require.True(t, ok, "the client validates against the contract")
		require.True(t, strings.HasPrefix(s.URL, "http://127.0.0.1:"))
		require.Equal(t, s.URL, s.App.Config.PublicURL)
	})
}
