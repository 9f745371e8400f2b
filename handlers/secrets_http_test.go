package handlers_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
	"github.com/nodeward/nodeward/secrets"
)

type sealJSON struct {
	Handle    string `json:"handle"`
	ExpiresAt string `json:"expires_at"`
}

func sealFor(t *testing.T, s *apitest.Server, token, requestID, nodeID, field, value string) string {
	t.Helper()
	var out sealJSON
	s.JSON(t, http.MethodPost, "/api/v1/secrets/seal", map[string]any{"request_id": requestID,
		"target": map[string]any{"kind": "node", "id": nodeID}, "field": field, "value": value}, token, http.StatusCreated, &out)
	require.True(t, strings.HasPrefix(out.Handle, secrets.HandlePrefix))
	return out.Handle
}

func launchWith(requestID, nodeID, handle string) map[string]any {
	return map[string]any{"request_id": requestID, "kind": "node.launch_workload",
		"targets": []any{map[string]any{"kind": "node", "id": nodeID}},
		"operation": map[string]any{"run_id": "run-1", "attempt_id": requestID, "command": "serve",
			"env": map[string]any{"DB_PASSWORD": handle, "MODE": "plain"}}}
}

// dumpDatabase answers every row of every table as text: SQLite's tables
// read whole, Postgres rows cast to text in the test's own schema.
func dumpDatabase(t *testing.T, db *models.DB) string {
	t.Helper()
	var tables []string
	if db.Dialect == models.SQLite {
		require.NoError(t, db.Raw("SELECT name FROM sqlite_master WHERE type = 'table'").Scan(&tables).Error)
	} else {
		require.NoError(t, db.Raw("SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()").Scan(&tables).Error)
	}
	require.Contains(t, tables, "sealed_secrets")
	var b strings.Builder
	for _, table := range tables {
		rows, err := db.Raw(`SELECT * FROM "` + table + `"`).Rows()
		require.NoError(t, err)
		cols, err := rows.Columns()
		require.NoError(t, err)
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			require.NoError(t, rows.Scan(ptrs...))
			for _, v := range vals {
				if bs, ok := v.([]byte); ok {
					v = string(bs)
				}
				fmt.Fprintf(&b, "%v\t", v)
			}
			b.WriteString("\n")
		}
		require.NoError(t, rows.Close())
	}
	return b.String()
}

