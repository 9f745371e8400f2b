package handlers_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/apitest"
)

func agentFacts() api.Facts {
	free := int64(5 << 30)
	return api.Facts{Hostname: "h", OS: "linux", Arch: "amd64", CPUs: 2, MemoryBytes: 1 << 30, DiskFreeBytes: &free,
		AgentVersion: "0.0.0-test", Runtimes: []string{"process"}, ObservedAt: time.Now().UTC().Truncate(time.Second)}
}

// inviteAndEnroll answers a bootstrap and the enrollment of it, over HTTP.
func inviteAndEnroll(t *testing.T, s *apitest.Server) (api.Bootstrap, api.EnrollResponse) {
	t.Helper()
	var boot api.Bootstrap
	s.Admin(t, "POST", "/api/v1/nodes/invitations", map[string]any{"rental_id": apitest.RandomID("r"), "generation": 1}, http.StatusCreated, &boot)
	var resp api.EnrollResponse
	s.JSON(t, "POST", "/agent/v1/enroll", api.EnrollRequest{NodeID: boot.NodeID, Generation: 1,
		EnrollmentToken: boot.EnrollmentToken, AgentVersion: "0.0.0-test", Facts: agentFacts()}, "", http.StatusOK, &resp)
	return boot, resp
}

func TestNodesHTTP(t *testing.T) {
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		price := 0.75
		var boot api.Bootstrap
		s.Admin(t, "POST", "/api/v1/nodes/invitations", map[string]any{
			"node_id": "node-http-1", "rental_id": "rent-1", "generation": 1, "shadow_price_usd_per_hour": price,
			"redeemable_through": time.Now().Add(time.Hour).UTC().Format(time.RFC3339),
			"purchase":           map[string]any{"billing_interval_seconds": 3600, "eligible_classes": []string{"batch"}},
		}, http.StatusCreated, &boot)
		require.Equal(t, "node-http-1", boot.NodeID)
		require.Equal(t, s.URL, boot.ControlPlaneURL)

		s.Problem(t, "POST", "/api/v1/nodes/invitations", map[string]any{"node_id": "node-http-1", "rental_id": "rent-x", "generation": 1}, s.AdminToken, 409, "identity_exists")
		s.Problem(t, "POST", "/api/v1/nodes/invitations", map[string]any{"rental_id": "rent-1", "generation": 0}, s.AdminToken, 422, "validation_failed")
		s.Problem(t, "POST", "/api/v1/nodes/invitations", map[string]any{"rental_id": "rent-1", "generation": 1, "redeemable_through": "tomorrow"}, s.AdminToken, 422, "validation_failed")
		s.Problem(t, "POST", "/api/v1/nodes/invitations", apitest.Raw(`{"rental_id":"r","generation":1,"surprise":true}`), s.AdminToken, 400, "invalid_json")

		var again api.Bootstrap
		s.Admin(t, "POST", "/api/v1/nodes/node-http-1/reinvite", map[string]any{"redeemable_through": time.Now().Add(30 * time.Minute).UTC().Format(time.RFC3339)}, http.StatusOK, &again)
		require.Equal(t, boot.EnrollmentToken, again.EnrollmentToken, "still good through the wait: handed back unchanged")

		s.Problem(t, "POST", "/agent/v1/enroll", api.EnrollRequest{NodeID: boot.NodeID, Generation: 1, EnrollmentToken: boot.EnrollmentToken,
			AgentVersion: "0.0.0-test", Facts: agentFacts(), EnrollmentNonce: "too-short"}, "", 422, "validation_failed")
		var enrolled api.EnrollResponse
		s.JSON(t, "POST", "/agent/v1/enroll", api.EnrollRequest{NodeID: boot.NodeID, Generation: 1, EnrollmentToken: boot.EnrollmentToken,
			AgentVersion: "0.0.0-test", Facts: agentFacts()}, "", http.StatusOK, &enrolled)
		s.Problem(t, "POST", "/agent/v1/enroll", api.EnrollRequest{NodeID: boot.NodeID, Generation: 1, EnrollmentToken: boot.EnrollmentToken,
			AgentVersion: "0.0.0-test", Facts: agentFacts()}, "", 409, "enrollment_spent")

		var node map[string]any
		s.Admin(t, "GET", "/api/v1/nodes/node-http-1", nil, http.StatusOK, &node)
		require.Equal(t, "ready", node["state"])
		require.Equal(t, "measured", node["disk"].(map[string]any)["state"])
		require.Equal(t, 0.75, node["shadow_price_usd_per_hour"])

		var list struct {
			Nodes      []map[string]any `json:"nodes"`
			NextBefore *string          `json:"next_before"`
		}
		s.Admin(t, "GET", "/api/v1/nodes?state=ready", nil, http.StatusOK, &list)
		require.Len(t, list.Nodes, 1)
		s.Problem(t, "GET", "/api/v1/nodes?state=sleepy", nil, s.AdminToken, 400, "invalid_parameter")
		s.Problem(t, "GET", "/api/v1/nodes?before=bm9zZXA", nil, s.AdminToken, 400, "invalid_parameter")

		var offers struct {
			Offers []map[string]any `json:"offers"`
		}
		s.Admin(t, "GET", "/api/v1/offers?class=batch&min_free_disk_bytes=1", nil, http.StatusOK, &offers)
		require.Len(t, offers.Offers, 1)
		require.NotNil(t, offers.Offers[0]["committed_until"])
		s.Problem(t, "GET", "/api/v1/offers?until=soon", nil, s.AdminToken, 400, "invalid_parameter")

		var wl map[string]any
		s.Admin(t, "GET", "/api/v1/nodes/node-http-1/workloads/run-1/a1", nil, http.StatusOK, &wl)
		require.Equal(t, "absent", wl["state"])

		var rec map[string]any
		s.Admin(t, "GET", "/api/v1/nodes/node-http-1/reconciliation", nil, http.StatusOK, &rec)
		s.Problem(t, "GET", "/api/v1/nodes/missing", nil, s.AdminToken, 404, "not_found")

		s.Admin(t, "POST", "/api/v1/nodes/node-http-1/retire", nil, http.StatusOK, &node)
		require.Equal(t, "retired", node["state"])
		s.Admin(t, "POST", "/api/v1/nodes/node-http-1/retire", map[string]any{}, http.StatusOK, &node)
		s.Problem(t, "POST", "/api/v1/nodes/node-http-1/reinvite", nil, s.AdminToken, 410, "node_retired")
		s.Problem(t, "POST", "/agent/v1/session/renew", nil, enrolled.SessionToken, 410, "node_retired")
		s.Problem(t, "GET", "/agent/v1/commands?wait=0", nil, enrolled.SessionToken, 410, "node_retired")
	})
}

