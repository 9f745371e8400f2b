package handlers_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward"
	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/agent/client"
	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/handlers"
	"github.com/nodeward/nodeward/keys"
	"github.com/nodeward/nodeward/metrics"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// TestContractWalk drives every node, command and agent endpoint once
// through the validating client, so each answer shape the server really
// gives is checked against openapi.yaml (the assertions here are light: the
// contract check is the point; fleet tests own the behaviour).
func TestContractWalk(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		ctx := context.Background()
		rental := apitest.RandomID("rental-")
		price := 0.25
		var boot api.Bootstrap
		s.Admin(t, http.MethodPost, "/api/v1/nodes/invitations", map[string]any{
			"rental_id": rental, "generation": 1, "shadow_price_usd_per_hour": price,
			"purchase": map[string]any{"billing_interval_seconds": 3600, "eligible_classes": []string{"batch"}},
		}, http.StatusCreated, &boot)
		require.Equal(t, rental, boot.RentalID)
		require.Equal(t, s.URL, boot.ControlPlaneURL)
		node := "/api/v1/nodes/" + boot.NodeID

		s.Problem(t, http.MethodPost, "/api/v1/nodes/invitations", map[string]any{"rental_id": rental, "generation": 1}, s.AdminToken, http.StatusConflict, "identity_exists")
		s.Problem(t, http.MethodPost, "/api/v1/nodes/invitations", map[string]any{"rental_id": rental, "generation": 0}, s.AdminToken, http.StatusUnprocessableEntity, "validation_failed")
		s.Problem(t, http.MethodPost, "/api/v1/nodes/invitations", map[string]any{"rental_id": rental, "generation": 1, "purchase": map[string]any{"billing_interval_seconds": 0}}, s.AdminToken, http.StatusUnprocessableEntity, "validation_failed")

		var again api.Bootstrap
		through := time.Now().UTC().Add(10 * time.Minute).Format(time.RFC3339)
		s.Admin(t, http.MethodPost, node+"/reinvite", map[string]any{"redeemable_through": through}, http.StatusOK, &again)
		require.Equal(t, boot.EnrollmentToken, again.EnrollmentToken, "an outstanding invitation is handed back unchanged")
		s.Admin(t, http.MethodGet, node, nil, http.StatusOK, nil)
		s.Admin(t, http.MethodGet, "/api/v1/nodes?state=enrolling&limit=1", nil, http.StatusOK, nil)
		s.Problem(t, http.MethodGet, "/api/v1/nodes?state=bogus", nil, s.AdminToken, http.StatusBadRequest, "invalid_parameter")
		s.Problem(t, http.MethodGet, "/api/v1/nodes/no-such-node", nil, s.AdminToken, http.StatusNotFound, "not_found")
		s.Problem(t, http.MethodPost, node+"/commands", map[string]any{"kind": api.KindPrepareImage, "operation_id": "op-early", "payload": map[string]any{"image": "x"}}, s.AdminToken, http.StatusConflict, "node_not_ready")

		// The agent, through the same validating client.
		ac, err := client.New(client.Options{BaseURL: boot.ControlPlaneURL, AllowInsecureHTTP: true, HTTPClient: s.Client})
		require.NoError(t, err)
		now := time.Now().UTC()
		free := int64(10 << 30)
		facts := api.Facts{Hostname: "h1", OS: "linux", Arch: "amd64", CPUs: 2, MemoryBytes: 1 << 30,
			DiskFreeBytes: &free, AgentVersion: "0.0.0-test", Runtimes: []string{"process"}, ObservedAt: now}
		enrollReq := api.EnrollRequest{NodeID: boot.NodeID, Generation: boot.Generation,
			EnrollmentToken: boot.EnrollmentToken, AgentVersion: "0.0.0-test", Facts: facts,
			EnrollmentNonce: "Y29udHJhY3Qtd2Fsay1ub25jZS0wMQ"}
		enr, err := ac.Enroll(ctx, enrollReq)
		require.NoError(t, err)
		// The agent's retry of an answer it never read: answered again.
		again2, err := ac.Enroll(ctx, enrollReq)
		require.NoError(t, err)
		require.Equal(t, enr.FencingToken, again2.FencingToken)
		ac.SetSessionToken(enr.SessionToken)
		enrollReq.EnrollmentNonce = ""
		_, err = ac.Enroll(ctx, enrollReq)
		require.Equal(t, "enrollment_spent", client.CodeOf(err))
		_, err = ac.Renew(ctx)
		require.NoError(t, err)

		_, err = ac.Events(ctx, []api.Event{
			{ID: "hb-1", Kind: api.EventHeartbeat, ObservedAt: now, Facts: &facts},
			{ID: "wl-1", Kind: api.EventWorkload, ObservedAt: now, Workload: &api.WorkloadObservation{RunID: "r1", AttemptID: "a1", State: api.WorkloadRunning, ObservedAt: now}},
		})
		require.NoError(t, err)

		var cmd map[string]any
		s.Admin(t, http.MethodPost, node+"/commands", map[string]any{"kind": api.KindPrepareImage, "operation_id": "op-1", "payload": map[string]any{"image": "busybox"}}, http.StatusCreated, &cmd)
		s.Admin(t, http.MethodPost, node+"/commands", map[string]any{"kind": api.KindPrepareImage, "operation_id": "op-1", "payload": map[string]any{"image": "busybox"}}, http.StatusOK, nil)
		s.Problem(t, http.MethodPost, node+"/commands", map[string]any{"kind": api.KindPrepareImage, "operation_id": "op-1", "payload": map[string]any{"image": "other"}}, s.AdminToken, http.StatusConflict, "operation_conflict")

		got, err := ac.Commands(ctx, 0)
		require.NoError(t, err)
		require.Len(t, got.Commands, 1)
		res, err := ac.Results(ctx, []api.Result{{OperationID: "op-1", Applied: true}, {OperationID: "op-nope", Applied: true}})
		require.NoError(t, err)
		require.Len(t, res.Settled, 2)

		s.Admin(t, http.MethodGet, "/api/v1/commands/op-1", nil, http.StatusOK, nil)
		s.Admin(t, http.MethodGet, node+"/commands?state=applied", nil, http.StatusOK, nil)
		s.Admin(t, http.MethodGet, node+"/reconciliation", nil, http.StatusOK, nil)
		s.Admin(t, http.MethodGet, node+"/workloads/r1/a1", nil, http.StatusOK, nil)
		s.Problem(t, http.MethodGet, node+"/workloads/r1/a1/output", nil, s.AdminToken, http.StatusNotFound, "not_found")
		out, err := ac.Output(ctx, api.OutputRequest{RunID: "r1", AttemptID: "a1", StdoutTail: "done\n", StderrTail: ""})
		require.NoError(t, err)
		require.True(t, out.Recorded)
		s.Admin(t, http.MethodGet, node+"/workloads/r1/a1/output", nil, http.StatusOK, nil)
		var absent map[string]any
		s.Admin(t, http.MethodGet, node+"/workloads/r9/a9", nil, http.StatusOK, &absent)
		require.Equal(t, "absent", absent["state"])
		s.Admin(t, http.MethodGet, node+"/audit", nil, http.StatusOK, nil)
		var offers struct {
			Offers []map[string]any `json:"offers"`
		}
		s.Admin(t, http.MethodGet, "/api/v1/offers?class=batch&min_free_disk_bytes=1", nil, http.StatusOK, &offers)
		require.Len(t, offers.Offers, 1)
		s.Admin(t, http.MethodGet, "/api/v1/sessions", nil, http.StatusOK, nil)

		var retired map[string]any
		s.Admin(t, http.MethodPost, node+"/retire", map[string]any{"reason": "done"}, http.StatusOK, &retired)
		require.Equal(t, "retired", retired["state"])
		s.Admin(t, http.MethodPost, node+"/retire", nil, http.StatusOK, nil)
		s.Problem(t, http.MethodPost, node+"/reinvite", map[string]any{}, s.AdminToken, http.StatusGone, "node_retired")
		_, err = ac.Commands(ctx, 0)
		require.Equal(t, "node_retired", client.CodeOf(err))

		ac.SetSessionToken("forged")
		_, err = ac.Commands(ctx, 0)
		require.Equal(t, "session_invalid", client.CodeOf(err))
	})
}

