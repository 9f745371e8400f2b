package handlers_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/models"
)

// opJSON is the part of an operation the tests read.
type opJSON struct {
	Cursor            string            `json:"cursor"`
	OperationID       string            `json:"operation_id"`
	RequestID         string            `json:"request_id"`
	Kind              string            `json:"kind"`
	State             string            `json:"state"`
	Channel           string            `json:"channel"`
	Terminal          bool              `json:"terminal"`
	Targets           []ledger.Target   `json:"targets"`
	Result            map[string]any    `json:"result"`
	Error             *ledger.Error     `json:"error"`
	CancelRequestedAt *time.Time        `json:"cancel_requested_at"`
	Operation         map[string]any    `json:"operation"`
	Principal         map[string]string `json:"principal"`
}

type opPage struct {
	Operations []opJSON `json:"operations"`
	NextBefore *string  `json:"next_before"`
}

func inviteBody(requestID, rental string) map[string]any {
	return map[string]any{"request_id": requestID, "kind": ledger.KindNodeInvite,
		"operation": map[string]any{"rental_id": rental, "generation": 1}}
}

// submitAndWait submits body with a generous wait and requires the
// operation to have succeeded.
func submitAndWait(t *testing.T, s *apitest.Server, body map[string]any) opJSON {
	t.Helper()
	body["wait_timeout_ms"] = 60000
	var op opJSON
	s.Admin(t, http.MethodPost, "/api/v1/operations", body, http.StatusCreated, &op)
	require.Equal(t, "succeeded", op.State, "%+v", op)
	require.True(t, op.Terminal)
	return op
}

