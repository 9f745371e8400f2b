package handlers_test

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/internal/tally"
	"github.com/nodeward/nodeward/keys"
)

// forger mints tokens the way an attacker would try to: with the server's
// own subkeys (as if one leaked into the wrong family), a guessed key, no
// signature, or another algorithm.
type forger struct {
	t    *testing.T
	ring *keys.Ring
}

func (f forger) sign(method jwt.SigningMethod, header map[string]any, claims jwt.MapClaims, key any) string {
	f.t.Helper()
	tok := jwt.NewWithClaims(method, claims)
	for k, v := range header {
		tok.Header[k] = v
	}
	s, err := tok.SignedString(key)
	require.NoError(f.t, err)
	return s
}

// hs signs HS256 with the current subkey of label.
func (f forger) hs(label, typ string, claims jwt.MapClaims) string {
	f.t.Helper()
	sk, err := f.ring.Current(label)
	require.NoError(f.t, err)
	return f.sign(jwt.SigningMethodHS256, map[string]any{"kid": sk.ID, "typ": typ}, claims, sk.Key)
}

// none is an unsigned token (alg "none") with the family's header.
func (f forger) none(typ string, claims jwt.MapClaims) string {
	f.t.Helper()
	return f.sign(jwt.SigningMethodNone, map[string]any{"typ": typ}, claims, jwt.UnsafeAllowNoneSignatureType)
}

// sessionClaims are a node session's claims for node at fencing, valid now.
func sessionClaims(node string, fencing int64, mutate func(jwt.MapClaims)) jwt.MapClaims {
	now := time.Now()
	c := jwt.MapClaims{"jti": "forged", "sub": node, "aud": []string{"nodeward-node"}, "iat": now.Unix(), "exp": now.Add(time.Hour).Unix(), "fen": fencing}
	if mutate != nil {
		mutate(c)
	}
	return c
}

