package handlers_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/apitest"
)

// TestCommandOperationsHTTP: a command submitted through the ledger or the
// wrapper is one operation with the command's id, and it follows the
// command: running once delivered, succeeded once the node answered.
func TestCommandOperationsHTTP(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		boot, sess := inviteAndEnroll(t, s)
		target := []any{map[string]any{"kind": "node", "id": boot.NodeID}}
		var op opJSON
		s.Admin(t, http.MethodPost, "/api/v1/operations", map[string]any{"request_id": "cmd-1", "kind": "node.prepare_image",
			"targets": target, "operation": map[string]any{"image": "busybox:1"}}, http.StatusCreated, &op)
		require.Equal(t, "pending", op.State)
		require.Equal(t, "long_poll", op.Channel)
		var cmd map[string]any
		s.Admin(t, http.MethodGet, "/api/v1/commands/"+op.OperationID, nil, http.StatusOK, &cmd)
		require.Equal(t, "prepare_image", cmd["kind"], "the command shares the operation's id")

		var polled api.CommandsResponse
		s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=5", nil, sess.SessionToken, http.StatusOK, &polled)
		require.Len(t, polled.Commands, 1)
		s.Admin(t, http.MethodGet, "/api/v1/operations/"+op.OperationID, nil, http.StatusOK, &op)
		require.Equal(t, "running", op.State)
		s.JSON(t, http.MethodPost, "/agent/v1/results", api.ResultsRequest{Results: []api.Result{{OperationID: op.OperationID, Applied: true}}},
			sess.SessionToken, http.StatusOK, nil)
		s.Admin(t, http.MethodGet, "/api/v1/operations/"+op.OperationID, nil, http.StatusOK, &op)
		require.Equal(t, "succeeded", op.State)

		// The wrapper: the caller's operation_id is the operation's id;
		// a pending command's operation is withdrawn by a cancel.
		path := "/api/v1/nodes/" + boot.NodeID + "/commands"
		s.Admin(t, http.MethodPost, path, map[string]any{"kind": "prepare_image", "operation_id": "wrapped-1",
			"payload": map[string]any{"image": "alpine"}}, http.StatusCreated, &cmd)
		s.Admin(t, http.MethodPost, "/api/v1/operations/wrapped-1/cancel", map[string]any{"reason": "no"}, http.StatusOK, &op)
		require.Equal(t, "cancelled", op.State)
		s.Admin(t, http.MethodGet, "/api/v1/commands/wrapped-1", nil, http.StatusOK, &cmd)
		require.Equal(t, "cancelled", cmd["state"])
		s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=0", nil, sess.SessionToken, http.StatusOK, &polled)
		require.Empty(t, polled.Commands, "a withdrawn command is never delivered")
		var list map[string][]map[string]any
		s.Admin(t, http.MethodGet, path+"?state=cancelled", nil, http.StatusOK, &list)
		require.Len(t, list["commands"], 1)
	})
}

// TestFleetCommandHTTP: a fan-out over two nodes ends succeeded with its
// counts once both nodes answered.
func TestFleetCommandHTTP(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		a, sa := inviteAndEnroll(t, s)
		b, sb := inviteAndEnroll(t, s)
		var parent opJSON
		s.Admin(t, http.MethodPost, "/api/v1/operations", map[string]any{"request_id": "fan-1", "kind": "fleet.command",
			"targets":   []any{map[string]any{"kind": "node", "id": a.NodeID}, map[string]any{"kind": "node", "id": b.NodeID}},
			"operation": map[string]any{"kind": "node.prepare_image", "payload": map[string]any{"image": "x"}, "max_concurrency": 1}},
			http.StatusCreated, &parent)
		for _, sess := range []api.EnrollResponse{sa, sb} {
			var polled api.CommandsResponse
			deadline := time.Now().Add(30 * time.Second)
			for len(polled.Commands) == 0 && time.Now().Before(deadline) {
				s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=5", nil, sess.SessionToken, http.StatusOK, &polled)
			}
			require.Len(t, polled.Commands, 1, "each node is handed its child in turn")
			s.JSON(t, http.MethodPost, "/agent/v1/results", api.ResultsRequest{Results: []api.Result{{OperationID: polled.Commands[0].OperationID, Applied: true}}},
				sess.SessionToken, http.StatusOK, nil)
		}
		var done opJSON
		s.Admin(t, http.MethodPost, "/api/v1/operations", map[string]any{"request_id": "fan-1", "kind": "fleet.command",
			"targets":         []any{map[string]any{"kind": "node", "id": a.NodeID}, map[string]any{"kind": "node", "id": b.NodeID}},
			"operation":       map[string]any{"kind": "node.prepare_image", "payload": map[string]any{"image": "x"}, "max_concurrency": 1},
			"wait_timeout_ms": 30000}, http.StatusOK, &done)
		require.Equal(t, "succeeded", done.State)
		var page struct {
			Operations []opJSON `json:"operations"`
		}
		s.Admin(t, http.MethodGet, "/api/v1/node-operations?parent="+parent.OperationID, nil, http.StatusOK, &page)
		require.Len(t, page.Operations, 2)
	})
}