func TestOperationsSubmitHTTP(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		body := inviteBody("invite-1", apitest.RandomID("rental-"))
		status, h, raw := s.Do(t, http.MethodPost, "/api/v1/operations", body, s.AdminToken)
		require.Equal(t, http.StatusCreated, status, "%s", raw)
		var first opJSON
		require.NoError(t, json.Unmarshal(raw, &first))
		require.Equal(t, "/api/v1/operations/"+first.OperationID, h.Get("Location"))
		require.Equal(t, "invite-1", first.RequestID, "request_id is the client's key, answered as sent")
		require.Equal(t, ledger.KindNodeInvite, first.Kind)
		require.Len(t, first.Targets, 1, "the invite names its node before anything is recorded")
		require.Equal(t, "admin", first.Principal["kind"])

		t.Run("ReplayAnswersTheSameOperation", func(t *testing.T) {
			status, h, raw := s.Do(t, http.MethodPost, "/api/v1/operations", body, s.AdminToken)
			require.Equal(t, http.StatusOK, status, "%s", raw)
			var again opJSON
			require.NoError(t, json.Unmarshal(raw, &again))
			require.Equal(t, first.OperationID, again.OperationID)
			require.Equal(t, "/api/v1/operations/"+first.OperationID, h.Get("Location"))
		})
		t.Run("SameRequestIDOtherBodyConflicts", func(t *testing.T) {
			other := inviteBody("invite-1", apitest.RandomID("rental-"))
			p := s.Problem(t, http.MethodPost, "/api/v1/operations", other, s.AdminToken, http.StatusConflict, "request_conflict")
			require.NotEqual(t, "invite-1", p.RequestID, "a problem's request_id is the HTTP request's, not the idempotency key")
		})
		t.Run("UnknownKindIsNotServedAndNotRecorded", func(t *testing.T) {
			s.Problem(t, http.MethodPost, "/api/v1/operations", map[string]any{"request_id": "teleport-1", "kind": "node.teleport"},
				s.AdminToken, http.StatusNotImplemented, "kind_not_served")
			var page opPage
			s.Admin(t, http.MethodGet, "/api/v1/node-operations?request_id=teleport-1", nil, http.StatusOK, &page)
			require.Empty(t, page.Operations)
		})
		t.Run("RefusedBodies", func(t *testing.T) {
			before := dbtestCountOperations(t, s)
			for _, c := range []struct {
				name   string
				body   any
				status int
				code   string
				field  string
			}{
				{"BadRequestID", map[string]any{"request_id": "has space", "kind": ledger.KindNodeInvite}, 422, "validation_failed", "request_id"},
				{"MissingRequestID", map[string]any{"kind": ledger.KindNodeInvite}, 422, "validation_failed", "request_id"},
				{"LongRequestID", map[string]any{"request_id": strings.Repeat("a", 129), "kind": ledger.KindNodeInvite}, 422, "validation_failed", "request_id"},
				{"UnknownField", apitest.Raw(`{"request_id":"r-1","kind":"node.invite","surprise":true}`), 400, "invalid_json", ""},
				{"UnknownOperationField", apitest.Raw(`{"request_id":"r-1","kind":"node.invite","operation":{"rental_id":"x","generation":1,"surprise":1}}`), 400, "invalid_json", ""},
				{"TrailingData", apitest.Raw(`{"request_id":"r-1","kind":"node.invite"} {}`), 400, "invalid_json", ""},
				{"OperationNull", apitest.Raw(`{"request_id":"r-1","kind":"node.invite","operation":null}`), 422, "validation_failed", "operation"},
				{"OperationNotObject", apitest.Raw(`{"request_id":"r-1","kind":"node.retire","operation":[1]}`), 422, "validation_failed", "operation"},
				{"WaitTooLong", map[string]any{"request_id": "r-1", "kind": ledger.KindNodeInvite, "wait_timeout_ms": 60001}, 422, "validation_failed", "wait_timeout_ms"},
				{"WaitNegative", map[string]any{"request_id": "r-1", "kind": ledger.KindNodeInvite, "wait_timeout_ms": -1}, 422, "validation_failed", "wait_timeout_ms"},
				{"InviteGenerationZero", map[string]any{"request_id": "r-1", "kind": ledger.KindNodeInvite, "operation": map[string]any{"rental_id": "x", "generation": 0}}, 422, "validation_failed", ""},
				{"RetireWithoutTarget", map[string]any{"request_id": "r-1", "kind": ledger.KindNodeRetire}, 422, "validation_failed", "targets"},
				{"RetireUnknownNode", map[string]any{"request_id": "r-1", "kind": ledger.KindNodeRetire, "targets": []any{map[string]any{"kind": "node", "id": "no-such-node"}}}, 404, "not_found", ""},
			} {
				t.Run(c.name, func(t *testing.T) {
					p := s.Problem(t, http.MethodPost, "/api/v1/operations", c.body, s.AdminToken, c.status, c.code)
					if c.field != "" {
						var fields []string
						for _, e := range p.Errors {
							fields = append(fields, e.Field)
						}
						require.Contains(t, fields, c.field, "%s", p.Raw)
					}
				})
			}
			require.Equal(t, before, dbtestCountOperations(t, s), "a refused submit records nothing")
		})
		t.Run("WaitUntilTheInviteSucceeded", func(t *testing.T) {
			nodeID := apitest.RandomID("node-")
			body := map[string]any{"request_id": "invite-wait", "kind": ledger.KindNodeInvite,
				"targets":   []any{map[string]any{"kind": "node", "id": nodeID}},
				"operation": map[string]any{"rental_id": apitest.RandomID("rental-"), "generation": 1}}
			op := submitAndWait(t, s, body)
			require.Equal(t, nodeID, op.Result["node_id"])
			require.Nil(t, op.Error)

			// The enrollment token never enters the ledger: not in the
			// submit's answer, not in the operation read later.
			var boot struct {
				EnrollmentToken string `json:"enrollment_token"`
			}
			s.Admin(t, http.MethodPost, "/api/v1/nodes/"+nodeID+"/reinvite", nil, http.StatusOK, &boot)
			require.NotEmpty(t, boot.EnrollmentToken)
			_, _, raw := s.Do(t, http.MethodGet, "/api/v1/operations/"+op.OperationID, nil, s.AdminToken)
			require.NotContains(t, string(raw), "enrollment_token")
			require.NotContains(t, string(raw), boot.EnrollmentToken)
			_, _, raw = s.Do(t, http.MethodPost, "/api/v1/operations", body, s.AdminToken)
			require.NotContains(t, string(raw), boot.EnrollmentToken)

			t.Run("ReinviteAndRetire", func(t *testing.T) {
				target := []any{map[string]any{"kind": "node", "id": nodeID}}
				re := submitAndWait(t, s, map[string]any{"request_id": "reinvite-1", "kind": ledger.KindNodeReinvite, "targets": target})
				require.Equal(t, nodeID, re.Result["node_id"])
				ret := submitAndWait(t, s, map[string]any{"request_id": "retire-1", "kind": ledger.KindNodeRetire, "targets": target,
					"operation": map[string]any{"reason": "done"}})
				require.Equal(t, "retired", ret.Result["state"])
				require.Equal(t, false, ret.Result["already_retired"])
				s.Problem(t, http.MethodPost, "/api/v1/operations", map[string]any{"request_id": "reinvite-2", "kind": ledger.KindNodeReinvite, "targets": target},
					s.AdminToken, http.StatusGone, "node_retired")
			})
			t.Run("CancelOfAnEndedOperationAnswersItUnchanged", func(t *testing.T) {
				var got opJSON
				s.Admin(t, http.MethodPost, "/api/v1/operations/"+op.OperationID+"/cancel", map[string]any{"reason": "too late"}, http.StatusOK, &got)
				require.Equal(t, "succeeded", got.State)
				require.Nil(t, got.CancelRequestedAt)
				s.Admin(t, http.MethodPost, "/api/v1/operations/"+op.OperationID+"/cancel", nil, http.StatusOK, &got)
				require.Equal(t, "succeeded", got.State)
			})
		})
		t.Run("UnknownOperation", func(t *testing.T) {
			s.Problem(t, http.MethodGet, "/api/v1/operations/"+uuid.NewString(), nil, s.AdminToken, http.StatusNotFound, "not_found")
			s.Problem(t, http.MethodPost, "/api/v1/operations/"+uuid.NewString()+"/cancel", nil, s.AdminToken, http.StatusNotFound, "not_found")
			s.Problem(t, http.MethodGet, "/api/v1/operations/"+uuid.NewString()+"/watch", nil, s.AdminToken, http.StatusNotFound, "not_found")
		})
		t.Run("Unauthenticated", func(t *testing.T) {
			s.Problem(t, http.MethodPost, "/api/v1/operations", inviteBody("anon-1", "r"), "", http.StatusUnauthorized, "unauthenticated")
			s.Problem(t, http.MethodGet, "/api/v1/node-operations", nil, "", http.StatusUnauthorized, "unauthenticated")
		})
	})
}

