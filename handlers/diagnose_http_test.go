package handlers_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/internal/testwait"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
	"github.com/nodeward/nodeward/server/controlplane"
)

// rawOpJSON is an operation with its result left raw.
type rawOpJSON struct {
	OperationID string          `json:"operation_id"`
	State       string          `json:"state"`
	Result      json.RawMessage `json:"result"`
	Error       map[string]any  `json:"error"`
}

func allowDiagnose(list string) apitest.Option {
	return apitest.WithConfig(func(c *controlplane.Config) { c.DiagnoseAllow = list })
}

func endpointOp(requestID, url string, credential string) map[string]any {
	op := map[string]any{"url": url}
	if credential != "" {
		op["credential"] = credential
	}
	return map[string]any{"request_id": requestID, "kind": "diagnose.endpoint",
		"targets": []any{map[string]any{"kind": "endpoint", "id": url}}, "operation": op, "wait_timeout_ms": 30000}
}

// TestDiagnoseEndpointHTTP: a probe with a sealed bearer token reaches
// the endpoint with the token, and the token is nowhere else: not in the
// operation, its result or events, the server's log or the database.
func TestDiagnoseEndpointHTTP(t *testing.T) {
	t.Parallel()
	const token = "diag-bearer-7f3a9c1e5b"
	var mu sync.Mutex
	var seen []string
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer target.Close()
	url := target.URL + "/health"

	for _, d := range dbtest.Dialects(t) {
		t.Run(d, func(t *testing.T) {
			logs := &apitest.LogBuffer{}
			s := apitest.Start(t, apitest.WithDialect(d), apitest.WithLog(logs), allowDiagnose("127.0.0.1/32"))
			var sealed sealJSON
			s.Admin(t, http.MethodPost, "/api/v1/secrets/seal", map[string]any{"request_id": "probe-1",
				"target": map[string]any{"kind": "endpoint", "id": url}, "field": "/credential", "value": token},
				http.StatusCreated, &sealed)
			var op rawOpJSON
			s.Admin(t, http.MethodPost, "/api/v1/operations", endpointOp("probe-1", url, sealed.Handle), http.StatusCreated, &op)
			require.Equal(t, "succeeded", op.State, "%+v", op)
			var ev struct {
				Reached        bool `json:"reached"`
				Status         int  `json:"status"`
				CredentialSent bool `json:"credential_sent"`
			}
			require.NoError(t, json.Unmarshal(op.Result, &ev))
			require.True(t, ev.Reached)
			require.Equal(t, http.StatusNoContent, ev.Status)
			require.True(t, ev.CredentialSent)
			mu.Lock()
			require.Contains(t, seen, "Bearer "+token, "the endpoint saw the token")
			mu.Unlock()

			_, _, raw := s.Do(t, http.MethodGet, "/api/v1/operations/"+op.OperationID, nil, s.AdminToken)
			require.NotContains(t, string(raw), token)
			_, _, raw = s.Do(t, http.MethodGet, "/api/v1/operations/"+op.OperationID+"/watch", nil, s.AdminToken)
			require.NotContains(t, string(raw), token)
			require.Contains(t, string(raw), "succeeded")
			_, _, raw = s.Do(t, http.MethodGet, "/api/v1/node-operations?kind=diagnose.endpoint", nil, s.AdminToken)
			require.NotContains(t, string(raw), token)
			require.NotContains(t, logs.String(), token)
			require.NotContains(t, dumpDatabase(t, s.App.DB), token)
		})
	}
}