func TestCommandsHTTP(t *testing.T) {
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		boot, sess := inviteAndEnroll(t, s)
		path := "/api/v1/nodes/" + boot.NodeID + "/commands"
		body := map[string]any{"kind": "launch_workload", "operation_id": "op-http-1",
			"payload": map[string]any{"run_id": "r1", "attempt_id": "a1", "command": "/bin/true"}}
		var cmd map[string]any
		s.Admin(t, "POST", path, body, http.StatusCreated, &cmd)
		require.Equal(t, "pending", cmd["state"])
		s.Admin(t, "POST", path, body, http.StatusOK, &cmd)
		body["payload"] = map[string]any{"run_id": "r2", "attempt_id": "a1", "command": "/bin/true"}
		s.Problem(t, "POST", path, body, s.AdminToken, 409, "operation_conflict")
		s.Problem(t, "POST", path, map[string]any{"kind": "reboot", "operation_id": "x", "payload": map[string]any{}}, s.AdminToken, 422, "validation_failed")

		var polled api.CommandsResponse
		s.JSON(t, "GET", "/agent/v1/commands?wait=5", nil, sess.SessionToken, http.StatusOK, &polled)
		require.Len(t, polled.Commands, 1)
		require.Equal(t, "op-http-1", polled.Commands[0].OperationID)
		require.Equal(t, sess.FencingToken, polled.Commands[0].FencingToken)
		s.Problem(t, "GET", "/agent/v1/commands?wait=61", nil, sess.SessionToken, 400, "invalid_parameter")

		var settled api.ResultsResponse
		s.JSON(t, "POST", "/agent/v1/results", api.ResultsRequest{Results: []api.Result{{OperationID: "op-http-1", Applied: true}, {OperationID: "ghost", Applied: true}}},
			sess.SessionToken, http.StatusOK, &settled)
		require.Equal(t, []api.Settled{{OperationID: "op-http-1", State: "applied"}, {OperationID: "ghost", Code: "unknown_operation"}}, settled.Settled)

		var events api.EventsResponse
		ev := api.EventsRequest{Events: []api.Event{{ID: "w1", Kind: "workload", ObservedAt: time.Now().UTC(),
			Workload: &api.WorkloadObservation{RunID: "r1", AttemptID: "a1", State: "running", ObservedAt: time.Now().UTC()}}}}
		s.JSON(t, "POST", "/agent/v1/events", ev, sess.SessionToken, http.StatusOK, &events)
		require.Equal(t, api.EventsResponse{Recorded: 1}, events)
		s.JSON(t, "POST", "/agent/v1/events", ev, sess.SessionToken, http.StatusOK, &events)
		require.Equal(t, api.EventsResponse{Duplicates: 1}, events)

		var one map[string]any
		s.Admin(t, "GET", "/api/v1/commands/op-http-1", nil, http.StatusOK, &one)
		require.Equal(t, "applied", one["state"])
		var list map[string][]map[string]any
		s.Admin(t, "GET", path+"?state=applied", nil, http.StatusOK, &list)
		require.Len(t, list["commands"], 1)

		var renewed api.RenewResponse
		s.JSON(t, "POST", "/agent/v1/session/renew", nil, sess.SessionToken, http.StatusOK, &renewed)
		require.NotEqual(t, sess.SessionToken, renewed.SessionToken)
	})
}

