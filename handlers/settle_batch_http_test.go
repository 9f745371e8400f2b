package handlers_test

import (
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/apitest"
)

// TestSettleBatchMixedHTTP: one results request settles its commands in one
// write, yet answers each result on its own: applied, refused, an unknown
// id, another node's command, and the same id twice (the first settlement
// answers both) — and each operation ends as its command did, once.
func TestSettleBatchMixedHTTP(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		a, sa := inviteAndEnroll(t, s)
		b, sb := inviteAndEnroll(t, s)
		submit := func(node, id string) {
			s.Admin(t, http.MethodPost, "/api/v1/nodes/"+node+"/commands", map[string]any{"kind": "prepare_image",
				"operation_id": id, "payload": map[string]any{"image": "busybox"}}, http.StatusCreated, nil)
		}
		submit(a.NodeID, "sb-ok")
		submit(a.NodeID, "sb-no")
		submit(b.NodeID, "sb-other")
		var polled api.CommandsResponse
		s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=5", nil, sa.SessionToken, http.StatusOK, &polled)
		require.Len(t, polled.Commands, 2)
		var out api.ResultsResponse
		s.JSON(t, http.MethodPost, "/agent/v1/results", api.ResultsRequest{Results: []api.Result{
			{OperationID: "sb-ok", Applied: true},
			{OperationID: "sb-no", Failure: "disk full"},
			{OperationID: "sb-missing", Applied: true},
			{OperationID: "sb-other", Applied: true},
			{OperationID: "sb-ok", Failure: "changed my mind"},
		}}, sa.SessionToken, http.StatusOK, &out)
		require.Equal(t, []api.Settled{
			{OperationID: "sb-ok", State: "applied"},
			{OperationID: "sb-no", State: "refused", Code: "refused_by_node"},
			{OperationID: "sb-missing", Code: "unknown_operation"},
			{OperationID: "sb-other", Code: "not_this_node"},
			{OperationID: "sb-ok", State: "applied"},
		}, out.Settled)

		var op opJSON
		s.Admin(t, http.MethodGet, "/api/v1/operations/sb-ok", nil, http.StatusOK, &op)
		require.Equal(t, "succeeded", op.State)
		s.Admin(t, http.MethodGet, "/api/v1/operations/sb-no", nil, http.StatusOK, &op)
		require.Equal(t, "failed", op.State)
		require.NotNil(t, op.Error)
		s.Admin(t, http.MethodGet, "/api/v1/operations/sb-other", nil, http.StatusOK, &op)
		require.Equal(t, "pending", op.State, "another node's result changes nothing")
		eventTypes := func(id string) []string {
			var types []string
			require.NoError(t, s.App.DB.Raw("SELECT type FROM operation_events WHERE operation_id = ? ORDER BY seq", id).Scan(&types).Error)
			return types
		}
		require.Equal(t, []string{"submitted", "running", "succeeded"}, eventTypes("sb-ok"), "one end event")
		require.Equal(t, []string{"submitted", "running", "failed"}, eventTypes("sb-no"))

		// The other node settles its own, concurrently with a repeat of
		// the first request: each lands once.
		s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=5", nil, sb.SessionToken, http.StatusOK, &polled)
		require.Len(t, polled.Commands, 1)
		var wg sync.WaitGroup
		for _, sess := range []api.EnrollResponse{sa, sb, sa, sb} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.JSON(t, http.MethodPost, "/agent/v1/results", api.ResultsRequest{Results: []api.Result{
					{OperationID: "sb-other", Applied: true}, {OperationID: "sb-ok", Applied: true}}}, sess.SessionToken, http.StatusOK, nil)
			}()
		}
		wg.Wait()
		s.Admin(t, http.MethodGet, "/api/v1/operations/sb-other", nil, http.StatusOK, &op)
		require.Equal(t, "succeeded", op.State)
		require.Equal(t, []string{"submitted", "running", "succeeded"}, eventTypes("sb-other"), "settled once")
		require.Equal(t, []string{"submitted", "running", "succeeded"}, eventTypes("sb-ok"))
	})
}

// TestSettleRetiredNodeHTTP: a retired node still reports the result of a
// command it was delivered: the command takes it, while its operation
// keeps the end retirement gave it (failed, outcome_unknown: DECISIONS.md
// §3, §38) and gets no second end event; a command retirement refused
// answers that refusal, and stays as it was.
func TestSettleRetiredNodeHTTP(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		a, sa := inviteAndEnroll(t, s)
		submit := func(id string) {
			s.Admin(t, http.MethodPost, "/api/v1/nodes/"+a.NodeID+"/commands", map[string]any{"kind": "prepare_image",
				"operation_id": id, "payload": map[string]any{"image": "busybox"}}, http.StatusCreated, nil)
		}
		submit("sr-delivered")
		var polled api.CommandsResponse
		s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=5", nil, sa.SessionToken, http.StatusOK, &polled)
		require.Len(t, polled.Commands, 1)
		submit("sr-undelivered")
		s.Admin(t, http.MethodPost, "/api/v1/nodes/"+a.NodeID+"/retire", nil, http.StatusOK, nil)

		var out api.ResultsResponse
		for range 2 { // the second time changes nothing and answers the same
			s.JSON(t, http.MethodPost, "/agent/v1/results", api.ResultsRequest{Results: []api.Result{
				{OperationID: "sr-delivered", Applied: true},
				{OperationID: "sr-undelivered", Applied: true},
			}}, sa.SessionToken, http.StatusOK, &out)
			require.Equal(t, []api.Settled{
				{OperationID: "sr-delivered", State: "applied"},
				{OperationID: "sr-undelivered", State: "refused", Code: "node_retired"},
			}, out.Settled)
		}
		var op opJSON
		s.Admin(t, http.MethodGet, "/api/v1/operations/sr-delivered", nil, http.StatusOK, &op)
		require.Equal(t, "failed", op.State)
		require.Equal(t, "outcome_unknown", op.Error.Code)
		var cmd map[string]any
		s.Admin(t, http.MethodGet, "/api/v1/commands/sr-delivered", nil, http.StatusOK, &cmd)
		require.Equal(t, "applied", cmd["state"])
		s.Admin(t, http.MethodGet, "/api/v1/operations/sr-undelivered", nil, http.StatusOK, &op)
		require.Equal(t, "cancelled", op.State)
		require.Equal(t, "node_retired", op.Error.Code)
		eventTypes := func(id string) []string {
			var types []string
			require.NoError(t, s.App.DB.Raw("SELECT type FROM operation_events WHERE operation_id = ? ORDER BY seq", id).Scan(&types).Error)
			return types
		}
		require.Equal(t, []string{"submitted", "running", "failed"}, eventTypes("sr-delivered"))
		require.Equal(t, []string{"submitted", "cancelled"}, eventTypes("sr-undelivered"))
	})
}