func TestDiagnoseEndpointRefusals(t *testing.T) {
	t.Parallel()
	var hits atomic.Int64
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer other.Close()
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, strings.Replace(other.URL, "127.0.0.1", "localhost", 1)+"/x", http.StatusMovedPermanently)
	}))
	defer target.Close()

	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		ops := func() int64 { return dbtest.Count(t, s.App.DB.DB, &models.Operation{}) }
		before := ops()
		// Outside the allowlist: 403, nothing recorded.
		p := s.Problem(t, http.MethodPost, "/api/v1/operations", endpointOp("out-1", "http://192.0.2.1/", ""),
			s.AdminToken, http.StatusForbidden, "destination_not_allowed")
		require.NotEmpty(t, p.Detail)
		s.Problem(t, http.MethodPost, "/api/v1/operations", endpointOp("out-2", "http://example.invalid/", ""),
			s.AdminToken, http.StatusForbidden, "destination_not_allowed")
		// Bad input: 422 naming the field, nothing recorded.
		for _, c := range []struct {
			body  map[string]any
			field string
		}{
			{endpointOp("bad-1", "ftp://127.0.0.1/", ""), "operation/url"},
			{endpointOp("bad-2", target.URL, "plain-text-token"), "operation/credential"},
			{map[string]any{"request_id": "bad-3", "kind": "diagnose.endpoint", "targets": []any{map[string]any{"kind": "endpoint", "id": "http://127.0.0.1/other"}},
				"operation": map[string]any{"url": target.URL}}, "targets"},
		} {
			p := s.Problem(t, http.MethodPost, "/api/v1/operations", c.body, s.AdminToken, http.StatusUnprocessableEntity, "validation_failed")
			require.Equal(t, c.field, p.Errors[0].Field)
		}
		require.Equal(t, before, ops(), "nothing recorded")

		// A redirect to another host is reported, not followed.
		var op rawOpJSON
		s.Admin(t, http.MethodPost, "/api/v1/operations", endpointOp("redir-1", target.URL+"/", ""), http.StatusCreated, &op)
		require.Equal(t, "succeeded", op.State)
		var ev struct {
			Status   int `json:"status"`
			Redirect struct {
				Location string `json:"location"`
				SameHost bool   `json:"same_host"`
				Followed bool   `json:"followed"`
			} `json:"redirect"`
		}
		require.NoError(t, json.Unmarshal(op.Result, &ev))
		require.Equal(t, http.StatusMovedPermanently, ev.Status)
		require.False(t, ev.Redirect.Followed)
		require.False(t, ev.Redirect.SameHost)
		require.Contains(t, ev.Redirect.Location, "localhost")
		require.Zero(t, hits.Load())
	}, allowDiagnose("127.0.0.1/32"))

	// The default allowlist is empty: every destination is refused.
	s := apitest.Start(t)
	s.Problem(t, http.MethodPost, "/api/v1/operations", endpointOp("none-1", target.URL, ""), s.AdminToken, http.StatusForbidden, "destination_not_allowed")
}

