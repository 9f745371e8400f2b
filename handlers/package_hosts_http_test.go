package handlers_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

type packageHostJSON struct {
	PackageHostID string     `json:"package_host_id"`
	Name          string     `json:"name"`
	Families      []string   `json:"families"`
	Generation    int64      `json:"generation"`
	CreatedAt     time.Time  `json:"created_at"`
	RevokedAt     *time.Time `json:"revoked_at"`
	Token         string     `json:"token"`
	OperationID   string     `json:"operation_id"`
}

type hostOpJSON struct {
	OperationID   string  `json:"operation_id"`
	Kind          string  `json:"kind"`
	State         string  `json:"state"`
	PackageHostID *string `json:"package_host_id"`
	Result        struct {
		PackageHostID string `json:"package_host_id"`
		Generation    int64  `json:"generation"`
		Token         string `json:"token"`
	} `json:"result"`
}

func createHost(t *testing.T, s *apitest.Server, name string, families ...string) packageHostJSON {
	t.Helper()
	var h packageHostJSON
	status, hd, raw := s.Do(t, http.MethodPost, "/api/v1/package-hosts", map[string]any{"name": name, "families": families}, s.AdminToken)
	require.Equal(t, http.StatusCreated, status, "%s", raw)
	require.NoError(t, json.Unmarshal(raw, &h))
	require.Equal(t, "no-store", hd.Get("Cache-Control"))
	require.True(t, strings.HasPrefix(h.Token, "nwh_"), "token %q", h.Token)
	require.Equal(t, name, h.Name)
	require.Equal(t, int64(1), h.Generation)
	require.Nil(t, h.RevokedAt)
	return h
}

func inviteOp() map[string]any {
	return map[string]any{"request_id": apitest.RandomID("rq-"), "kind": "node.invite",
		"operation": map[string]any{"rental_id": apitest.RandomID("r"), "generation": 1}, "wait_timeout_ms": 20000}
}

// hostRows is what a refused package host request must leave unchanged.
func hostRows(t *testing.T, s *apitest.Server) [4]int64 {
	t.Helper()
	db := s.App.DB.DB
	return [4]int64{dbtest.Count(t, db, &models.PackageHost{}), dbtest.Count(t, db, &models.PackageHostToken{}),
		dbtest.Count(t, db, &models.Operation{}), dbtest.Count(t, db, &models.AdminAudit{})}
}