func dbtestCountOperations(t *testing.T, s *apitest.Server) int64 {
	t.Helper()
	var n int64
	require.NoError(t, s.App.DB.DB.Model(&models.Operation{}).Count(&n).Error)
	return n
}

// insertOpenOperations records n pending command operations for a node
// straight into the table: no dispatcher claims them (they wait for a node
// on the long-poll channel), so they stay open until cancelled. It answers
// their ids.
func insertOpenOperations(t *testing.T, s *apitest.Server, nodeID string, n int) []string {
	t.Helper()
	now := time.Now().UTC()
	rows := make([]models.Operation, n)
	ids := make([]string, n)
	for i := range rows {
		ids[i] = uuid.NewString()
		rows[i] = models.Operation{ID: ids[i], RequestID: "open-" + ids[i], Digest: strings.Repeat("0", 64),
			PrincipalKind: "admin", PrincipalID: s.AdminUserID, PrincipalName: apitest.AdminUsername, Family: "commands",
			Kind: "node.prepare_image", State: "pending", Channel: "long_poll", Held: true, Targets: `[{"kind":"node","id":"` + nodeID + `"}]`,
			TargetKind: "node", TargetID: nodeID, Operation: `{"image":"busybox"}`, CreatedAt: now, Deadline: now.Add(time.Hour), UpdatedAt: now}
	}
	require.NoError(t, s.App.DB.DB.Create(&rows).Error)
	return ids
}

// TestOperationsQuotaHTTP fills a node's quota of open operations (rows
// held pending on the node channel, as fan-out children waiting for a
// slot: no dispatcher claims them) and checks
// the refusal a script sees: 429 with Retry-After, nothing recorded.
func TestOperationsQuotaHTTP(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		nodeID := apitest.RandomID("node-")
		target := []any{map[string]any{"kind": "node", "id": nodeID}}
		invite := func() map[string]any {
			return map[string]any{"request_id": "invite-q", "kind": ledger.KindNodeInvite, "targets": target,
				"operation": map[string]any{"rental_id": "rental-q", "generation": 1}}
		}
		submitAndWait(t, s, invite())
		insertOpenOperations(t, s, nodeID, s.App.Ledger.Settings().NodeQuota)
		before := dbtestCountOperations(t, s)

		status, h, raw := s.Do(t, http.MethodPost, "/api/v1/operations", map[string]any{"request_id": "reinvite-q", "kind": ledger.KindNodeReinvite, "targets": target}, s.AdminToken)
		apitest.RequireProblem(t, status, h, raw, http.StatusTooManyRequests, "quota_exceeded")
		require.NotEmpty(t, h.Get("Retry-After"))
		require.Equal(t, before, dbtestCountOperations(t, s), "a refused submit records nothing")

		// A replay still answers while the quota is full (DECISIONS.md §13).
		var again opJSON
		s.Admin(t, http.MethodPost, "/api/v1/operations", invite(), http.StatusOK, &again)
		require.Equal(t, "succeeded", again.State)
		// Retiring is exempt: it must always be possible.
		ret := submitAndWait(t, s, map[string]any{"request_id": "retire-q", "kind": ledger.KindNodeRetire, "targets": target})
		require.Equal(t, "retired", ret.Result["state"])
	})
}

