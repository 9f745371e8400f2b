package handlers_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/handlers"
)

type adminJSON struct {
	ID                string     `json:"id"`
	Username          string     `json:"username"`
	CreatedAt         time.Time  `json:"created_at"`
	DisabledAt        *time.Time `json:"disabled_at"`
	PasswordChangedAt *time.Time `json:"password_changed_at"`
	LiveSessions      int64      `json:"live_sessions"`
	SessionsEnded     int64      `json:"sessions_ended"`
}

// asCookie sends one JSON request with a console session's cookie and
// answers its status and body (the contract checks both).
func asCookie(t *testing.T, s *apitest.Server, cookie, method, path string, body any) (int, []byte) {
	t.Helper()
	req := s.NewRequest(t, method, path, body, "")
	req.AddCookie(&http.Cookie{Name: handlers.SessionCookie, Value: cookie})
	status, _, raw := s.Send(t, req)
	return status, raw
}

func listedAdmin(t *testing.T, s *apitest.Server, username string) adminJSON {
	t.Helper()
	var list struct {
		Admins     []adminJSON `json:"admins"`
		NextBefore *string     `json:"next_before"`
	}
	s.Admin(t, http.MethodGet, "/api/v1/admins", nil, http.StatusOK, &list)
	for _, a := range list.Admins {
		if a.Username == username {
			return a
		}
	}
	t.Fatalf("%s is not listed", username)
	return adminJSON{}
}