// TestTokenForgery tries forged, misused and stale credentials at every
// door — the agent API's session doors, enrollment, the admin API and the
// console — and checks each is refused with its documented code, and that
// no token tried ever reaches the server's log.
func TestTokenForgery(t *testing.T) {
	t.Parallel()
	log := &apitest.LogBuffer{}
	s := apitest.Start(t, apitest.WithLog(log))
	f := forger{t: t, ring: s.App.Keys}
	boot, enrolled := inviteAndEnroll(t, s)
	otherBoot, other := inviteAndEnroll(t, s)
	node, fen := boot.NodeID, enrolled.FencingToken
	var tried []string // every credential sent, to grep the log for

	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	sk, err := s.App.Keys.Current(keys.LabelNodeSession)
	require.NoError(t, err)

	// Credentials that must never open an agent session door.
	forgedSessions := map[string]string{
		"alg none": f.none("node+jwt", sessionClaims(node, fen, nil)),
		"HS256 with a guessed key": f.sign(jwt.SigningMethodHS256, map[string]any{"kid": sk.ID, "typ": "node+jwt"},
			sessionClaims(node, fen, nil), []byte("secret")),
		"HS256 with the console key":    f.hs(keys.LabelConsoleSession, "node+jwt", sessionClaims(node, fen, nil)),
		"HS256 with the enrollment key": f.hs(keys.LabelNodeEnrollment, "node+jwt", sessionClaims(node, fen, nil)),
		"RS256 signed by an outside key": f.sign(jwt.SigningMethodRS256, map[string]any{"kid": sk.ID, "typ": "node+jwt"},
			sessionClaims(node, fen, nil), rsaKey),
		// RS/HS confusion: an HS256 token whose key is a public key the
		// attacker knows; the server has no public keys, so none is right.
		"HS256 keyed with a public key": f.sign(jwt.SigningMethodHS256, map[string]any{"kid": sk.ID, "typ": "node+jwt"},
			sessionClaims(node, fen, nil), []byte(fmt.Sprint(rsaKey.PublicKey.N))),
		"wrong typ":      f.hs(keys.LabelNodeSession, "enroll+jwt", sessionClaims(node, fen, nil)),
		"wrong audience": f.hs(keys.LabelNodeSession, "node+jwt", sessionClaims(node, fen, func(c jwt.MapClaims) { c["aud"] = []string{"nodeward-console"} })),
		"expired": f.hs(keys.LabelNodeSession, "node+jwt", sessionClaims(node, fen, func(c jwt.MapClaims) {
			c["iat"], c["exp"] = time.Now().Add(-2*time.Hour).Unix(), time.Now().Add(-time.Minute).Unix()
		})),
		"not yet valid":               f.hs(keys.LabelNodeSession, "node+jwt", sessionClaims(node, fen, func(c jwt.MapClaims) { c["nbf"] = time.Now().Add(time.Hour).Unix() })),
		"issued in the future":        f.hs(keys.LabelNodeSession, "node+jwt", sessionClaims(node, fen, func(c jwt.MapClaims) { c["iat"] = time.Now().Add(time.Hour).Unix() })),
		"no expiry":                   f.hs(keys.LabelNodeSession, "node+jwt", sessionClaims(node, fen, func(c jwt.MapClaims) { delete(c, "exp") })),
		"unknown node":                f.hs(keys.LabelNodeSession, "node+jwt", sessionClaims("no-such-node", 1, nil)),
		"no fencing token":            f.hs(keys.LabelNodeSession, "node+jwt", sessionClaims(node, 0, nil)),
		"enrollment token as session": boot.EnrollmentToken,
		"admin API token as session":  s.AdminToken,
		"tampered payload":            tamper(t, enrolled.SessionToken, func(c map[string]any) { c["sub"] = otherBoot.NodeID }),
		"truncated signature":         enrolled.SessionToken[:len(enrolled.SessionToken)-4],
	}
	agentDoors := []struct{ method, path, body string }{
		{http.MethodPost, "/agent/v1/session/renew", `{}`},
		{http.MethodGet, "/agent/v1/commands?wait=0", ""},
		{http.MethodPost, "/agent/v1/results", `{"results":[]}`},
		{http.MethodPost, "/agent/v1/events", `{"events":[]}`},
		{http.MethodPost, "/agent/v1/output", `{"run_id":"r","attempt_id":"a","stdout_tail":"","stderr_tail":"","truncated":false}`},
	}
	send := func(method, path, body, auth string) (int, http.Header, []byte) {
		var b any
		if body != "" {
			b = apitest.Raw(body)
		}
		req := s.NewRequest(t, method, path, b, "")
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		return s.Send(t, req)
	}
	for name, tok := range forgedSessions {
		tried = append(tried, tok)
		for _, d := range agentDoors {
			t.Run("agent/"+name+d.path, func(t *testing.T) {
				status, h, raw := send(d.method, d.path, d.body, tok)
				apitest.RequireProblem(t, status, h, raw, http.StatusUnauthorized, "session_invalid")
				tally.Record("token forgery", status, "session_invalid")
			})
		}
		if tok == s.AdminToken {
			continue // a real API token is a principal at the admin API
		}
		// The same credential at the admin API is no principal either.
		status, h, raw := send(http.MethodGet, "/api/v1/nodes", "", tok)
		apitest.RequireProblem(t, status, h, raw, http.StatusUnauthorized, "unauthenticated")
		tally.Record("token forgery", status, "unauthenticated")
	}

	// Another node's session is that node, never this one: its results for
	// this node's command are refused and settle nothing.
	s.Admin(t, http.MethodPost, "/api/v1/nodes/"+node+"/commands", map[string]any{"kind": api.KindStopWorkload, "operation_id": "forgery-cmd",
		"payload": map[string]any{"run_id": "r", "attempt_id": "a", "grace_seconds": 1}}, http.StatusCreated, nil)
	status, _, raw := send(http.MethodPost, "/agent/v1/results", `{"results":[{"operation_id":"forgery-cmd","applied":true}]}`, other.SessionToken)
	tally.Record("token forgery", status, problemCode(raw))
	var cmd struct {
		State string `json:"state"`
	}
	s.Admin(t, http.MethodGet, "/api/v1/commands/forgery-cmd", nil, http.StatusOK, &cmd)
	require.Equal(t, "pending", cmd.State, "another node's session settled this node's command (answer %d %s)", status, raw)

	// Enrollment: a replayed token is spent; after a reinvite the old
	// session is fenced at every door and the superseded token refused.
	enroll := func(b api.Bootstrap) (int, http.Header, []byte) {
		body, err := json.Marshal(api.EnrollRequest{NodeID: b.NodeID, Generation: 1, EnrollmentToken: b.EnrollmentToken, AgentVersion: "0.0.0-test", Facts: agentFacts()})
		require.NoError(t, err)
		return send(http.MethodPost, "/agent/v1/enroll", string(body), "")
	}
	status, h, raw := enroll(boot)
	apitest.RequireProblem(t, status, h, raw, http.StatusConflict, "enrollment_spent")
	tally.Record("token forgery", status, "enrollment_spent")
	forgedEnroll := boot
	forgedEnroll.EnrollmentToken = f.none("enroll+jwt", jwt.MapClaims{"jti": "x", "sub": node, "aud": []string{"nodeward-enroll"}, "gen": 1,
		"iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix()})
	tried = append(tried, forgedEnroll.EnrollmentToken)
	status, h, raw = enroll(forgedEnroll)
	apitest.RequireProblem(t, status, h, raw, http.StatusUnauthorized, "enrollment_invalid")
	tally.Record("token forgery", status, "enrollment_invalid")

	var first, second api.Bootstrap
	s.Admin(t, http.MethodPost, "/api/v1/nodes/"+node+"/reinvite", map[string]any{}, http.StatusOK, &first)
	s.Admin(t, http.MethodPost, "/api/v1/nodes/"+node+"/reinvite", map[string]any{}, http.StatusOK, &second)
	tried = append(tried, first.EnrollmentToken, second.EnrollmentToken)
	if first.EnrollmentToken != second.EnrollmentToken {
		status, h, raw = enroll(first)
		apitest.RequireProblem(t, status, h, raw, http.StatusConflict, "enrollment_superseded")
		tally.Record("token forgery", status, "enrollment_superseded")
	}
	// The reinvite race: two machines redeem the fresh token at once; one
	// wins, the other is told it is spent.
	var wg sync.WaitGroup
	statuses := make([]int, 2)
	codes := make([]string, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, _, raw := enroll(second)
			statuses[i], codes[i] = st, problemCode(raw)
		}()
	}
	wg.Wait()
	require.ElementsMatch(t, []int{http.StatusOK, http.StatusConflict}, statuses, "codes %v", codes)
	for i := range 2 {
		tally.Record("token forgery", statuses[i], codes[i])
	}
	for _, d := range agentDoors {
		status, h, raw := send(d.method, d.path, d.body, enrolled.SessionToken)
		apitest.RequireProblem(t, status, h, raw, http.StatusConflict, "fenced")
		tally.Record("token forgery", status, "fenced")
	}
	tried = append(tried, enrolled.SessionToken, other.SessionToken, boot.EnrollmentToken)

	// Console: forged session cookies lead back to the sign-in page.
	consoleForged := map[string]string{
		"alg none": f.none("console+jwt", jwt.MapClaims{"jti": "x", "sub": s.AdminUserID, "aud": []string{"nodeward-console"},
			"iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix()}),
		"node key": f.hs(keys.LabelNodeSession, "console+jwt", jwt.MapClaims{"jti": "x", "sub": s.AdminUserID, "aud": []string{"nodeward-console"},
			"iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix()}),
		"right key, no session row": f.hs(keys.LabelConsoleSession, "console+jwt", jwt.MapClaims{"jti": "no-such-session", "sub": s.AdminUserID,
			"aud": []string{"nodeward-console"}, "iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix()}),
		"node session as cookie": other.SessionToken,
	}
	for name, cookie := range consoleForged {
		tried = append(tried, cookie)
		req := s.NewRequest(t, http.MethodGet, "/console/tokens", nil, "")
		req.AddCookie(&http.Cookie{Name: "nodeward_session", Value: cookie})
		status, h, _ := s.Send(t, req)
		require.Equal(t, http.StatusSeeOther, status, name)
		require.True(t, strings.HasPrefix(h.Get("Location"), "/console/login"), "%s: Location %q", name, h.Get("Location"))
		tally.Record("token forgery", status, "console_redirect_login")
	}

	for _, tok := range tried {
		require.NotContains(t, log.String(), tok, "a credential reached the log")
		// Nor its signature alone (a log that cut the token would still leak it).
		if i := strings.LastIndexByte(tok, '.'); i > 0 && len(tok)-i > 16 {
			require.NotContains(t, log.String(), tok[i+1:], "a credential's signature reached the log")
		}
	}
	require.NotEmpty(t, log.String(), "the server logged the refusals")
}

// tamper rewrites a JWT's claims keeping its header and signature.
func tamper(t *testing.T, tok string, fn func(map[string]any)) string {
	t.Helper()
	parts := strings.Split(tok, ".")
	require.Len(t, parts, 3)
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	require.NoError(t, err)
	var c map[string]any
	require.NoError(t, json.Unmarshal(raw, &c))
	fn(c)
	b, err := json.Marshal(c)
	require.NoError(t, err)
	return parts[0] + "." + base64.RawURLEncoding.EncodeToString(b) + "." + parts[2]
}

func problemCode(raw []byte) string {
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(raw, &p)
	return p.Code
}

// TestConsoleSessionFixationAndBruteForce: a session cookie an attacker
// planted before sign-in is not the one the sign-in answers, and it opens
// nothing afterwards; repeated wrong passwords are rate limited, and the
// right password is refused too while the limit holds.
func TestConsoleSessionFixationAndBruteForce(t *testing.T) {
	t.Parallel()
	s := apitest.Start(t)
	planted := "attacker-chosen-session-value"
	post := func(form url.Values, cookie string) (int, http.Header) {
		req := s.NewRequest(t, http.MethodPost, "/console/login", apitest.Body{ContentType: "application/x-www-form-urlencoded", Data: []byte(form.Encode())}, "")
		if cookie != "" {
			req.AddCookie(&http.Cookie{Name: "nodeward_session", Value: cookie})
		}
		status, h, _ := s.Send(t, req)
		return status, h
	}
	status, h := post(url.Values{"username": {apitest.AdminUsername}, "password": {apitest.AdminPassword}}, planted)
	require.Equal(t, http.StatusSeeOther, status)
	got := (&http.Response{Header: h}).Cookies()
	var fresh string
	for _, c := range got {
		if c.Name == "nodeward_session" {
			fresh = c.Value
		}
	}
	require.NotEmpty(t, fresh, "sign-in sets a session cookie")
	require.NotEqual(t, planted, fresh, "the planted cookie was kept (session fixation)")
	req := s.NewRequest(t, http.MethodGet, "/console/tokens", nil, "")
	req.AddCookie(&http.Cookie{Name: "nodeward_session", Value: planted})
	status, _, _ = s.Send(t, req)
	require.Equal(t, http.StatusSeeOther, status, "the planted cookie opens nothing")
	tally.Record("console", status, "fixation_refused")

	// Brute force: wrong passwords until the limiter answers.
	limited := false
	for i := range 50 {
		status, _ := post(url.Values{"username": {apitest.AdminUsername}, "password": {fmt.Sprintf("guess-%d", i)}}, "")
		tally.Record("console brute force", status, http.StatusText(status))
		if status == http.StatusTooManyRequests {
			limited = true
			break
		}
		require.Equal(t, http.StatusUnauthorized, status)
	}
	require.True(t, limited, "50 wrong passwords in a row were never rate limited")
	status, _ = post(url.Values{"username": {apitest.AdminUsername}, "password": {apitest.AdminPassword}}, "")
	require.Equal(t, http.StatusTooManyRequests, status, "the right password while limited")
}