// TestReadyzAheadOfThisBuild: a replica left running while a newer
// release migrated its database is not ready, and says why.
func TestReadyzAheadOfThisBuild(t *testing.T) {
	t.Parallel()
	db := dbtest.Open(t, models.SQLite)
	require.NoError(t, db.Exec(`INSERT INTO goose_db_version (version_id, is_applied) VALUES (99999, TRUE)`).Error)
	status, checks := readyz(t, db, false)
	require.Equal(t, "not_ready", status)
	require.Equal(t, map[string]string{"database": "ok", "migrations": "ahead", "draining": "no"}, checks)
}

// TestReadyzWhileDraining checks the 503 shape of /readyz against the
// contract (the real server drains too briefly to catch it there).
func TestReadyzWhileDraining(t *testing.T) {
	t.Parallel()
	status, checks := readyz(t, dbtest.Open(t, models.SQLite), true)
	require.Equal(t, "not_ready", status)
	require.Equal(t, "yes", checks["draining"])
}

// readyz asks a server of db for /readyz, through the contract's
// validating transport, expecting 503, and answers the body's status and
// checks.
func readyz(t *testing.T, db *models.DB, draining bool) (string, map[string]string) {
	t.Helper()
	ring := keys.NewRing([]byte("0123456789abcdef0123456789abcdef"))
	h := handlers.New(handlers.Deps{Ready: db, Auth: auth.New(auth.Options{Store: models.NewAuthStore(db), Keys: ring}), Metrics: metrics.New(nil),
		OpenAPI: nodeward.OpenAPI, Draining: func() bool { return draining }})
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := &http.Client{Transport: apitest.NewTransport(t, nil)}
	resp, err := c.Get(srv.URL + "/readyz")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	var body struct {
		Status string            `json:"status"`
		Checks map[string]string `json:"checks"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	return body.Status, body.Checks
}
