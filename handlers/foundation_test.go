package handlers_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward"
	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

type tokenJSON struct {
	ID         string     `json:"id"`
	Name       string     `json:"name"`
	UserID     string     `json:"user_id"`
	CreatedAt  time.Time  `json:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
	RevokedAt  *time.Time `json:"revoked_at"`
	Token      string     `json:"token"`
}

type auditJSON struct {
	Entries []struct {
		ID     int64  `json:"id"`
		Actor  string `json:"actor"`
		Action string `json:"action"`
		Target string `json:"target"`
		Detail string `json:"detail"`
	} `json:"entries"`
	NextBefore *string `json:"next_before"`
}

// rowCounts is what a refused request must leave unchanged.
func rowCounts(t *testing.T, s *apitest.Server) [3]int64 {
	t.Helper()
	return [3]int64{
		dbtest.Count(t, s.App.DB.DB, &models.APIToken{}),
		dbtest.Count(t, s.App.DB.DB, &models.AdminAudit{}),
		dbtest.Count(t, s.App.DB.DB, &models.AdminUser{}),
	}
}

func createToken(t *testing.T, s *apitest.Server, name string) tokenJSON {
	t.Helper()
	var tok tokenJSON
	s.Admin(t, http.MethodPost, "/api/v1/tokens", map[string]string{"name": name}, http.StatusCreated, &tok)
	require.True(t, strings.HasPrefix(tok.Token, "nwa_"), "token %q", tok.Token)
	require.Equal(t, name, tok.Name)
	require.Nil(t, tok.LastUsedAt)
	require.Nil(t, tok.RevokedAt)
	return tok
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		big := `{"name":"` + strings.Repeat("a", 1<<20) + `"}`
		cases := []struct {
			name     string
			method   string
			path     string
			body     any
			status   int
			code     string
			mentions string
		}{
			{"MalformedJSON", "POST", "/api/v1/tokens", apitest.Raw(`{"name":`), 400, "invalid_json", "malformed"},
			{"NotAnObject", "POST", "/api/v1/tokens", apitest.Raw(`["ci"]`), 400, "invalid_json", ""},
			{"WrongType", "POST", "/api/v1/tokens", apitest.Raw(`{"name":7}`), 400, "invalid_json", "name"},
			{"UnknownField", "POST", "/api/v1/tokens", apitest.Raw(`{"name":"ci","admin":true}`), 400, "invalid_json", "admin"},
			{"TrailingData", "POST", "/api/v1/tokens", apitest.Raw(`{"name":"ci"} {"name":"again"}`), 400, "invalid_json", "trailing"},
			{"TrailingGarbage", "POST", "/api/v1/tokens", apitest.Raw(`{"name":"ci"}x`), 400, "invalid_json", ""},
			{"EmptyBody", "POST", "/api/v1/tokens", apitest.Raw(``), 400, "invalid_json", "empty"},
			{"WrongContentType", "POST", "/api/v1/tokens", apitest.Body{ContentType: "text/plain", Data: []byte(`{"name":"ci"}`)}, 415, "unsupported_media_type", ""},
			{"FormContentType", "POST", "/api/v1/tokens", apitest.Body{ContentType: "application/x-www-form-urlencoded", Data: []byte(`name=ci`)}, 415, "unsupported_media_type", ""},
			{"NoContentType", "POST", "/api/v1/tokens", apitest.Body{Data: []byte(`{"name":"ci"}`)}, 415, "unsupported_media_type", ""},
			{"Oversized", "POST", "/api/v1/tokens", apitest.Raw(big), 413, "payload_too_large", ""},
			{"BlankName", "POST", "/api/v1/tokens", map[string]string{"name": "   "}, 422, "validation_failed", "name"},
			{"RevokeUnknownField", "POST", "/api/v1/tokens/x/revoke", apitest.Raw(`{"why":"because"}`), 400, "invalid_json", "why"},
			{"RevokeMalformed", "POST", "/api/v1/tokens/x/revoke", apitest.Raw(`{`), 400, "invalid_json", ""},
			{"RevokeUnknownToken", "POST", "/api/v1/tokens/no-such-token/revoke", nil, 404, "not_found", ""},
			{"AuditBadLimit", "GET", "/api/v1/admin-audit?limit=0", nil, 400, "invalid_parameter", "limit"},
			{"AuditLimitTooLarge", "GET", "/api/v1/admin-audit?limit=501", nil, 400, "invalid_parameter", "limit"},
			{"AuditBadCursor", "GET", "/api/v1/admin-audit?before=abc", nil, 400, "invalid_parameter", "before"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				before := rowCounts(t, s)
				p := s.Problem(t, tc.method, tc.path, tc.body, s.AdminToken, tc.status, tc.code)
				require.Contains(t, p.Detail, tc.mentions)
				require.Equal(t, strings.SplitN(tc.path, "?", 2)[0], p.Instance)
				require.Equal(t, "https://nodeward.dev/problems/"+tc.code, p.Type)
				switch tc.code {
				case "validation_failed":
					require.NotEmpty(t, p.Errors)
					require.Equal(t, "name", p.Errors[0].Field)
				case "invalid_parameter":
					require.NotEmpty(t, p.Errors)
					require.Equal(t, tc.mentions, p.Errors[0].Field)
				}
				require.Equal(t, before, rowCounts(t, s), "a refused request changed nothing")
			})
		}

		t.Run("OversizedWithoutContentLength", func(t *testing.T) {
			// A chunked body has no declared length: the limit holds while
			// reading. (A plain client: the validating one buffers bodies.)
			before := rowCounts(t, s)
			req := s.NewRequest(t, http.MethodPost, "/api/v1/tokens", nil, s.AdminToken)
			req.Body = io.NopCloser(io.MultiReader(strings.NewReader(big)))
			req.ContentLength = -1
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			raw, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			apitest.RequireProblem(t, resp.StatusCode, resp.Header, raw, http.StatusRequestEntityTooLarge, "payload_too_large")
			require.Equal(t, before, rowCounts(t, s))
		})

		t.Run("ValueNeverEchoed", func(t *testing.T) {
			const secret = "s3cr3t-value-never-echoed"
			p := s.Problem(t, http.MethodPost, "/api/v1/tokens", apitest.Raw(`{"name":["`+secret+`"]}`), s.AdminToken, 400, "invalid_json")
			require.NotContains(t, p.Raw, secret)
		})
	})
}

func TestAuthentication(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		tok := createToken(t, s, "to-revoke")
		s.Admin(t, http.MethodPost, "/api/v1/tokens/"+tok.ID+"/revoke", nil, http.StatusOK, nil)

		credentials := []struct {
			name  string
			token string
		}{
			{"Missing", ""},
			{"Forged", "nwa_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"},
			{"WithoutPrefix", "not-a-nodeward-token"},
			{"Revoked", tok.Token},
		}
		for _, c := range credentials {
			t.Run(c.name, func(t *testing.T) {
				before := rowCounts(t, s)
				status, h, raw := s.Do(t, http.MethodGet, "/api/v1/whoami", nil, c.token)
				p := apitest.RequireProblem(t, status, h, raw, http.StatusUnauthorized, "unauthenticated")
				require.Equal(t, `Bearer realm="nodeward"`, h.Get("WWW-Authenticate"))
				if c.token != "" {
					require.NotContains(t, p.Raw, c.token, "the answer never echoes the credential")
				}
				// A refused credential writes nothing.
				require.Equal(t, before, rowCounts(t, s))
			})
		}

		t.Run("ForgedCookie", func(t *testing.T) {
			req := s.NewRequest(t, http.MethodGet, "/api/v1/whoami", nil, "")
			req.AddCookie(&http.Cookie{Name: "nodeward_session", Value: "eyJhbGciOiJIUzI1NiJ9.e30.forged"})
			status, h, raw := s.Send(t, req)
			apitest.RequireProblem(t, status, h, raw, http.StatusUnauthorized, "unauthenticated")
		})

		t.Run("RevokedTokenStillListedAsRevoked", func(t *testing.T) {
			var list struct{ Tokens []tokenJSON }
			s.Admin(t, http.MethodGet, "/api/v1/tokens", nil, http.StatusOK, &list)
			found := false
			for _, x := range list.Tokens {
				require.Empty(t, x.Token, "a listing never shows a token")
				if x.ID == tok.ID {
					found = true
					require.NotNil(t, x.RevokedAt)
				}
			}
			require.True(t, found)
		})
	})
}

// Authentication comes before routing: no /api path tells an anonymous
// caller whether it exists.
func TestEveryAPIPathNeedsAuthentication(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		paths := []struct{ method, path string }{
			{"GET", "/api/v1/whoami"},
			{"GET", "/api/v1/tokens"},
			{"POST", "/api/v1/tokens"},
			{"POST", "/api/v1/tokens/x/revoke"},
			{"GET", "/api/v1/admin-audit"},
			{"GET", "/api/v1/nodes"},
			{"POST", "/api/v1/nodes/invitations"},
			{"GET", "/api/v1/nodes/n1"},
			{"POST", "/api/v1/nodes/n1/commands"},
			{"GET", "/api/v1/offers"},
			{"GET", "/api/v1/sessions"},
			{"POST", "/api/v1/operations"},
			{"GET", "/api/v1/no-such-thing"},
			{"DELETE", "/api/v1/tokens"},
			{"PATCH", "/api/v1/whoami"},
			{"GET", "/api/v2/anything"},
			{"GET", "/api/"},
			{"GET", "/api"},
		}
		for _, p := range paths {
			t.Run(p.method+p.path, func(t *testing.T) {
				var body any
				if p.method == "POST" {
					body = map[string]any{}
				}
				s.Problem(t, p.method, p.path, body, "", http.StatusUnauthorized, "unauthenticated")
			})
		}
	})
}

func TestRouting(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		for _, path := range []string{"/api/v1/no-such-thing", "/api/v2/whoami", "/api/v1/tokens/x/y/z"} {
			p := s.Problem(t, http.MethodGet, path, nil, s.AdminToken, http.StatusNotFound, "not_found")
			require.Equal(t, path, p.Instance)
		}
		for _, c := range []struct{ method, path, allow string }{
			{"DELETE", "/api/v1/tokens", "GET, HEAD, POST"},
			{"PUT", "/api/v1/whoami", "GET, HEAD"},
			{"GET", "/api/v1/tokens/x/revoke", "POST"},
		} {
			p := s.Problem(t, c.method, c.path, nil, s.AdminToken, http.StatusMethodNotAllowed, "method_not_allowed")
			require.Contains(t, p.Detail, c.method)
			_, hd, _ := s.Do(t, c.method, c.path, nil, s.AdminToken)
			require.Equal(t, c.allow, hd.Get("Allow"), "405 names what the path takes")
		}
		// Outside /api the same shapes hold.
		s.Problem(t, http.MethodGet, "/agent/v1/no-such-door", nil, "", http.StatusUnauthorized, "session_invalid")
		s.Problem(t, http.MethodPost, "/healthz", map[string]any{}, "", http.StatusMethodNotAllowed, "method_not_allowed")
		// HEAD wherever GET is served (a balancer's health check).
		for _, path := range []string{"/healthz", "/readyz"} {
			status, _, raw := s.Do(t, http.MethodHead, path, nil, "")
			require.Equal(t, http.StatusOK, status, path)
			require.Empty(t, raw)
		}
		// A console address that only answers a form: a page, not JSON.
		status, hd, raw := s.Do(t, http.MethodGet, "/console/tokens/x/revoke", nil, "")
		require.Equal(t, http.StatusMethodNotAllowed, status)
		require.Equal(t, "POST", hd.Get("Allow"))
		require.Contains(t, hd.Get("Content-Type"), "text/html")
		require.Contains(t, string(raw), "Not available this way")
	})
}

func TestRequestID(t *testing.T) {
	t.Parallel()
	s := apitest.Start(t)
	req := s.NewRequest(t, http.MethodGet, "/api/v1/whoami", nil, "")
	req.Header.Set("X-Request-Id", "trace-42")
	status, h, raw := s.Send(t, req)
	p := apitest.RequireProblem(t, status, h, raw, http.StatusUnauthorized, "unauthenticated")
	require.Equal(t, "trace-42", h.Get("X-Request-Id"))
	require.Equal(t, "trace-42", p.RequestID)

	// A malformed id is replaced, never reflected.
	req = s.NewRequest(t, http.MethodGet, "/api/v1/whoami", nil, "")
	req.Header.Set("X-Request-Id", "bad id <script>")
	status, h, raw = s.Send(t, req)
	p = apitest.RequireProblem(t, status, h, raw, http.StatusUnauthorized, "unauthenticated")
	require.NotContains(t, p.Raw, "script")
	require.Equal(t, h.Get("X-Request-Id"), p.RequestID)
	require.NotEmpty(t, p.RequestID)
}

func TestTokenLifecycle(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		tok := createToken(t, s, "deploy-bot")
		require.Equal(t, s.AdminUserID, tok.UserID)

		var who struct {
			Username string `json:"username"`
			Via      string `json:"via"`
		}
		s.JSON(t, http.MethodGet, "/api/v1/whoami", nil, tok.Token, http.StatusOK, &who)
		require.Equal(t, apitest.AdminUsername, who.Username)
		require.Equal(t, "token", who.Via)

		var list struct{ Tokens []tokenJSON }
		s.Admin(t, http.MethodGet, "/api/v1/tokens", nil, http.StatusOK, &list)
		var listed *tokenJSON
		for i := range list.Tokens {
			require.Empty(t, list.Tokens[i].Token, "a listing never shows a token")
			if list.Tokens[i].ID == tok.ID {
				listed = &list.Tokens[i]
			}
		}
		require.NotNil(t, listed, "the new token is listed")
		require.Equal(t, "deploy-bot", listed.Name)
		require.NotNil(t, listed.LastUsedAt, "last_used_at is set once the token was used")
		require.Nil(t, listed.RevokedAt)
		require.Equal(t, tok.ID, list.Tokens[0].ID, "newest first")

		var revoked tokenJSON
		s.Admin(t, http.MethodPost, "/api/v1/tokens/"+tok.ID+"/revoke", nil, http.StatusOK, &revoked)
		require.NotNil(t, revoked.RevokedAt)
		require.Empty(t, revoked.Token)
		p := s.Problem(t, http.MethodGet, "/api/v1/whoami", nil, tok.Token, http.StatusUnauthorized, "unauthenticated")
		require.NotContains(t, p.Raw, tok.Token)

		// Revoking again is harmless: same answer, no second audit row.
		var again tokenJSON
		s.Admin(t, http.MethodPost, "/api/v1/tokens/"+tok.ID+"/revoke", map[string]any{}, http.StatusOK, &again)
		// Postgres keeps microseconds; the first answer carries the
		// in-memory nanoseconds (auth.RevokeToken does not truncate).
		require.True(t, revoked.RevokedAt.Truncate(time.Microsecond).Equal(again.RevokedAt.Truncate(time.Microsecond)),
			"revoked_at unchanged: %v vs %v", revoked.RevokedAt, again.RevokedAt)

		// The administrator's own token still works.
		s.Admin(t, http.MethodGet, "/api/v1/whoami", nil, http.StatusOK, nil)

		var audit auditJSON
		s.Admin(t, http.MethodGet, "/api/v1/admin-audit", nil, http.StatusOK, &audit)
		count := map[string]int{}
		for _, e := range audit.Entries {
			if e.Target == tok.ID {
				count[e.Action]++
				require.Equal(t, apitest.AdminUsername, e.Actor)
				require.NotContains(t, e.Detail, tok.Token, "the audit never holds a secret")
			}
		}
		require.Equal(t, map[string]int{"token.create": 1, "token.revoke": 1}, count)
		require.Nil(t, audit.NextBefore, "one page holds everything")
		for i := 1; i < len(audit.Entries); i++ {
			require.Greater(t, audit.Entries[i-1].ID, audit.Entries[i].ID, "newest first")
		}
	})
}

func TestAdminAuditPages(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		for _, n := range []string{"a", "b", "c"} {
			createToken(t, s, n)
		}
		var all auditJSON
		s.Admin(t, http.MethodGet, "/api/v1/admin-audit", nil, http.StatusOK, &all)
		require.GreaterOrEqual(t, len(all.Entries), 4)

		var seen []int64
		path := "/api/v1/admin-audit?limit=2"
		for range 10 {
			var page auditJSON
			s.Admin(t, http.MethodGet, path, nil, http.StatusOK, &page)
			require.LessOrEqual(t, len(page.Entries), 2)
			for _, e := range page.Entries {
				seen = append(seen, e.ID)
			}
			if page.NextBefore == nil {
				break
			}
			path = "/api/v1/admin-audit?limit=2&before=" + *page.NextBefore
		}
		want := make([]int64, 0, len(all.Entries))
		for _, e := range all.Entries {
			want = append(want, e.ID)
		}
		require.Equal(t, want, seen, "pages walk the whole log once, newest first")
	})
}

func TestOperationsEndpoints(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		var health struct{ Status string }
		s.JSON(t, http.MethodGet, "/healthz", nil, "", http.StatusOK, &health)
		require.Equal(t, "ok", health.Status)

		var ready struct {
			Status string            `json:"status"`
			Checks map[string]string `json:"checks"`
		}
		s.JSON(t, http.MethodGet, "/readyz", nil, "", http.StatusOK, &ready)
		require.Equal(t, "ready", ready.Status)
		require.Equal(t, map[string]string{"database": "ok", "migrations": "ok", "draining": "no"}, ready.Checks)

		status, h, raw := s.Do(t, http.MethodGet, "/metrics", nil, "")
		require.Equal(t, http.StatusOK, status)
		require.True(t, strings.HasPrefix(h.Get("Content-Type"), "text/plain"), h.Get("Content-Type"))
		require.Contains(t, string(raw), "nodeward_http_requests_total")
		require.Contains(t, string(raw), `route="/readyz"`, "requests are counted by route pattern")

		status, h, raw = s.Do(t, http.MethodGet, "/openapi.yaml", nil, "")
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, "application/yaml", h.Get("Content-Type"))
		require.True(t, bytes.Equal(nodeward.OpenAPI, raw), "the served contract is the embedded one")
		_, err := apitest.LoadContract(raw)
		require.NoError(t, err, "the served contract is a valid OpenAPI document")

		// Every answer carries the security headers.
		require.Equal(t, "nosniff", h.Get("X-Content-Type-Options"))
		require.Equal(t, "DENY", h.Get("X-Frame-Options"))
	})
}

// The problem document itself: every member the contract promises.
func TestProblemShape(t *testing.T) {
	t.Parallel()
	s := apitest.Start(t)
	_, h, raw := s.Do(t, http.MethodGet, "/api/v1/whoami", nil, "")
	require.Equal(t, "no-store", h.Get("Cache-Control"))
	var m map[string]any
	require.NoError(t, json.Unmarshal(raw, &m))
	for _, k := range []string{"type", "title", "status", "detail", "code", "instance", "request_id"} {
		require.Contains(t, m, k)
	}
	require.Equal(t, "Unauthorized", m["title"])
}