// TestSealedSecretRoundTripHTTP: a value sealed for a workload's
// environment reaches the node's long-poll answer and nowhere else: the
// operation and the command keep the handle, no table holds the value, the
// audit names a digest only; any other use is refused without spending
// anything.
func TestSealedSecretRoundTripHTTP(t *testing.T) {
	t.Parallel()
	for _, dialect := range dbtest.Dialects(t) {
		t.Run(dialect, func(t *testing.T) {
			log := &apitest.LogBuffer{}
			s := apitest.Start(t, apitest.WithDialect(dialect), apitest.WithLog(log))
			boot, sess := inviteAndEnroll(t, s)
			other, _ := inviteAndEnroll(t, s)
			secret := "s3cret-" + apitest.RandomID("v")

			h := sealFor(t, s, s.AdminToken, "deploy-1", boot.NodeID, "/env/DB_PASSWORD", secret)
			var op opJSON
			s.Admin(t, http.MethodPost, "/api/v1/operations", launchWith("deploy-1", boot.NodeID, h), http.StatusCreated, &op)

			var polled api.CommandsResponse
			s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=5", nil, sess.SessionToken, http.StatusOK, &polled)
			require.Len(t, polled.Commands, 1)
			var payload api.LaunchWorkload
			require.NoError(t, json.Unmarshal(polled.Commands[0].Payload, &payload))
			require.Equal(t, secret, payload.Env["DB_PASSWORD"], "the node is handed the value")
			require.Equal(t, "plain", payload.Env["MODE"])

			status, _, raw := s.Do(t, http.MethodGet, "/api/v1/commands/"+op.OperationID, nil, s.AdminToken)
			require.Equal(t, http.StatusOK, status)
			require.Contains(t, string(raw), h, "the administrator reads the handle")
			require.NotContains(t, string(raw), secret)
			status, _, raw = s.Do(t, http.MethodGet, "/api/v1/operations/"+op.OperationID, nil, s.AdminToken)
			require.Equal(t, http.StatusOK, status)
			require.Contains(t, string(raw), h)
			require.NotContains(t, string(raw), secret)

			// Refusals: the message names no handle and nothing is spent.
			second := sealFor(t, s, s.AdminToken, "deploy-2", boot.NodeID, "/env/DB_PASSWORD", secret)
			host := createHost(t, s, "ci", "commands")
			for name, tc := range map[string]struct {
				token string
				body  map[string]any
			}{
				"other principal":  {host.Token, launchWith("deploy-2", boot.NodeID, second)},
				"other request id": {s.AdminToken, launchWith("deploy-3", boot.NodeID, second)},
				"other target":     {s.AdminToken, launchWith("deploy-2", other.NodeID, second)},
				"spent handle":     {s.AdminToken, launchWith("deploy-4", boot.NodeID, h)},
			} {
				p := s.Problem(t, http.MethodPost, "/api/v1/operations", tc.body, tc.token, http.StatusForbidden, "permission_denied")
				require.NotContains(t, p.Raw, secrets.HandlePrefix, name)
				require.NotContains(t, p.Raw, secret, name)
			}
			s.Admin(t, http.MethodPost, "/api/v1/operations", launchWith("deploy-2", boot.NodeID, second), http.StatusCreated, &op)

			// A package host seals and uses its own.
			mine := sealFor(t, s, host.Token, "host-1", boot.NodeID, "/env/DB_PASSWORD", secret)
			s.JSON(t, http.MethodPost, "/api/v1/operations", launchWith("host-1", boot.NodeID, mine), host.Token, http.StatusCreated, &op)
			s.Problem(t, http.MethodGet, "/api/v1/secret-audit", nil, host.Token, http.StatusForbidden, "permission_denied")

			var audit struct {
				Entries []struct {
					Action       string  `json:"action"`
					Outcome      string  `json:"outcome"`
					HandleDigest string  `json:"handle_digest"`
					OperationID  *string `json:"operation_id"`
				} `json:"entries"`
				NextBefore *string `json:"next_before"`
			}
			status, _, raw = s.Do(t, http.MethodGet, "/api/v1/secret-audit?limit=500", nil, s.AdminToken)
			require.Equal(t, http.StatusOK, status)
			require.NotContains(t, string(raw), secret)
			require.NotContains(t, string(raw), secrets.HandlePrefix)
			require.NoError(t, json.Unmarshal(raw, &audit))
			outcomes := map[string]int{}
			for _, e := range audit.Entries {
				outcomes[e.Action+"/"+e.Outcome]++
			}
			// The two invitations and the host created through their
			// wrappers showed their secrets: each a reveal.
			require.Equal(t, map[string]int{"seal/ok": 3, "use/ok": 3, "use/denied": 4, "reveal/ok": 3}, outcomes)
			require.Equal(t, secrets.Digest(mine)[:16], audit.Entries[0].HandleDigest, "newest first")
			s.Admin(t, http.MethodGet, "/api/v1/secret-audit?limit=2", nil, http.StatusOK, &audit)
			require.Len(t, audit.Entries, 2)
			require.NotNil(t, audit.NextBefore)
			s.Admin(t, http.MethodGet, "/api/v1/secret-audit?limit=500&before="+*audit.NextBefore, nil, http.StatusOK, &audit)
			require.Len(t, audit.Entries, 11)

			dump := dumpDatabase(t, s.App.DB)
			require.NotContains(t, dump, secret, "no table holds the value")
			require.Contains(t, dump, secrets.Digest(h), "the handle's digest is what is stored")
			require.NotContains(t, log.String(), secret, "nor does the log")

			// Once the node answered, nothing is left to deliver; a launch's
			// value is still kept to scrub its attempt's output, and once
			// that is recorded the sweeper drops it, and only it.
			s.JSON(t, http.MethodPost, "/agent/v1/results", api.ResultsRequest{Results: []api.Result{{OperationID: polled.Commands[0].OperationID, Applied: true}}},
				sess.SessionToken, http.StatusOK, nil)
			_, err := s.App.Secrets.Sweep(t.Context())
			require.NoError(t, err)
			require.Equal(t, int64(3), dbtest.Count(t, s.App.DB.DB, &models.SecretDelivery{}))
			s.JSON(t, http.MethodPost, "/agent/v1/output", api.OutputRequest{RunID: "run-1", AttemptID: "deploy-1", StdoutTail: "done"},
				sess.SessionToken, http.StatusOK, nil)
			_, err = s.App.Secrets.Sweep(t.Context())
			require.NoError(t, err)
			require.Zero(t, dbtest.Count(t, s.App.DB.DB, &models.SecretDelivery{}, "operation_id = ?", polled.Commands[0].OperationID))
			require.Equal(t, int64(2), dbtest.Count(t, s.App.DB.DB, &models.SecretDelivery{}))
		})
	}
}