// TestAdministrators: administrators add, disable, enable and sign out one
// another through the API; a disabled administrator's every credential is
// refused at once, and nothing about it names a secret.
func TestAdministrators(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		const bobPassword = "bobs-long-password"
		var bob adminJSON
		s.Admin(t, http.MethodPost, "/api/v1/admins", map[string]string{"username": "bob", "password": bobPassword},
			http.StatusCreated, &bob)
		require.Equal(t, "bob", bob.Username)
		require.Nil(t, bob.DisabledAt)

		t.Run("CreateRefusals", func(t *testing.T) {
			before := rowCounts(t, s)
			s.Problem(t, http.MethodPost, "/api/v1/admins", map[string]string{"username": "bob", "password": bobPassword},
				s.AdminToken, http.StatusConflict, "conflict")
			p := s.Problem(t, http.MethodPost, "/api/v1/admins", map[string]string{"username": "carol", "password": "short"},
				s.AdminToken, http.StatusUnprocessableEntity, "validation_failed")
			require.Equal(t, "password", p.Errors[0].Field)
			require.NotContains(t, p.Raw, "short")
			s.Problem(t, http.MethodPost, "/api/v1/admins", map[string]string{"username": "carol"},
				s.AdminToken, http.StatusUnprocessableEntity, "validation_failed")
			s.Problem(t, http.MethodPost, "/api/v1/admins", map[string]any{"username": "carol", "password": bobPassword, "role": "x"},
				s.AdminToken, http.StatusBadRequest, "invalid_json")
			require.Equal(t, before, rowCounts(t, s), "a refusal changes nothing")
		})

		browser := signInAs(t, s, "bob", bobPassword)
		status, raw := asCookie(t, s, browser.cookie, http.MethodPost, "/api/v1/tokens", map[string]string{"name": "bobs-script"})
		require.Equal(t, http.StatusCreated, status, "%s", raw)
		var tok tokenJSON
		require.NoError(t, json.Unmarshal(raw, &tok))
		s.JSON(t, http.MethodGet, "/api/v1/whoami", nil, tok.Token, http.StatusOK, nil)
		require.EqualValues(t, 1, listedAdmin(t, s, "bob").LiveSessions)

		t.Run("DisableEndsEverything", func(t *testing.T) {
			var out adminJSON
			s.Admin(t, http.MethodPost, "/api/v1/admins/bob/disable", nil, http.StatusOK, &out)
			require.NotNil(t, out.DisabledAt)
			require.EqualValues(t, 1, out.SessionsEnded)
			status, _ := asCookie(t, s, browser.cookie, http.MethodGet, "/api/v1/whoami", nil)
			require.Equal(t, http.StatusUnauthorized, status, "the console session ended")
			p := s.Problem(t, http.MethodGet, "/api/v1/whoami", nil, tok.Token, http.StatusUnauthorized, "unauthenticated")
			require.NotContains(t, p.Raw, tok.Token)
			res := (&consoleUser{t: t, s: s, client: browser.client}).send(http.MethodPost, "/console/login",
				map[string][]string{"username": {"bob"}, "password": {bobPassword}})
			res.Body.Close()
			require.Equal(t, http.StatusUnauthorized, res.StatusCode, "the right password signs nobody in")
			require.Zero(t, listedAdmin(t, s, "bob").LiveSessions)

			s.Admin(t, http.MethodPost, "/api/v1/admins/bob/disable", map[string]any{}, http.StatusOK, &out)
			require.Zero(t, out.SessionsEnded, "again: nothing more to end")
		})
		t.Run("Refusals", func(t *testing.T) {
			s.Problem(t, http.MethodPost, "/api/v1/admins/"+apitest.AdminUsername+"/disable", nil, s.AdminToken,
				http.StatusConflict, "self_disable")
			for _, path := range []string{"/api/v1/admins/nobody", "/api/v1/admins/nobody/disable",
				"/api/v1/admins/nobody/enable", "/api/v1/admins/nobody/sign-out"} {
				method := http.MethodPost
				if path == "/api/v1/admins/nobody" {
					method = http.MethodGet
				}
				s.Problem(t, method, path, nil, s.AdminToken, http.StatusNotFound, "not_found")
			}
			s.Problem(t, http.MethodPost, "/api/v1/admins/bob/enable", map[string]any{"now": true}, s.AdminToken,
				http.StatusBadRequest, "invalid_json")
		})
		t.Run("EnableBringsTheTokenBack", func(t *testing.T) {
			var out adminJSON
			s.Admin(t, http.MethodPost, "/api/v1/admins/bob/enable", nil, http.StatusOK, &out)
			require.Nil(t, out.DisabledAt)
			s.JSON(t, http.MethodGet, "/api/v1/whoami", nil, tok.Token, http.StatusOK, nil)
			status, _ := asCookie(t, s, browser.cookie, http.MethodGet, "/api/v1/whoami", nil)
			require.Equal(t, http.StatusUnauthorized, status, "an ended session stays ended")
		})
		t.Run("SignOutEndsSessionsOnly", func(t *testing.T) {
			one, two := signInAs(t, s, "bob", bobPassword), signInAs(t, s, "bob", bobPassword)
			var out adminJSON
			s.Admin(t, http.MethodPost, "/api/v1/admins/bob/sign-out", nil, http.StatusOK, &out)
			require.EqualValues(t, 2, out.SessionsEnded)
			for _, u := range []*consoleUser{one, two} {
				status, _ := asCookie(t, s, u.cookie, http.MethodGet, "/api/v1/whoami", nil)
				require.Equal(t, http.StatusUnauthorized, status)
			}
			s.JSON(t, http.MethodGet, "/api/v1/whoami", nil, tok.Token, http.StatusOK, nil)
		})
		t.Run("PackageHostsMayNot", func(t *testing.T) {
			var host struct {
				Token string `json:"token"`
			}
			s.Admin(t, http.MethodPost, "/api/v1/package-hosts", map[string]any{"name": "ci", "families": []string{"nodes"}},
				http.StatusCreated, &host)
			s.Problem(t, http.MethodPost, "/api/v1/admins/bob/disable", nil, host.Token, http.StatusForbidden, "permission_denied")
			s.Problem(t, http.MethodGet, "/api/v1/admins", nil, host.Token, http.StatusForbidden, "permission_denied")
		})

		var audit auditJSON
		s.Admin(t, http.MethodGet, "/api/v1/admin-audit", nil, http.StatusOK, &audit)
		var seen []string
		for i := len(audit.Entries) - 1; i >= 0; i-- {
			if e := audit.Entries[i]; e.Target == "bob" {
				require.Equal(t, apitest.AdminUsername, e.Actor)
				seen = append(seen, e.Action)
			}
		}
		require.Equal(t, []string{"admin.create", "admin.disable", "admin.enable", "admin.sign_out"}, seen)
		_, _, rawAudit := s.Do(t, http.MethodGet, "/api/v1/admin-audit", nil, s.AdminToken)
		require.NotContains(t, string(rawAudit), bobPassword)
	})
}