// TestPollResumeHTTP: resume=true hands the session again what it was
// delivered and has not settled (the agent may have lost that answer);
// anything but true or false is refused, naming the parameter.
func TestPollResumeHTTP(t *testing.T) {
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		boot, sess := inviteAndEnroll(t, s)
		s.Admin(t, "POST", "/api/v1/nodes/"+boot.NodeID+"/commands", map[string]any{"kind": "launch_workload", "operation_id": "op-resume",
			"payload": map[string]any{"run_id": "r1", "attempt_id": "a1", "command": "/bin/true"}}, http.StatusCreated, nil)
		var polled api.CommandsResponse
		s.JSON(t, "GET", "/agent/v1/commands?wait=0", nil, sess.SessionToken, http.StatusOK, &polled)
		require.Len(t, polled.Commands, 1)
		s.JSON(t, "GET", "/agent/v1/commands?wait=0&resume=false", nil, sess.SessionToken, http.StatusOK, &polled)
		require.Empty(t, polled.Commands, "delivered moments ago: not handed again without resume")
		s.JSON(t, "GET", "/agent/v1/commands?wait=0&resume=true", nil, sess.SessionToken, http.StatusOK, &polled)
		require.Len(t, polled.Commands, 1)
		require.Equal(t, "op-resume", polled.Commands[0].OperationID)

		for _, q := range []string{"resume=yes", "resume=1", "resume=True", "resume=", "resume=true&resume=true", "resume=%00"} {
			p := s.Problem(t, "GET", "/agent/v1/commands?wait=0&"+q, nil, sess.SessionToken, http.StatusBadRequest, "invalid_parameter")
			require.Len(t, p.Errors, 1, q)
			require.Equal(t, "resume", p.Errors[0].Field, q)
		}
		// Refused before anything was claimed: still not due without resume.
		s.JSON(t, "GET", "/agent/v1/commands?wait=0", nil, sess.SessionToken, http.StatusOK, &polled)
		require.Empty(t, polled.Commands)
	})
}