// TestSealedSecretConcurrentUseHTTP: two submissions racing one handle
// (same principal, request id and body): one records the operation, the
// other answers the same operation; the handle is spent once.
func TestSealedSecretConcurrentUseHTTP(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		boot, _ := inviteAndEnroll(t, s)
		h := sealFor(t, s, s.AdminToken, "race-1", boot.NodeID, "/env/DB_PASSWORD", "v")
		var wg sync.WaitGroup
		var created, replayed atomic.Int64
		ids := make([]string, 4)
		for i := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				status, _, raw := s.Do(t, http.MethodPost, "/api/v1/operations", launchWith("race-1", boot.NodeID, h), s.AdminToken)
				var op opJSON
				_ = json.Unmarshal(raw, &op)
				ids[i] = op.OperationID
				switch status {
				case http.StatusCreated:
					created.Add(1)
				case http.StatusOK:
					replayed.Add(1)
				}
			}()
		}
		wg.Wait()
		require.Equal(t, int64(1), created.Load())
		require.Equal(t, int64(3), replayed.Load())
		for _, id := range ids {
			require.Equal(t, ids[0], id)
		}
		require.Equal(t, int64(1), dbtest.Count(t, s.App.DB.DB, &models.SealedSecret{}, "state = ?", "used"))
		require.Equal(t, int64(1), dbtest.Count(t, s.App.DB.DB, &models.SecretDelivery{}))
	})
}

// TestSealValidationHTTP: bad input is 422 naming the field, nothing
// stored; the 1,001st live handle of a principal is 429.
func TestSealValidationHTTP(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		good := func() map[string]any {
			return map[string]any{"request_id": "r1", "target": map[string]any{"kind": "node", "id": "n1"}, "field": "/env/A", "value": "v"}
		}
		for name, tc := range map[string]struct {
			set   func(map[string]any)
			field string
		}{
			"oversized":   {func(b map[string]any) { b["value"] = strings.Repeat("x", secrets.MaxValueSize+1) }, "value"},
			"empty":       {func(b map[string]any) { b["value"] = "" }, "value"},
			"bad pointer": {func(b map[string]any) { b["field"] = "/env/~x" }, "field"},
			"bad target":  {func(b map[string]any) { b["target"] = map[string]any{"kind": "galaxy"} }, "target/kind"},
			"fleet id":    {func(b map[string]any) { b["target"] = map[string]any{"kind": "fleet", "id": "x"} }, "target/id"},
			"ttl":         {func(b map[string]any) { b["ttl_seconds"] = 86401 }, "ttl_seconds"},
		} {
			b := good()
			tc.set(b)
			p := s.Problem(t, http.MethodPost, "/api/v1/secrets/seal", b, s.AdminToken, http.StatusUnprocessableEntity, "validation_failed")
			require.Equal(t, tc.field, p.Errors[0].Field, name)
		}
		require.Zero(t, dbtest.Count(t, s.App.DB.DB, &models.SealedSecret{}))
		var fleet sealJSON
		s.Admin(t, http.MethodPost, "/api/v1/secrets/seal", map[string]any{"request_id": "f1", "target": map[string]any{"kind": "fleet"},
			"field": "/payload/env/A", "value": "v", "ttl_seconds": 86400}, http.StatusCreated, &fleet)

		admin := secrets.Principal{Kind: "admin", ID: s.AdminUserID}
		for range secrets.DefaultMaxLive - 1 {
			_, err := s.App.Secrets.Seal(t.Context(), admin, secrets.SealRequest{RequestID: "r1", Target: secrets.Target{Kind: "node", ID: "n1"}, Field: "/env/A", Value: "v"})
			require.NoError(t, err)
		}
		s.Problem(t, http.MethodPost, "/api/v1/secrets/seal", good(), s.AdminToken, http.StatusTooManyRequests, "quota_exceeded")
		require.Equal(t, int64(secrets.DefaultMaxLive), dbtest.Count(t, s.App.DB.DB, &models.SealedSecret{}))
	})
}