// TestNodeDiagnoseHTTP: node.diagnose over the API, its bad input refused
// with the field named, its evidence answered as the result; fleet.diagnose
// summarises; a node without diag.v1 is 409 capability_missing.
func TestNodeDiagnoseHTTP(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		var boot api.Bootstrap
		s.Admin(t, "POST", "/api/v1/nodes/invitations", map[string]any{"rental_id": apitest.RandomID("r"), "generation": 1}, http.StatusCreated, &boot)
		facts := agentFacts()
		facts.Capabilities = []string{api.CapCommands, api.CapDiag}
		var sess api.EnrollResponse
		s.JSON(t, "POST", "/agent/v1/enroll", api.EnrollRequest{NodeID: boot.NodeID, Generation: 1,
			EnrollmentToken: boot.EnrollmentToken, AgentVersion: "0.0.0-test", Facts: facts}, "", http.StatusOK, &sess)
		target := []any{map[string]any{"kind": "node", "id": boot.NodeID}}
		submit := func(requestID string, op any) map[string]any {
			return map[string]any{"request_id": requestID, "kind": "node.diagnose", "targets": target, "operation": op}
		}

		before := dbtest.Count(t, s.App.DB.DB, &models.Operation{})
		for i, c := range []struct {
			op    any
			field string
		}{
			{map[string]any{"action": "reboot"}, "operation/action"},
			{map[string]any{"action": "disk", "paths": []string{"relative"}}, "operation/paths/0"},
			{map[string]any{"action": "connect", "host": "db", "port": 0}, "operation/port"},
			{map[string]any{"action": "connect", "host": "not a host", "port": 5432}, "operation/host"},
			{map[string]any{"action": "connect", "host": "db", "port": 5432, "timeout_seconds": 30}, "operation/timeout_seconds"},
			{map[string]any{"action": "resolve", "names": []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k"}}, "operation/names"},
		} {
			p := s.Problem(t, http.MethodPost, "/api/v1/operations", submit("bad-"+strconv.Itoa(i), c.op), s.AdminToken,
				http.StatusUnprocessableEntity, "validation_failed")
			require.Equal(t, c.field, p.Errors[0].Field)
		}
		require.Equal(t, before, dbtest.Count(t, s.App.DB.DB, &models.Operation{}), "nothing recorded")

		var op rawOpJSON
		s.Admin(t, http.MethodPost, "/api/v1/operations", submit("diag-1", map[string]any{"action": "connect", "host": "127.0.0.1", "port": 9}),
			http.StatusCreated, &op)
		var polled api.CommandsResponse
		s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=5", nil, sess.SessionToken, http.StatusOK, &polled)
		require.Len(t, polled.Commands, 1)
		require.Equal(t, "diagnose", polled.Commands[0].Kind)
		evidence := json.RawMessage(`{"action":"connect","ran_at":"2026-01-01T00:00:00Z","host":"127.0.0.1","port":9,"timeout_seconds":5,"connected":false,"latency_ms":0.2,"error":"connection refused"}`)
		s.JSON(t, http.MethodPost, "/agent/v1/results", api.ResultsRequest{Results: []api.Result{{OperationID: op.OperationID, Applied: true, Evidence: evidence}}},
			sess.SessionToken, http.StatusOK, nil)
		s.Admin(t, http.MethodGet, "/api/v1/operations/"+op.OperationID, nil, http.StatusOK, &op)
		require.Equal(t, "succeeded", op.State)
		require.JSONEq(t, string(evidence), string(op.Result))

		// The command wrapper takes kind diagnose too.
		var cmd map[string]any
		s.Admin(t, http.MethodPost, "/api/v1/nodes/"+boot.NodeID+"/commands", map[string]any{"kind": "diagnose",
			"operation_id": "wrapped-diag", "payload": map[string]any{"action": "agent"}}, http.StatusCreated, &cmd)
		require.Equal(t, "diagnose", cmd["kind"])
		s.Problem(t, http.MethodPost, "/api/v1/nodes/"+boot.NodeID+"/commands", map[string]any{"kind": "diagnose",
			"operation_id": "wrapped-diag-bad", "payload": map[string]any{"action": "shell"}}, s.AdminToken,
			http.StatusUnprocessableEntity, "validation_failed")
		s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=5", nil, sess.SessionToken, http.StatusOK, &polled)
		require.Len(t, polled.Commands, 1)
		s.JSON(t, http.MethodPost, "/agent/v1/results", api.ResultsRequest{Results: []api.Result{{OperationID: "wrapped-diag",
			Applied: true, Evidence: json.RawMessage(`{"action":"agent","ran_at":"2026-01-01T00:00:00Z"}`)}}},
			sess.SessionToken, http.StatusOK, nil)

		// A node whose agent predates diagnostics.
		legacy, _ := inviteAndEnroll(t, s)
		p := s.Problem(t, http.MethodPost, "/api/v1/operations", map[string]any{"request_id": "diag-legacy", "kind": "node.diagnose",
			"targets": []any{map[string]any{"kind": "node", "id": legacy.NodeID}}, "operation": map[string]any{"action": "clock"}},
			s.AdminToken, http.StatusConflict, "capability_missing")
		require.Equal(t, "diag.v1", p.Capability)

		// fleet.diagnose over both: one answers, one cannot.
		var parent rawOpJSON
		s.Admin(t, http.MethodPost, "/api/v1/operations", map[string]any{"request_id": "fleet-diag", "kind": "fleet.diagnose",
			"targets":   []any{map[string]any{"kind": "node", "id": boot.NodeID}, map[string]any{"kind": "node", "id": legacy.NodeID}},
			"operation": map[string]any{"diagnose": map[string]any{"action": "connect", "host": "db.internal", "port": 5432}}},
			http.StatusCreated, &parent)
		testwait.For(t, "the child delivered", 30*time.Second, func() bool {
			s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=1", nil, sess.SessionToken, http.StatusOK, &polled)
			return len(polled.Commands) == 1
		})
		ok := json.RawMessage(`{"action":"connect","ran_at":"2026-01-01T00:00:00Z","host":"db.internal","port":5432,"timeout_seconds":5,"connected":true,"latency_ms":1}`)
		s.JSON(t, http.MethodPost, "/agent/v1/results", api.ResultsRequest{Results: []api.Result{{OperationID: polled.Commands[0].OperationID, Applied: true, Evidence: ok}}},
			sess.SessionToken, http.StatusOK, nil)
		testwait.For(t, "the fan-out to end", 30*time.Second, func() bool {
			s.Admin(t, http.MethodGet, "/api/v1/operations/"+parent.OperationID, nil, http.StatusOK, &parent)
			return parent.State == "failed"
		})
		var res struct {
			Counts  map[string]int `json:"counts"`
			Summary map[string]any `json:"summary"`
		}
		require.NoError(t, json.Unmarshal(parent.Result, &res))
		require.Equal(t, 1, res.Counts["capability_missing"])
		require.EqualValues(t, 1, res.Summary["connected"])
		require.EqualValues(t, 1, res.Summary["failed"])
	})
}