// TestLiveSessionsHTTP: a held long-poll is listed as connected.
func TestLiveSessionsHTTP(t *testing.T) {
	s := apitest.Start(t)
	boot, sess := inviteAndEnroll(t, s)
	done := make(chan int, 1)
	go func() {
		st, _, _ := s.Do(t, "GET", "/agent/v1/commands?wait=30", nil, sess.SessionToken)
		done <- st
	}()
	var live struct {
		Sessions []map[string]any `json:"sessions"`
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(live.Sessions) == 0 {
		require.True(t, time.Now().Before(deadline), "long-poll never listed")
		s.Admin(t, "GET", "/api/v1/sessions", nil, http.StatusOK, &live)
	}
	require.Equal(t, boot.NodeID, live.Sessions[0]["node_id"])
	require.Equal(t, "apitest", live.Sessions[0]["replica"])
	// Issuing a command answers the held poll at once.
	s.Admin(t, "POST", "/api/v1/nodes/"+boot.NodeID+"/commands", map[string]any{"kind": "stop_workload", "operation_id": "stop-1",
		"payload": map[string]any{"run_id": "r", "attempt_id": "a", "grace_seconds": 5}}, http.StatusCreated, nil)
	select {
	case st := <-done:
		require.Equal(t, http.StatusOK, st)
	case <-time.After(20 * time.Second):
		t.Fatal("held poll was not woken by the command")
	}
}

// TestTokenAttacks: each forged or misused credential is refused with the
// right code, and the answer names no secret.
func TestTokenAttacks(t *testing.T) {
	s := apitest.Start(t)
	boot, sess := inviteAndEnroll(t, s)
	other, otherSess := inviteAndEnroll(t, s)
	_ = other

	claims := func(tok string) map[string]any {
		parts := strings.Split(tok, ".")
		b, err := base64.RawURLEncoding.DecodeString(parts[1])
		require.NoError(t, err)
		var c map[string]any
		require.NoError(t, json.Unmarshal(b, &c))
		return c
	}
	c := claims(sess.SessionToken)

	none, err := jwt.NewWithClaims(jwt.SigningMethodNone, jwt.MapClaims(c)).SignedString(jwt.UnsafeAllowNoneSignatureType)
	require.NoError(t, err)
	otherKey := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims(c))
	otherKey.Header["kid"] = "whatever"
	otherKey.Header["typ"] = "node+jwt"
	forged, err := otherKey.SignedString(bytes.Repeat([]byte{1}, 32))
	require.NoError(t, err)
	expired := jwt.MapClaims(claims(sess.SessionToken))
	expired["exp"] = time.Now().Add(-time.Hour).Unix()
	expiredTok := jwt.NewWithClaims(jwt.SigningMethodHS256, expired)
	expiredTok.Header["typ"] = "node+jwt"
	expiredSigned, _ := expiredTok.SignedString(bytes.Repeat([]byte{1}, 32))

	for name, tok := range map[string]string{
		"AlgNone":                  none,
		"OtherKey":                 forged,
		"Expired":                  expiredSigned,
		"EnrollmentTokenAsSession": boot.EnrollmentToken,
		"Garbage":                  "not-a-jwt",
		"AdminTokenAsSession":      s.AdminToken,
	} {
		t.Run(name, func(t *testing.T) {
			p := s.Problem(t, "GET", "/agent/v1/commands?wait=0", nil, tok, 401, "session_invalid")
			require.NotContains(t, p.Detail, tok)
		})
	}
	t.Run("SessionAsAdminToken", func(t *testing.T) {
		s.Problem(t, "GET", "/api/v1/nodes", nil, sess.SessionToken, 401, "unauthenticated")
	})
	t.Run("SessionOfAnotherNodeSettlesNothingOfThisOne", func(t *testing.T) {
		s.Admin(t, "POST", "/api/v1/nodes/"+boot.NodeID+"/commands", map[string]any{"kind": "stop_workload", "operation_id": "mine-1",
			"payload": map[string]any{"run_id": "r", "attempt_id": "a", "grace_seconds": 1}}, http.StatusCreated, nil)
		var settled api.ResultsResponse
		s.JSON(t, "POST", "/agent/v1/results", api.ResultsRequest{Results: []api.Result{{OperationID: "mine-1", Applied: true}}},
			otherSess.SessionToken, http.StatusOK, &settled)
		require.Equal(t, "not_this_node", settled.Settled[0].Code)
		var polled api.CommandsResponse
		s.JSON(t, "GET", "/agent/v1/commands?wait=0", nil, otherSess.SessionToken, http.StatusOK, &polled)
		require.Empty(t, polled.Commands)
	})
	t.Run("OldFencingToken", func(t *testing.T) {
		var fresh api.Bootstrap
		s.Admin(t, "POST", "/api/v1/nodes/"+boot.NodeID+"/reinvite", nil, http.StatusOK, &fresh)
		s.JSON(t, "POST", "/agent/v1/enroll", api.EnrollRequest{NodeID: boot.NodeID, Generation: 1, EnrollmentToken: fresh.EnrollmentToken,
			AgentVersion: "x", Facts: agentFacts()}, "", http.StatusOK, nil)
		for _, path := range []string{"/agent/v1/commands?wait=0"} {
			s.Problem(t, "GET", path, nil, sess.SessionToken, 409, "fenced")
		}
		s.Problem(t, "POST", "/agent/v1/results", api.ResultsRequest{Results: []api.Result{}}, sess.SessionToken, 409, "fenced")
		s.Problem(t, "POST", "/agent/v1/session/renew", nil, sess.SessionToken, 409, "fenced")
	})
	t.Run("ReplayedEnrollment", func(t *testing.T) {
		p := s.Problem(t, "POST", "/agent/v1/enroll", api.EnrollRequest{NodeID: boot.NodeID, Generation: 1, EnrollmentToken: boot.EnrollmentToken,
			AgentVersion: "x", Facts: agentFacts()}, "", 409, "enrollment_spent")
		require.NotContains(t, p.Detail, boot.EnrollmentToken)
	})
	t.Run("MissingSession", func(t *testing.T) {
		s.Problem(t, "POST", "/agent/v1/events", api.EventsRequest{}, "", 401, "session_invalid")
	})
	t.Run("TwoAuthorizationHeaders", func(t *testing.T) {
		// Two credentials name no one principal: refused whichever is
		// good, never the first one taken.
		twice := func(path, first, second string) (int, http.Header, []byte) {
			req := s.NewRequest(t, http.MethodGet, path, nil, first)
			req.Header.Add("Authorization", "Bearer "+second)
			return s.Send(t, req)
		}
		status, h, raw := twice("/api/v1/whoami", s.AdminToken, "not-a-token")
		apitest.RequireProblem(t, status, h, raw, http.StatusUnauthorized, "unauthenticated")
		status, h, raw = twice("/api/v1/whoami", s.AdminToken, s.AdminToken)
		apitest.RequireProblem(t, status, h, raw, http.StatusUnauthorized, "unauthenticated")
		status, h, raw = twice("/agent/v1/commands?wait=0", otherSess.SessionToken, otherSess.SessionToken)
		apitest.RequireProblem(t, status, h, raw, http.StatusUnauthorized, "session_invalid")
	})
}