// TestNodeWrapperReplays: with an Idempotency-Key, inviting again answers
// the same bootstrap and the identical token (an administrator's replay).
func TestNodeWrapperReplays(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		body := map[string]any{"rental_id": apitest.RandomID("rep"), "generation": 1}
		first := inviteWithKey(t, s, body, "invite-key-1", http.StatusCreated)
		again := inviteWithKey(t, s, body, "invite-key-1", http.StatusOK)
		require.Equal(t, first, again)
		require.NotEmpty(t, first.EnrollmentToken)
		// Shown again, so audited again: the secret audit has the replay.
		var audit struct {
			Entries []struct {
				RequestID   string  `json:"request_id"`
				OperationID *string `json:"operation_id"`
				Field       string  `json:"field"`
			} `json:"entries"`
		}
		s.Admin(t, http.MethodGet, "/api/v1/secret-audit?action=reveal&outcome=replayed", nil, http.StatusOK, &audit)
		require.Len(t, audit.Entries, 1)
		require.Equal(t, "invite-key-1", audit.Entries[0].RequestID)
		require.Equal(t, "enrollment_token", audit.Entries[0].Field)
		require.NotNil(t, audit.Entries[0].OperationID)
		body["generation"] = 2
		req := s.NewRequest(t, http.MethodPost, "/api/v1/nodes/invitations", body, s.AdminToken)
		req.Header.Set("Idempotency-Key", "invite-key-1")
		status, _, raw := s.Send(t, req)
		require.Equal(t, http.StatusConflict, status, "the same key with another body: %s", raw)

		// The command wrapper: the same key with another operation_id is
		// another request, never a replay of the first command.
		boot, _ := inviteAndEnroll(t, s)
		path := "/api/v1/nodes/" + boot.NodeID + "/commands"
		command := func(operationID string, want int) []byte {
			req := s.NewRequest(t, http.MethodPost, path, map[string]any{"kind": "prepare_image", "operation_id": operationID,
				"payload": map[string]any{"image": "alpine"}}, s.AdminToken)
			req.Header.Set("Idempotency-Key", "command-key-1")
			status, h, raw := s.Send(t, req)
			if want == http.StatusConflict {
				apitest.RequireProblem(t, status, h, raw, want, "request_conflict")
			}
			require.Equal(t, want, status, "%s", raw)
			return raw
		}
		command("keyed-1", http.StatusCreated)
		command("keyed-1", http.StatusOK)
		command("keyed-2", http.StatusConflict)
		s.Problem(t, http.MethodGet, "/api/v1/commands/keyed-2", nil, s.AdminToken, http.StatusNotFound, "not_found")

		// A malformed key is refused naming the header, at every wrapper.
		for _, call := range []struct {
			path string
			body any
		}{
			{"/api/v1/nodes/invitations", map[string]any{"rental_id": apitest.RandomID("rep"), "generation": 1}},
			{"/api/v1/nodes/" + boot.NodeID + "/reinvite", map[string]any{}},
			{"/api/v1/nodes/" + boot.NodeID + "/retire", map[string]any{}},
			{path, map[string]any{"kind": "prepare_image", "operation_id": "keyed-3", "payload": map[string]any{"image": "alpine"}}},
		} {
			req := s.NewRequest(t, http.MethodPost, call.path, call.body, s.AdminToken)
			req.Header.Set("Idempotency-Key", "has space")
			status, h, raw := s.Send(t, req)
			p := apitest.RequireProblem(t, status, h, raw, http.StatusBadRequest, "invalid_parameter")
			require.Equal(t, "Idempotency-Key", p.Errors[0].Field, "%s", call.path)
		}
		var n struct {
			State string `json:"state"`
		}
		s.Admin(t, http.MethodGet, "/api/v1/nodes/"+boot.NodeID, nil, http.StatusOK, &n)
		require.Equal(t, "ready", n.State, "the refused retire changed nothing")
	})
}

func inviteWithKey(t *testing.T, s *apitest.Server, body map[string]any, key string, want int) api.Bootstrap {
	t.Helper()
	req := s.NewRequest(t, http.MethodPost, "/api/v1/nodes/invitations", body, s.AdminToken)
	req.Header.Set("Idempotency-Key", key)
	status, _, raw := s.Send(t, req)
	require.Equal(t, want, status, "%s", raw)
	var out api.Bootstrap
	require.NoError(t, json.Unmarshal(raw, &out))
	return out
}