// TestSealedSecretFanOutHTTP: a value sealed for the fleet is used by a
// fleet.command, and every child's node receives it (DECISIONS.md §17).
// The payload is padded past 1 KiB, so the children's commands name one
// stored copy of it (migration 00032): delivery, the admin read, the
// output's scrub and the values' purge all read it back.
func TestSealedSecretFanOutHTTP(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		a, sa := inviteAndEnroll(t, s)
		b, sb := inviteAndEnroll(t, s)
		var sealed sealJSON
		s.Admin(t, http.MethodPost, "/api/v1/secrets/seal", map[string]any{"request_id": "fan-s", "target": map[string]any{"kind": "fleet"},
			"field": "/payload/env/DB_PASSWORD", "value": "fleet-secret"}, http.StatusCreated, &sealed)
		var parent opJSON
		s.Admin(t, http.MethodPost, "/api/v1/operations", map[string]any{"request_id": "fan-s", "kind": "fleet.command",
			"targets": []any{map[string]any{"kind": "node", "id": a.NodeID}, map[string]any{"kind": "node", "id": b.NodeID}},
			"operation": map[string]any{"kind": "node.launch_workload", "max_concurrency": 2,
				"payload": map[string]any{"run_id": "r", "attempt_id": "a", "command": "x",
					"env": map[string]any{"DB_PASSWORD": sealed.Handle, "PAD": strings.Repeat("p", 1100)}}}},
			http.StatusCreated, &parent)
		for _, sess := range []api.EnrollResponse{sa, sb} {
			var polled api.CommandsResponse
			deadline := time.Now().Add(30 * time.Second)
			for len(polled.Commands) == 0 && time.Now().Before(deadline) {
				s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=5", nil, sess.SessionToken, http.StatusOK, &polled)
			}
			require.Len(t, polled.Commands, 1)
			require.EqualValues(t, 1, dbtest.Count(t, s.App.DB.DB, &models.Command{}, "operation_id = ? AND payload = '' AND payload_body IS NOT NULL",
				polled.Commands[0].OperationID), "the child's command names the stored payload")
			var payload api.LaunchWorkload
			require.NoError(t, json.Unmarshal(polled.Commands[0].Payload, &payload))
			require.Equal(t, "fleet-secret", payload.Env["DB_PASSWORD"])
			require.Len(t, payload.Env["PAD"], 1100)
			status, _, raw := s.Do(t, http.MethodGet, "/api/v1/commands/"+polled.Commands[0].OperationID, nil, s.AdminToken)
			require.Equal(t, http.StatusOK, status)
			require.NotContains(t, string(raw), "fleet-secret", "the child's command keeps the handle")
			s.JSON(t, http.MethodPost, "/agent/v1/results", api.ResultsRequest{Results: []api.Result{{OperationID: polled.Commands[0].OperationID, Applied: true}}},
				sess.SessionToken, http.StatusOK, nil)
		}
		// The fan-out ends before its children's output arrives: the values
		// stay (under the parent) until every child's output is scrubbed.
		var ended opJSON
		deadline := time.Now().Add(30 * time.Second)
		for ended.State != "succeeded" && time.Now().Before(deadline) {
			s.Admin(t, http.MethodGet, "/api/v1/operations/"+parent.OperationID, nil, http.StatusOK, &ended)
		}
		require.Equal(t, "succeeded", ended.State)
		_, err := s.App.Secrets.Sweep(t.Context())
		require.NoError(t, err)
		for i, sess := range []api.EnrollResponse{sa, sb} {
			s.JSON(t, http.MethodPost, "/agent/v1/output", api.OutputRequest{RunID: "r", AttemptID: "a",
				StdoutTail: "connecting with fleet-secret\n", StderrTail: "", Truncated: false}, sess.SessionToken, http.StatusOK, nil)
			node := []api.Bootstrap{a, b}[i].NodeID
			var out outputView
			s.Admin(t, http.MethodGet, "/api/v1/nodes/"+node+"/workloads/r/a/output", nil, http.StatusOK, &out)
			require.Equal(t, "connecting with [secret]\n", out.StdoutTail, "child %d's output is scrubbed of the parent's value", i)
		}
		_, err = s.App.Secrets.Sweep(t.Context())
		require.NoError(t, err)
		require.Zero(t, dbtest.Count(t, s.App.DB.DB, &models.SecretDelivery{}, "operation_id = ?", parent.OperationID),
			"every child's output is recorded: the values go")
		// A node-targeted kind may not use a fleet handle.
		s.Admin(t, http.MethodPost, "/api/v1/secrets/seal", map[string]any{"request_id": "fan-x", "target": map[string]any{"kind": "fleet"},
			"field": "/env/DB_PASSWORD", "value": "v"}, http.StatusCreated, &sealed)
		s.Problem(t, http.MethodPost, "/api/v1/operations", launchWith("fan-x", a.NodeID, sealed.Handle), s.AdminToken, http.StatusForbidden, "permission_denied")

		// All or none, through the ledger's own transaction: a good handle
		// beside a refused one is not spent.
		used := dbtest.Count(t, s.App.DB.DB, &models.SealedSecret{}, "state = ?", "used")
		good := sealFor(t, s, s.AdminToken, "both-1", a.NodeID, "/env/DB_PASSWORD", "v1")
		misplaced := sealFor(t, s, s.AdminToken, "both-1", a.NodeID, "/env/ELSEWHERE", "v2")
		body := launchWith("both-1", a.NodeID, good)
		body["operation"].(map[string]any)["env"].(map[string]any)["MODE"] = misplaced
		s.Problem(t, http.MethodPost, "/api/v1/operations", body, s.AdminToken, http.StatusForbidden, "permission_denied")
		require.Equal(t, used, dbtest.Count(t, s.App.DB.DB, &models.SealedSecret{}, "state = ?", "used"))
		s.Admin(t, http.MethodPost, "/api/v1/operations", launchWith("both-1", a.NodeID, good), http.StatusCreated, &parent)
	})
}