// fuzzServer answers agent requests straight through the real handler.
func fuzzServer(f *testing.F) (*apitest.Server, string) {
	s := apitest.Start(f)
	var boot api.Bootstrap
	s.Admin(f, "POST", "/api/v1/nodes/invitations", map[string]any{"rental_id": "fuzz", "generation": 1}, http.StatusCreated, &boot)
	var resp api.EnrollResponse
	s.JSON(f, "POST", "/agent/v1/enroll", api.EnrollRequest{NodeID: boot.NodeID, Generation: 1, EnrollmentToken: boot.EnrollmentToken,
		AgentVersion: "x", Facts: agentFacts()}, "", http.StatusOK, &resp)
	return s, resp.SessionToken
}

func fuzzPost(s *apitest.Server, path, token string, body []byte) fuzzExchange {
	req := httptest.NewRequest("POST", path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return fuzzServe(s, req, body)
}

// fuzzExchange is one fuzzed request, its body, and the answer.
type fuzzExchange struct {
	req  *http.Request
	body []byte
	rec  *httptest.ResponseRecorder
}

// fuzzServe serves req (whose body is body) through the server's handler.
func fuzzServe(s *apitest.Server, req *http.Request, body []byte) fuzzExchange {
	x := fuzzExchange{req: req.Clone(req.Context()), body: body, rec: httptest.NewRecorder()}
	s.App.Handler.ServeHTTP(x.rec, req)
	return x
}

// checkFuzzAnswer: outside input never causes a server error, every
// refusal is a problem document, and whatever the server accepts
// openapi.yaml accepts too (a script generated from the contract can send
// it). The one 5xx outside input may earn is 501 kind_not_served: a kind
// nobody serves is the caller's mistake, and API.md answers it so.
func checkFuzzAnswer(t *testing.T, x fuzzExchange) {
	rec := x.rec
	var p map[string]any
	if rec.Code >= 400 {
		require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &p))
		require.NotEmpty(t, p["code"])
	}
	if rec.Code >= 500 && !(rec.Code == http.StatusNotImplemented && p["code"] == "kind_not_served") {
		t.Fatalf("status %d: %s", rec.Code, rec.Body.String())
	}
	if rec.Code < 300 {
		req := x.req.Clone(x.req.Context())
		req.Body = io.NopCloser(bytes.NewReader(x.body))
		if len(bytes.TrimSpace(x.body)) == 0 {
			// White space only is no body, for the doors whose body is
			// optional (decodeJSON); the others refuse it.
			req.Body, req.ContentLength = http.NoBody, 0
		}
		if err := apitest.ProductContract(t).CheckRequest(req); err != nil {
			t.Fatalf("the server answered %d to a request the contract refuses: %v\n%s %s\n%s", rec.Code, err, req.Method, req.URL, x.body)
		}
	}
}