func TestOperationsListingHTTP(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		ctx := context.Background()
		admin := ledger.Principal{Kind: ledger.PrincipalAdmin, ID: s.AdminUserID, Name: apitest.AdminUsername}
		// A few hundred operations, submitted straight to the ledger (the
		// listing is what is under test here, not the submit).
		const total = 260
		for i := 0; i < total; i++ {
			op, err := json.Marshal(map[string]any{"rental_id": "bulk-" + strconv.Itoa(i), "generation": 1})
			require.NoError(t, err)
			_, created, err := s.App.Ledger.Submit(ctx, admin, ledger.Submission{RequestID: "bulk-" + strconv.Itoa(i), Kind: ledger.KindNodeInvite, Operation: op})
			require.NoError(t, err)
			require.True(t, created)
		}
		invite := submitAndWait(t, s, inviteBody("special-invite", apitest.RandomID("rental-")))
		nodeID := invite.Targets[0].ID
		retire := submitAndWait(t, s, map[string]any{"request_id": "special-retire", "kind": ledger.KindNodeRetire,
			"targets": []any{map[string]any{"kind": "node", "id": nodeID}}})

		list := func(t *testing.T, q url.Values) opPage {
			t.Helper()
			var page opPage
			s.Admin(t, http.MethodGet, "/api/v1/node-operations?"+q.Encode(), nil, http.StatusOK, &page)
			return page
		}
		ids := func(p opPage) []string {
			var out []string
			for _, o := range p.Operations {
				out = append(out, o.OperationID)
			}
			return out
		}

		t.Run("Filters", func(t *testing.T) {
			require.Equal(t, []string{retire.OperationID}, ids(list(t, url.Values{"kind": {ledger.KindNodeRetire}})))
			require.Equal(t, []string{invite.OperationID}, ids(list(t, url.Values{"request_id": {"special-invite"}})))
			require.Equal(t, []string{retire.OperationID}, ids(list(t, url.Values{"operation_id": {retire.OperationID}})))
			require.Equal(t, []string{retire.OperationID, invite.OperationID},
				ids(list(t, url.Values{"target_kind": {"node"}, "target_id": {nodeID}})), "newest first")
			require.Equal(t, []string{retire.OperationID}, ids(list(t, url.Values{"target_id": {nodeID}, "kind": {ledger.KindNodeRetire}})), "filters combine")
			require.Len(t, list(t, url.Values{"family": {"nodes"}, "limit": {"500"}}).Operations, total+2)
			require.Empty(t, list(t, url.Values{"family": {"commands"}}).Operations)
			require.Empty(t, list(t, url.Values{"parent": {retire.OperationID}}).Operations)
			require.Empty(t, list(t, url.Values{"package_host_id": {"ph-1"}}).Operations, "administrators' operations belong to no package host")
			require.Empty(t, list(t, url.Values{"state": {"cancelled"}}).Operations)
			for _, o := range list(t, url.Values{"state": {"succeeded"}, "limit": {"500"}}).Operations {
				require.Equal(t, "succeeded", o.State)
			}
			older := list(t, url.Values{"before": {retire.Cursor}, "limit": {"1"}})
			require.Equal(t, []string{invite.OperationID}, ids(older), "before pages past the cursor")
			require.NotNil(t, older.NextBefore)
		})
		t.Run("BadFilters", func(t *testing.T) {
			for _, q := range []struct{ query, param string }{
				{"state=bogus", "state"},
				{"state=", "state"},
				{"kind=", "kind"},
				{"kind=node.bogus", "kind"},
				{"family=bogus", "family"},
				{"target_kind=bogus", "target_kind"},
				{"family=nodes&target_kind=Node", "target_kind"},
				{"target_id=", "target_id"},
				{"kind=a&kind=b", "kind"},
				{"request_id=has%20space", "request_id"},
				{"before=%2B5", "before"},
				{"before=abc", "before"},
				{"before=0", "before"},
				{"before=007", "before"},
				{"before=", "before"},
				{"before=99999999999999999999", "before"},
				{"limit=0", "limit"},
				{"limit=501", "limit"},
				{"limit=ten", "limit"},
				{"package_host_id=" + strings.Repeat("x", 257), "package_host_id"},
			} {
				t.Run(q.query[:min(len(q.query), 24)], func(t *testing.T) {
					p := s.Problem(t, http.MethodGet, "/api/v1/node-operations?"+q.query, nil, s.AdminToken, http.StatusBadRequest, "invalid_parameter")
					require.Len(t, p.Errors, 1, "%s", p.Raw)
					require.Equal(t, q.param, p.Errors[0].Field)
				})
			}
		})
		t.Run("CursorPaging", func(t *testing.T) {
			seen := map[string]bool{}
			var last int64
			q := url.Values{"limit": {"37"}}
			pages := 0
			for {
				page := list(t, q)
				pages++
				require.LessOrEqual(t, len(page.Operations), 37)
				for _, o := range page.Operations {
					require.False(t, seen[o.OperationID], "operation %s twice", o.OperationID)
					seen[o.OperationID] = true
					c, err := strconv.ParseInt(o.Cursor, 10, 64)
					require.NoError(t, err)
					if last != 0 {
						require.Less(t, c, last, "newest first")
					}
					last = c
				}
				if page.NextBefore == nil {
					break
				}
				require.Len(t, page.Operations, 37, "only a full page has a next")
				q.Set("before", *page.NextBefore)
				require.Less(t, pages, 100, "paging must end")
			}
			require.Len(t, seen, total+2, "every operation once")
		})
	})
}