func TestPackageHostsHTTP(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		h := createHost(t, s, "deployer", "nodes")
		require.Equal(t, []string{"nodes"}, h.Families)
		other := createHost(t, s, "builder", "commands")

		t.Run("TokenSubmitsGrantedKinds", func(t *testing.T) {
			var op hostOpJSON
			s.JSON(t, http.MethodPost, "/api/v1/operations", inviteOp(), h.Token, http.StatusCreated, &op)
			require.Equal(t, "succeeded", op.State)
			require.Equal(t, h.PackageHostID, *op.PackageHostID)
		})
		t.Run("EverythingElseIsDenied", func(t *testing.T) {
			before := hostRows(t, s)
			s.Problem(t, http.MethodPost, "/api/v1/operations", inviteOp(), other.Token, http.StatusForbidden, "permission_denied")
			for _, kind := range []string{"credential.issue", "credential.revoke"} {
				for _, tok := range []string{h.Token, other.Token} {
					s.Problem(t, http.MethodPost, "/api/v1/operations", map[string]any{"request_id": apitest.RandomID("rq-"),
						"kind": kind, "targets": []map[string]string{{"kind": "package_host", "id": h.PackageHostID}}, "operation": map[string]any{}},
						tok, http.StatusForbidden, "permission_denied")
				}
			}
			s.Problem(t, http.MethodGet, "/api/v1/nodes", nil, h.Token, http.StatusForbidden, "permission_denied")
			s.Problem(t, http.MethodGet, "/api/v1/whoami", nil, h.Token, http.StatusForbidden, "permission_denied")
			s.Problem(t, http.MethodPost, "/api/v1/tokens", map[string]string{"name": "mine"}, h.Token, http.StatusForbidden, "permission_denied")
			s.Problem(t, http.MethodGet, "/api/v1/package-hosts", nil, h.Token, http.StatusForbidden, "permission_denied")
			s.Problem(t, http.MethodPost, "/api/v1/package-hosts", map[string]any{"name": "x", "families": []string{"nodes"}},
				h.Token, http.StatusForbidden, "permission_denied")
			s.Problem(t, http.MethodPost, "/api/v1/package-hosts/"+h.PackageHostID+"/revoke", nil, h.Token, http.StatusForbidden, "permission_denied")
			s.Problem(t, http.MethodGet, "/api/v1/no-such-thing", nil, h.Token, http.StatusForbidden, "permission_denied")
			require.Equal(t, before, hostRows(t, s), "nothing recorded")
		})
		t.Run("NoOrForgedCredentialIs401", func(t *testing.T) {
			forged := "nwh_" + strings.Repeat("A", 43)
			for _, tok := range []string{"", forged, h.Token + "x"} {
				s.Problem(t, http.MethodGet, "/api/v1/package-hosts", nil, tok, http.StatusUnauthorized, "unauthenticated")
				s.Problem(t, http.MethodPost, "/api/v1/package-hosts", map[string]any{"name": "x", "families": []string{"nodes"}},
					tok, http.StatusUnauthorized, "unauthenticated")
				s.Problem(t, http.MethodPost, "/api/v1/operations", inviteOp(), tok, http.StatusUnauthorized, "unauthenticated")
			}
		})
		t.Run("HostSeesItsOwnOperationsOnly", func(t *testing.T) {
			var mine hostOpJSON
			s.JSON(t, http.MethodPost, "/api/v1/operations", inviteOp(), h.Token, http.StatusCreated, &mine)
			var admins hostOpJSON
			s.JSON(t, http.MethodPost, "/api/v1/operations", inviteOp(), s.AdminToken, http.StatusCreated, &admins)

			var list struct {
				Operations []hostOpJSON `json:"operations"`
			}
			s.JSON(t, http.MethodGet, "/api/v1/node-operations?limit=500", nil, h.Token, http.StatusOK, &list)
			require.NotEmpty(t, list.Operations)
			for _, o := range list.Operations {
				require.NotNil(t, o.PackageHostID, "operation %s", o.OperationID)
				require.Equal(t, h.PackageHostID, *o.PackageHostID)
			}
			s.JSON(t, http.MethodGet, "/api/v1/node-operations?package_host_id="+other.PackageHostID, nil, h.Token, http.StatusOK, &list)
			for _, o := range list.Operations {
				require.Equal(t, h.PackageHostID, *o.PackageHostID, "its own, whatever it asks")
			}
			s.JSON(t, http.MethodGet, "/api/v1/operations/"+mine.OperationID, nil, h.Token, http.StatusOK, nil)
			s.Problem(t, http.MethodGet, "/api/v1/operations/"+admins.OperationID, nil, h.Token, http.StatusNotFound, "not_found")
		})
		t.Run("RevokeStopsTheToken", func(t *testing.T) {
			r := createHost(t, s, "short-lived", "nodes")
			var got packageHostJSON
			s.Admin(t, http.MethodPost, "/api/v1/package-hosts/"+r.PackageHostID+"/revoke", nil, http.StatusOK, &got)
			require.Equal(t, int64(2), got.Generation)
			require.NotNil(t, got.RevokedAt)
			require.Empty(t, got.Token)
			s.Problem(t, http.MethodGet, "/api/v1/node-operations", nil, r.Token, http.StatusUnauthorized, "unauthenticated")
			s.Problem(t, http.MethodPost, "/api/v1/operations", inviteOp(), r.Token, http.StatusUnauthorized, "unauthenticated")

			// A new token lifts the revocation.
			var again packageHostJSON
			s.Admin(t, http.MethodPost, "/api/v1/package-hosts/"+r.PackageHostID+"/tokens", nil, http.StatusCreated, &again)
			require.Equal(t, int64(3), again.Generation)
			require.Nil(t, again.RevokedAt)
			s.JSON(t, http.MethodGet, "/api/v1/node-operations", nil, again.Token, http.StatusOK, nil)
			s.Problem(t, http.MethodGet, "/api/v1/node-operations", nil, r.Token, http.StatusUnauthorized, "unauthenticated")
		})
		t.Run("IssueOnExistingHostReplacesTheToken", func(t *testing.T) {
			r := createHost(t, s, "rotating", "nodes")
			var next packageHostJSON
			s.Admin(t, http.MethodPost, "/api/v1/package-hosts/"+r.PackageHostID+"/tokens", map[string]any{}, http.StatusCreated, &next)
			require.Equal(t, int64(2), next.Generation)
			require.NotEqual(t, r.Token, next.Token)
			s.JSON(t, http.MethodPost, "/api/v1/operations", inviteOp(), next.Token, http.StatusCreated, nil)
			s.Problem(t, http.MethodPost, "/api/v1/operations", inviteOp(), r.Token, http.StatusUnauthorized, "unauthenticated")

			// The same through the ledger: the result names the host and
			// generation, never the token.
			var op hostOpJSON
			s.JSON(t, http.MethodPost, "/api/v1/operations", map[string]any{"request_id": apitest.RandomID("rq-"),
				"kind": "credential.issue", "targets": []map[string]string{{"kind": "package_host", "id": r.PackageHostID}},
				"operation": map[string]any{}, "wait_timeout_ms": 20000}, s.AdminToken, http.StatusCreated, &op)
			require.Equal(t, "succeeded", op.State)
			require.Equal(t, r.PackageHostID, op.Result.PackageHostID)
			require.Equal(t, int64(3), op.Result.Generation)
			require.Empty(t, op.Result.Token)
			s.Problem(t, http.MethodGet, "/api/v1/node-operations", nil, next.Token, http.StatusUnauthorized, "unauthenticated")
		})
		t.Run("IdempotencyKeyReplays", func(t *testing.T) {
			body := map[string]any{"name": "replayed", "families": []string{"fleet", "nodes"}}
			key := apitest.RandomID("idem-")
			send := func(body any) (int, []byte) {
				req := s.NewRequest(t, http.MethodPost, "/api/v1/package-hosts", body, s.AdminToken)
				req.Header.Set("Idempotency-Key", key)
				status, _, raw := s.Send(t, req)
				return status, raw
			}
			status, raw := send(body)
			require.Equal(t, http.StatusCreated, status, "%s", raw)
			var first, again packageHostJSON
			require.NoError(t, json.Unmarshal(raw, &first))
			before := hostRows(t, s)
			status, raw = send(body)
			require.Equal(t, http.StatusOK, status, "%s", raw)
			require.NoError(t, json.Unmarshal(raw, &again))
			require.Equal(t, first.PackageHostID, again.PackageHostID)
			require.Equal(t, first.Token, again.Token)
			// Shown twice, audited twice: the first showing, then the
			// replay's.
			var audit struct {
				Entries []struct {
					Outcome string `json:"outcome"`
					Field   string `json:"field"`
				} `json:"entries"`
			}
			s.Admin(t, http.MethodGet, "/api/v1/secret-audit?action=reveal&operation_id="+first.OperationID, nil, http.StatusOK, &audit)
			var outcomes []string
			for _, e := range audit.Entries {
				require.Equal(t, "token", e.Field)
				outcomes = append(outcomes, e.Outcome)
			}
			require.ElementsMatch(t, []string{"ok", "replayed"}, outcomes)
			status, raw = send(map[string]any{"name": "replayed-2", "families": []string{"nodes"}})
			require.Equal(t, http.StatusConflict, status, "%s", raw)
			require.Contains(t, string(raw), "request_conflict")
			require.Equal(t, before, hostRows(t, s), "nothing recorded")

			req := s.NewRequest(t, http.MethodPost, "/api/v1/package-hosts", body, s.AdminToken)
			req.Header.Set("Idempotency-Key", "has space")
			st, hd, raw := s.Send(t, req)
			apitest.RequireProblem(t, st, hd, raw, http.StatusBadRequest, "invalid_parameter")
		})
		t.Run("BadInputRecordsNothing", func(t *testing.T) {
			before := hostRows(t, s)
			for _, c := range []struct {
				name  string
				body  any
				field string
			}{
				{"EmptyName", map[string]any{"name": "", "families": []string{"nodes"}}, "name"},
				{"NullName", map[string]any{"name": nil, "families": []string{"nodes"}}, "name"},
				{"LongName", map[string]any{"name": strings.Repeat("n", 65), "families": []string{"nodes"}}, "name"},
				{"ControlCharacter", map[string]any{"name": "bell\a", "families": []string{"nodes"}}, "name"},
				{"BidiOverride", map[string]any{"name": "evil\u202egnp", "families": []string{"nodes"}}, "name"},
				{"InvalidUTF8", apitest.Raw("{\"name\":\"a\xffb\",\"families\":[\"nodes\"]}"), "name"},
				{"NoFamilies", map[string]any{"name": "x", "families": []string{}}, "families"},
				{"NullFamilies", map[string]any{"name": "x", "families": nil}, "families"},
				{"CredentialsFamily", map[string]any{"name": "x", "families": []string{"credentials"}}, "families"},
				{"UnknownFamily", map[string]any{"name": "x", "families": []string{"nodes", "magic"}}, "families"},
			} {
				t.Run(c.name, func(t *testing.T) {
					status, hd, raw := s.Do(t, http.MethodPost, "/api/v1/package-hosts", c.body, s.AdminToken)
					p := apitest.RequireProblem(t, status, hd, raw, http.StatusUnprocessableEntity, "validation_failed")
					require.NotEmpty(t, p.Errors)
					require.Equal(t, c.field, p.Errors[0].Field)
				})
			}
			s.Problem(t, http.MethodPost, "/api/v1/package-hosts", apitest.Raw(`{"name":"x","families":["nodes"],"token":"mine"}`),
				s.AdminToken, http.StatusBadRequest, "invalid_json")
			s.Problem(t, http.MethodPost, "/api/v1/package-hosts", map[string]any{"name": "deployer", "families": []string{"nodes"}},
				s.AdminToken, http.StatusConflict, "conflict")
			s.Problem(t, http.MethodPost, "/api/v1/package-hosts/nope/revoke", nil, s.AdminToken, http.StatusNotFound, "not_found")
			s.Problem(t, http.MethodPost, "/api/v1/package-hosts/nope/tokens", nil, s.AdminToken, http.StatusNotFound, "not_found")
			require.Equal(t, before, hostRows(t, s), "nothing recorded")
		})
		t.Run("ListPagesNewestFirst", func(t *testing.T) {
			var page struct {
				PackageHosts []packageHostJSON `json:"package_hosts"`
				NextBefore   *string           `json:"next_before"`
			}
			s.Admin(t, http.MethodGet, "/api/v1/package-hosts?limit=1", nil, http.StatusOK, &page)
			require.Len(t, page.PackageHosts, 1)
			require.NotNil(t, page.NextBefore)
			require.Empty(t, page.PackageHosts[0].Token, "never a token")
			seen := []string{page.PackageHosts[0].PackageHostID}
			for page.NextBefore != nil {
				cursor := *page.NextBefore
				page.NextBefore = nil
				s.Admin(t, http.MethodGet, "/api/v1/package-hosts?limit=2&before="+cursor, nil, http.StatusOK, &page)
				for _, p := range page.PackageHosts {
					seen = append(seen, p.PackageHostID)
				}
			}
			require.Equal(t, h.PackageHostID, seen[len(seen)-1], "the oldest last")
			require.Equal(t, other.PackageHostID, seen[len(seen)-2])
			s.Problem(t, http.MethodGet, "/api/v1/package-hosts?limit=501", nil, s.AdminToken, http.StatusBadRequest, "invalid_parameter")
			for _, bad := range []string{"x", "0", "-1", "007", "99999999999999999999"} {
				p := s.Problem(t, http.MethodGet, "/api/v1/package-hosts?before="+bad, nil, s.AdminToken, http.StatusBadRequest, "invalid_parameter")
				require.Equal(t, "before", p.Errors[0].Field)
			}
		})
		t.Run("Audited", func(t *testing.T) {
			var audit struct {
				Entries []struct {
					Actor  string `json:"actor"`
					Action string `json:"action"`
					Target string `json:"target"`
					Detail string `json:"detail"`
				} `json:"entries"`
			}
			s.Admin(t, http.MethodGet, "/api/v1/admin-audit?limit=500", nil, http.StatusOK, &audit)
			got := map[string]bool{}
			for _, e := range audit.Entries {
				if strings.HasPrefix(e.Action, "package_host.") {
					got[e.Action+" "+e.Target] = true
					require.Equal(t, apitest.AdminUsername, e.Actor)
					require.NotContains(t, e.Detail, "nwh_")
				}
			}
			require.True(t, got["package_host.create "+h.PackageHostID], "%v", got)
			require.Contains(t, strings.Join(mapKeys(got), " "), "package_host.revoke")
			require.Contains(t, strings.Join(mapKeys(got), " "), "package_host.issue")
		})
	})
}

func mapKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// A request authenticated before the revocation and recorded after it
// would let a revoked token act: concurrent submissions stop at the
// revocation, and nothing is recorded for the token once it returned.
func TestPackageHostRevokeStopsRequestsInFlight(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		h := createHost(t, s, "busy", "nodes")
		count := func() int64 {
			return dbtest.Count(t, s.App.DB.DB, &models.Operation{}, "principal_kind = ? AND principal_id = ?", "package_host", h.PackageHostID)
		}
		const workers, maxEach = 4, 300
		var wg sync.WaitGroup
		var mu sync.Mutex
		accepted := 0
		last := make([]int, workers)
		for i := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range maxEach {
					body := inviteOp()
					delete(body, "wait_timeout_ms")
					status, _, _ := s.Do(t, http.MethodPost, "/api/v1/operations", body, h.Token)
					last[i] = status
					if status != http.StatusCreated {
						return
					}
					mu.Lock()
					accepted++
					mu.Unlock()
				}
			}()
		}
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return accepted >= workers
		}, 30*time.Second, time.Millisecond, "submissions under way")
		s.Admin(t, http.MethodPost, "/api/v1/package-hosts/"+h.PackageHostID+"/revoke", nil, http.StatusOK, nil)
		atRevoke := count()
		wg.Wait()
		for i, st := range last {
			require.Equal(t, http.StatusUnauthorized, st, "worker %d ended with %s", i, strconv.Itoa(st))
		}
		require.Equal(t, atRevoke, count(), "nothing recorded for the token after its revocation returned")
		require.Equal(t, int64(accepted), atRevoke)
	})
}