// TestNodeTimelineHTTP: a node's audit and its operations' events read as
// one timeline, newest first.
func TestNodeTimelineHTTP(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		boot, _ := inviteAndEnroll(t, s)
		var op opJSON
		s.Admin(t, http.MethodPost, "/api/v1/operations", map[string]any{"request_id": "tl-1", "kind": "node.prepare_image",
			"targets": []any{map[string]any{"kind": "node", "id": boot.NodeID}}, "operation": map[string]any{"image": "x"}},
			http.StatusCreated, &op)
		var tl struct {
			Entries []struct {
				At          time.Time `json:"at"`
				Source      string    `json:"source"`
				Action      string    `json:"action"`
				OperationID *string   `json:"operation_id"`
			} `json:"entries"`
		}
		s.Admin(t, http.MethodGet, "/api/v1/nodes/"+boot.NodeID+"/timeline", nil, http.StatusOK, &tl)
		sources := map[string]bool{}
		for i, e := range tl.Entries {
			sources[e.Source] = true
			if i > 0 {
				require.False(t, e.At.After(tl.Entries[i-1].At), "newest first")
			}
		}
		require.True(t, sources["node"] && sources["operation"], "both trails: %+v", tl.Entries)
		require.Equal(t, "submitted", tl.Entries[0].Action)
		require.Equal(t, op.OperationID, *tl.Entries[0].OperationID)
		s.Problem(t, http.MethodGet, "/api/v1/nodes/ghost/timeline", nil, s.AdminToken, http.StatusNotFound, "not_found")
	})
}

// TestListingsPageByCursor: the node's commands (newest first), its audit
// and the API tokens page with before = next_before until a page is not
// full, every row once.
func TestListingsPageByCursor(t *testing.T) {
	t.Parallel()
	s := apitest.Start(t)
	boot, _ := inviteAndEnroll(t, s)
	node := "/api/v1/nodes/" + boot.NodeID
	for i := range 5 {
		s.Admin(t, http.MethodPost, node+"/commands", map[string]any{"kind": "prepare_image",
			"operation_id": fmt.Sprintf("page-%d", i), "payload": map[string]any{"image": "alpine"}}, http.StatusCreated, nil)
		s.Admin(t, http.MethodPost, "/api/v1/tokens", map[string]any{"name": fmt.Sprintf("page-%d", i)}, http.StatusCreated, nil)
	}
	// walk pages the listing at path, answering every row's key in order.
	walk := func(path, rows, key string) []string {
		var keys []string
		next := ""
		for pages := 0; ; pages++ {
			require.Less(t, pages, 20, "the paging ends")
			url := path + "?limit=2"
			if next != "" {
				url += "&before=" + next
			}
			var page map[string]json.RawMessage
			s.Admin(t, http.MethodGet, url, nil, http.StatusOK, &page)
			var items []map[string]any
			require.NoError(t, json.Unmarshal(page[rows], &items))
			for _, it := range items {
				keys = append(keys, fmt.Sprint(it[key]))
			}
			var cursor *string
			require.NoError(t, json.Unmarshal(page["next_before"], &cursor))
			if cursor == nil {
				require.Less(t, len(items), 2, "only a page that is not full ends the listing")
				return keys
			}
			require.Len(t, items, 2)
			next = *cursor
		}
	}
	require.Equal(t, []string{"page-4", "page-3", "page-2", "page-1", "page-0"}, walk(node+"/commands", "commands", "operation_id"), "newest first")
	tokens := walk("/api/v1/tokens", "tokens", "name")
	require.Len(t, tokens, 6, "the administrator's own token and five more: %v", tokens)
	require.Equal(t, []string{"page-4", "page-3", "page-2", "page-1", "page-0"}, tokens[:5])
	audit := walk(node+"/audit", "entries", "id")
	require.GreaterOrEqual(t, len(audit), 2, "invited and enrolled at least")
	seen := map[string]bool{}
	for _, id := range audit {
		require.False(t, seen[id], "entry %s listed twice", id)
		seen[id] = true
	}
	s.Problem(t, http.MethodGet, node+"/commands?before=not-a-cursor", nil, s.AdminToken, http.StatusBadRequest, "invalid_parameter")
	s.Problem(t, http.MethodGet, "/api/v1/tokens?before=not-a-cursor", nil, s.AdminToken, http.StatusBadRequest, "invalid_parameter")
	s.Problem(t, http.MethodGet, node+"/audit?before=abc", nil, s.AdminToken, http.StatusBadRequest, "invalid_parameter")
	s.Problem(t, http.MethodGet, node+"/timeline?before=1", nil, s.AdminToken, http.StatusBadRequest, "invalid_parameter")
}