// TestChangeOwnPassword: the password changes and every console session
// of the administrator ends (a stolen cookie dies with the old password).
func TestChangeOwnPassword(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		here, there := signIn(t, s), signIn(t, s)
		const next = "a-brand-new-passphrase"
		before := rowCounts(t, s)
		status, raw := asCookie(t, s, here.cookie, http.MethodPost, "/api/v1/account/password",
			map[string]string{"current_password": "not-the-password", "new_password": next})
		p := apitest.RequireProblem(t, status, http.Header{"Content-Type": {"application/problem+json"}}, raw,
			http.StatusUnprocessableEntity, "validation_failed")
		require.Equal(t, "current_password", p.Errors[0].Field)
		require.NotContains(t, p.Raw, "not-the-password")
		require.NotContains(t, p.Raw, next)
		after := rowCounts(t, s)
		require.Equal(t, before[0], after[0])
		require.Equal(t, before[2], after[2])

		status, raw = asCookie(t, s, here.cookie, http.MethodPost, "/api/v1/account/password",
			map[string]string{"current_password": apitest.AdminPassword, "new_password": next})
		require.Equal(t, http.StatusOK, status, "%s", raw)
		var out struct {
			Username      string `json:"username"`
			SessionsEnded int64  `json:"sessions_ended"`
		}
		require.NoError(t, json.Unmarshal(raw, &out))
		require.Equal(t, apitest.AdminUsername, out.Username)
		require.EqualValues(t, 2, out.SessionsEnded)

		for _, u := range []*consoleUser{here, there} {
			status, _ = asCookie(t, s, u.cookie, http.MethodGet, "/api/v1/whoami", nil)
			require.Equal(t, http.StatusUnauthorized, status, "every session ended, the asking one too")
		}
		s.Admin(t, http.MethodGet, "/api/v1/whoami", nil, http.StatusOK, nil) // API tokens are untouched
		signInAs(t, s, apitest.AdminUsername, next)
		require.NotNil(t, listedAdmin(t, s, apitest.AdminUsername).PasswordChangedAt)
	})
}

// TestAdministratorBodies: every new administrators' POST refuses a body
// that is not the JSON it takes, as problem+json, changing nothing.
func TestAdministratorBodies(t *testing.T) {
	t.Parallel()
	s := apitest.Start(t)
	s.Admin(t, http.MethodPost, "/api/v1/admins", map[string]string{"username": "bob", "password": "bobs-long-password"},
		http.StatusCreated, nil)
	paths := []string{"/api/v1/admins", "/api/v1/admins/bob/disable", "/api/v1/admins/bob/enable",
		"/api/v1/admins/bob/sign-out", "/api/v1/account/password"}
	before := rowCounts(t, s)
	for _, path := range paths {
		for _, c := range []struct {
			body   apitest.Body
			status int
			code   string
		}{
			{apitest.Raw(`{`), http.StatusBadRequest, "invalid_json"},
			{apitest.Raw(`{} {}`), http.StatusBadRequest, "invalid_json"},
			{apitest.Raw(`{"surprise": 1}`), http.StatusBadRequest, "invalid_json"},
			{apitest.Raw(`[]`), http.StatusBadRequest, "invalid_json"},
			{apitest.Body{ContentType: "text/plain", Data: []byte(`{}`)}, http.StatusUnsupportedMediaType, "unsupported_media_type"},
		} {
			p := s.Problem(t, http.MethodPost, path, c.body, s.AdminToken, c.status, c.code)
			require.NotContains(t, p.Raw, "bobs-long-password", path)
		}
	}
	s.Problem(t, http.MethodPost, "/api/v1/account/password", apitest.Raw(`{"current_password": 7, "new_password": "x"}`),
		s.AdminToken, http.StatusBadRequest, "invalid_json")
	require.Equal(t, before, rowCounts(t, s), "a refused body changes nothing")
	require.Nil(t, listedAdmin(t, s, "bob").DisabledAt)
}