// TestReinviteHandsBackToAdministratorsOnly: the identical outstanding
// enrollment token is shown again to administrators only (DECISIONS.md §5);
// a package host's reinvite mints a fresh token that supersedes it, so no
// enrollment token reaches a package host twice.
func TestReinviteHandsBackToAdministratorsOnly(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		h := createHost(t, s, "provisioner", "nodes")
		enroll := func(nodeID, token string) (int, http.Header, []byte) {
			return s.Do(t, http.MethodPost, "/agent/v1/enroll", api.EnrollRequest{NodeID: nodeID, Generation: 1,
				EnrollmentToken: token, AgentVersion: "0.0.0-test", Facts: agentFacts()}, "")
		}
		// A wait with a fraction of a second: the token's whole-second
		// expiry must still be good through it, or every retry would mint.
		throughAt := time.Now().UTC().Add(20*time.Minute + 400*time.Millisecond)
		through := throughAt.Format(time.RFC3339Nano)
		// submit answers the enrollment token a package host's waited
		// submit shows once.
		submit := func(kind string, targets any, operation map[string]any) (string, string) {
			var op struct {
				Targets []struct {
					ID string `json:"id"`
				} `json:"targets"`
				State   string            `json:"state"`
				Secrets map[string]string `json:"secrets"`
			}
			s.JSON(t, http.MethodPost, "/api/v1/operations", map[string]any{"request_id": apitest.RandomID("rq-"), "kind": kind,
				"targets": targets, "operation": operation, "wait_timeout_ms": 20000}, h.Token, http.StatusCreated, &op)
			require.Equal(t, "succeeded", op.State)
			require.NotEmpty(t, op.Secrets["enrollment_token"])
			return op.Targets[0].ID, op.Secrets["enrollment_token"]
		}
		nodeID, invited := submit("node.invite", []any{}, map[string]any{"rental_id": apitest.RandomID("r"), "generation": 1,
			"redeemable_through": through})
		target := []map[string]string{{"kind": "node", "id": nodeID}}
		_, first := submit("node.reinvite", target, map[string]any{"redeemable_through": through})
		require.NotEqual(t, invited, first, "a package host never gets the outstanding token again")
		_, second := submit("node.reinvite", target, map[string]any{"redeemable_through": through})
		require.NotEqual(t, first, second)
		for _, old := range []string{invited, first} {
			status, hd, raw := enroll(nodeID, old)
			apitest.RequireProblem(t, status, hd, raw, http.StatusConflict, "enrollment_superseded")
		}

		// An administrator asking with the same fractional wait gets the
		// outstanding one back, however often it asks.
		path := "/api/v1/nodes/" + nodeID + "/reinvite"
		var byAdmin, again api.Bootstrap
		s.Admin(t, http.MethodPost, path, map[string]any{"redeemable_through": through}, http.StatusOK, &byAdmin)
		require.Equal(t, second, byAdmin.EnrollmentToken)
		s.Admin(t, http.MethodPost, path, map[string]any{"redeemable_through": through}, http.StatusOK, &again)
		require.Equal(t, second, again.EnrollmentToken)
		// Good through the wait asked for (not "20 minutes from now", which
		// a slow run would pass before it asks).
		require.False(t, again.ExpiresAt.Before(throughAt), "expires %s, asked through %s", again.ExpiresAt, through)
		status, hd, raw := enroll(nodeID, again.EnrollmentToken)
		require.Equal(t, http.StatusOK, status, "%s %v", raw, hd)
	})
}