func FuzzEnrollDecode(f *testing.F) {
	s, _ := fuzzServer(f)
	f.Add([]byte(`{"node_id":"n","generation":1,"enrollment_token":"x","agent_version":"1","facts":{"observed_at":"2026-01-01T00:00:00Z"}}`))
	f.Add([]byte(`{"node_id":"n","generation":1e99}`))
	f.Add([]byte(`{"unacknowledged_results":[{"operation_id":"a"}]}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		checkFuzzAnswer(t, fuzzPost(s, "/agent/v1/enroll", "", body))
	})
}

func FuzzEventsDecode(f *testing.F) {
	s, tok := fuzzServer(f)
	f.Add([]byte(`{"events":[{"id":"1","kind":"heartbeat","observed_at":"2026-01-01T00:00:00Z"}]}`))
	f.Add([]byte(`{"events":[{"id":"2","kind":"workload","observed_at":"2026-01-01T00:00:00Z","workload":{"run_id":"r","attempt_id":"a","state":"exited","exit_code":1,"observed_at":"2026-01-01T00:00:00Z"}}]}`))
	f.Add([]byte(`{"events":[{"id":"3","kind":"heartbeat","observed_at":"2026-01-01T00:00:00Z","facts":{"cpus":-1,"observed_at":"2026-01-01T00:00:00Z"}}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		checkFuzzAnswer(t, fuzzPost(s, "/agent/v1/events", tok, body))
	})
}

// TestSecretsNeverLogged: tokens pass through invitations, enrollment,
// refusals and polls, and none of them reaches the server's log or an error.
func TestSecretsNeverLogged(t *testing.T) {
	var log apitest.LogBuffer
	s := apitest.Start(t, apitest.WithLog(&log))
	boot, sess := inviteAndEnroll(t, s)
	s.Problem(t, "POST", "/agent/v1/enroll", api.EnrollRequest{NodeID: boot.NodeID, Generation: 1, EnrollmentToken: boot.EnrollmentToken,
		AgentVersion: "x", Facts: agentFacts()}, "", 409, "enrollment_spent")
	s.Problem(t, "POST", "/agent/v1/enroll", api.EnrollRequest{NodeID: boot.NodeID, Generation: 1, EnrollmentToken: boot.EnrollmentToken + "x",
		AgentVersion: "x", Facts: agentFacts()}, "", 401, "enrollment_invalid")
	s.JSON(t, "GET", "/agent/v1/commands?wait=0", nil, sess.SessionToken, http.StatusOK, nil)
	s.Problem(t, "GET", "/agent/v1/commands?wait=0&token="+sess.SessionToken, nil, sess.SessionToken+"x", 401, "session_invalid")
	s.Problem(t, "GET", "/api/v1/nodes", nil, s.AdminToken+"x", 401, "unauthenticated")
	got := log.String()
	require.Contains(t, got, "/agent/v1/enroll", "the log was captured")
	for name, secret := range map[string]string{"enrollment": boot.EnrollmentToken, "session": sess.SessionToken, "admin": s.AdminToken} {
		require.NotContains(t, got, secret, "%s token in the log", name)
	}
}