// sseMessage is one server-sent event as a client reads it.
type sseMessage struct {
	ID, Event, Data string
}

// readSSE reads messages until the server closes the stream.
func readSSE(t *testing.T, s *apitest.Server, path, lastEventID string) []sseMessage {
	t.Helper()
	req := s.NewRequest(t, http.MethodGet, path, nil, s.AdminToken)
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp, err := s.Client.Do(req.WithContext(ctx))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	var out []sseMessage
	var cur sseMessage
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			out = append(out, cur)
			cur = sseMessage{}
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "id":
			cur.ID = value
		case "event":
			cur.Event = value
		case "data":
			cur.Data += value
		}
	}
	require.NoError(t, sc.Err(), "the stream ends by the server closing it")
	return out
}

func TestOperationWatchHTTP(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		op := submitAndWait(t, s, inviteBody("watch-1", apitest.RandomID("rental-")))
		path := "/api/v1/operations/" + op.OperationID + "/watch"
		eventSchema := apitest.ProductContract(t).Doc.Components.Schemas["OperationEvent"].Value

		all := readSSE(t, s, path, "")
		var types []string
		for i, m := range all {
			types = append(types, m.Event)
			require.NotEmpty(t, m.ID, "every event has an id: line")
			var ev map[string]any
			require.NoError(t, json.Unmarshal([]byte(m.Data), &ev))
			require.NoError(t, eventSchema.VisitJSON(ev), "data: matches OperationEvent")
			require.Equal(t, m.ID, ev["cursor"])
			require.Equal(t, m.Event, ev["type"])
			require.Equal(t, op.OperationID, ev["operation_id"])
			if i > 0 {
				prev, _ := strconv.ParseInt(all[i-1].ID, 10, 64)
				cur, _ := strconv.ParseInt(m.ID, 10, 64)
				require.Greater(t, cur, prev)
			}
		}
		require.Equal(t, []string{"submitted", "running", "succeeded"}, types, "an ended operation's watch replays its events and closes")

		resumed := readSSE(t, s, path, all[0].ID)
		require.Equal(t, all[1:], resumed, "Last-Event-ID resumes after the event given")
		require.Empty(t, readSSE(t, s, path, all[2].ID), "nothing after the last event")

		t.Run("LiveStreamEndsWithTheOperation", func(t *testing.T) {
			id := insertOpenOperations(t, s, apitest.RandomID("node-"), 1)[0]
			req := s.NewRequest(t, http.MethodGet, "/api/v1/operations/"+id+"/watch", nil, s.AdminToken)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			resp, err := s.Client.Do(req.WithContext(ctx))
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)

			// The stream is open and the operation pending: cancelling it
			// ends it at once, and the watcher sees the end and is let go.
			var got opJSON
			s.Admin(t, http.MethodPost, "/api/v1/operations/"+id+"/cancel", map[string]any{"reason": "changed my mind"}, http.StatusOK, &got)
			require.Equal(t, "cancelled", got.State)
			require.NotNil(t, got.CancelRequestedAt)
			require.Equal(t, "cancelled", got.Error.Code)
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err, "the server closes the stream once the operation ended")
			require.Contains(t, string(body), "event: cancelled\n")
		})

		for _, bad := range []string{"abc", "0", "-1", "+5"} {
			req := s.NewRequest(t, http.MethodGet, path, nil, s.AdminToken)
			req.Header.Set("Last-Event-ID", bad)
			status, h, raw := s.Send(t, req)
			apitest.RequireProblem(t, status, h, raw, http.StatusBadRequest, "invalid_parameter")
		}
	})
}
