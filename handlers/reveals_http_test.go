package handlers_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/secrets"
	"github.com/nodeward/nodeward/server/controlplane"
)

type revealOpJSON struct {
	OperationID string            `json:"operation_id"`
	State       string            `json:"state"`
	Reveals     map[string]string `json:"reveals"`
	Secrets     map[string]string `json:"secrets"`
	Result      map[string]any    `json:"result"`
}

type revealJSON struct {
	Field string `json:"field"`
	Value string `json:"value"`
}

// waitOperation waits (generously) for the operation to end and requires
// it succeeded.
func waitOperation(t *testing.T, s *apitest.Server, token, id string) {
	t.Helper()
	op, err := s.App.Ledger.Wait(t.Context(), id, 30*time.Second)
	require.NoError(t, err)
	require.Equal(t, ledger.StateSucceeded, op.State, "%+v", op)
	var read revealOpJSON
	s.JSON(t, http.MethodGet, "/api/v1/operations/"+id, nil, token, http.StatusOK, &read)
	require.Nil(t, read.Reveals, "reads carry no reveals")
}

// TestRevealHandlesHTTP: a node.invite submitted without waiting answers a
// reveal handle; the same request replayed answers the same handle; only
// the submitter redeems it, once, and the token enrolls the node; no
// table holds the token; the secret audit records the reveal and the
// refusals.
func TestRevealHandlesHTTP(t *testing.T) {
	t.Parallel()
	log := &apitest.LogBuffer{}
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		host := createHost(t, s, "pkg", "nodes")
		body := inviteBody("inv-1", apitest.RandomID("r"))
		var op revealOpJSON
		s.JSON(t, http.MethodPost, "/api/v1/operations", body, host.Token, http.StatusCreated, &op)
		handle := op.Reveals[ledger.FieldEnrollmentToken]
		require.True(t, strings.HasPrefix(handle, secrets.RevealPrefix), "reveals %v", op.Reveals)
		require.Nil(t, op.Secrets, "nothing inline without waiting")

		var again revealOpJSON
		s.JSON(t, http.MethodPost, "/api/v1/operations", body, host.Token, http.StatusOK, &again)
		require.Equal(t, op.Reveals, again.Reveals, "a replay answers the same handles")

		waitOperation(t, s, host.Token, op.OperationID)
		s.Problem(t, http.MethodGet, "/api/v1/reveals/"+handle, nil, s.AdminToken, http.StatusForbidden, "permission_denied")
		s.Problem(t, http.MethodGet, "/api/v1/reveals/"+secrets.RevealPrefix+"nope", nil, host.Token, http.StatusNotFound, "not_found")

		var rv revealJSON
		s.JSON(t, http.MethodGet, "/api/v1/reveals/"+handle, nil, host.Token, http.StatusOK, &rv)
		require.Equal(t, ledger.FieldEnrollmentToken, rv.Field)
		require.NotEmpty(t, rv.Value)
		spent := s.Problem(t, http.MethodGet, "/api/v1/reveals/"+handle, nil, host.Token, http.StatusGone, "reveal_spent")
		require.NotContains(t, spent.Raw, handle, "a problem never repeats the handle")

		dump := dumpDatabase(t, s.App.DB)
		require.NotContains(t, dump, rv.Value, "the token is stored nowhere")
		require.NotContains(t, dump, handle, "nor is the handle in clear")

		var read revealOpJSON
		s.JSON(t, http.MethodGet, "/api/v1/operations/"+op.OperationID, nil, host.Token, http.StatusOK, &read)
		nodeID, _ := read.Result["node_id"].(string)
		var enrolled api.EnrollResponse
		s.JSON(t, http.MethodPost, "/agent/v1/enroll", api.EnrollRequest{NodeID: nodeID, Generation: 1,
			EnrollmentToken: rv.Value, AgentVersion: "0.0.0-test", Facts: agentFacts()}, "", http.StatusOK, &enrolled)
		require.NotEmpty(t, enrolled.SessionToken)

		outcomes := revealAudit(t, s, rv.Value)
		// ok twice: this reveal, and the host's token its wrapper showed.
		require.Equal(t, map[string]int{"reveal/denied": 1, "reveal/ok": 2, "reveal/spent": 1}, outcomes)
		// A mistyped path, the handle pasted raw or escaped: 404, and the
		// log still names no handle.
		for _, p := range []string{"/api/v1/revealz/" + handle, "/api/v1/reveal/" + url.PathEscape(handle) + "/x"} {
			s.Problem(t, http.MethodGet, p, nil, s.AdminToken, http.StatusNotFound, "not_found")
		}
		require.NotContains(t, log.String(), handle, "the request log names no handle")
		require.NotContains(t, log.String(), url.PathEscape(handle))
		require.NotContains(t, log.String(), rv.Value)
	}, apitest.WithLog(log))
}

// revealAudit answers the reveal rows of the secret audit by
// action/outcome, and requires the audit holds no value.
func revealAudit(t *testing.T, s *apitest.Server, value string) map[string]int {
	t.Helper()
	var audit struct {
		Entries []struct {
			Action      string          `json:"action"`
			Outcome     string          `json:"outcome"`
			OperationID *string         `json:"operation_id"`
			Target      json.RawMessage `json:"target"`
		} `json:"entries"`
	}
	status, _, raw := s.Do(t, http.MethodGet, "/api/v1/secret-audit?limit=500", nil, s.AdminToken)
	require.Equal(t, http.StatusOK, status)
	require.NotContains(t, string(raw), value)
	require.NoError(t, json.Unmarshal(raw, &audit))
	out := map[string]int{}
	for _, e := range audit.Entries {
		if e.Action == secrets.ActionReveal {
			require.Equal(t, "null", string(e.Target), "a reveal names its operation, not a target")
			require.NotNil(t, e.OperationID)
		}
		if e.Action == secrets.ActionReveal || e.Action == secrets.ActionExpire {
			out[e.Action+"/"+e.Outcome]++
		}
	}
	return out
}

// TestRevealInlineAndCredentialHTTP: an administrator's credential.issue
// submitted with a wait shows the token inline once, which spends its
// handle; one submitted without waiting is revealed through its handle
// by the same administrator, and the token authenticates the host.
func TestRevealInlineAndCredentialHTTP(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		issue := func(requestID, name string, wait int) map[string]any {
			b := map[string]any{"request_id": requestID, "kind": ledger.KindCredentialIssue,
				"operation": map[string]any{"name": name, "families": []string{"nodes"}}}
			if wait > 0 {
				b["wait_timeout_ms"] = wait
			}
			return b
		}
		var waited revealOpJSON
		s.Admin(t, http.MethodPost, "/api/v1/operations", issue("cred-1", "inline", 30000), http.StatusCreated, &waited)
		require.Equal(t, string(ledger.StateSucceeded), waited.State)
		tok := waited.Secrets[ledger.FieldToken]
		require.True(t, strings.HasPrefix(tok, "nwh_"), "secrets %v", waited.Secrets)
		s.Problem(t, http.MethodGet, "/api/v1/reveals/"+waited.Reveals[ledger.FieldToken], nil, s.AdminToken, http.StatusGone, "reveal_spent")
		var replay revealOpJSON
		s.Admin(t, http.MethodPost, "/api/v1/operations", issue("cred-1", "inline", 30000), http.StatusOK, &replay)
		require.Equal(t, waited.Reveals, replay.Reveals)
		require.Nil(t, replay.Secrets, "shown once")

		var op revealOpJSON
		s.Admin(t, http.MethodPost, "/api/v1/operations", issue("cred-2", "later", 0), http.StatusCreated, &op)
		waitOperation(t, s, s.AdminToken, op.OperationID)
		var rv revealJSON
		s.Admin(t, http.MethodGet, "/api/v1/reveals/"+op.Reveals[ledger.FieldToken], nil, http.StatusOK, &rv)
		require.Equal(t, ledger.FieldToken, rv.Field)
		s.JSON(t, http.MethodGet, "/api/v1/operations/"+op.OperationID, nil, rv.Value, http.StatusNotFound, nil)
		require.NotContains(t, dumpDatabase(t, s.App.DB), rv.Value)
		require.NotContains(t, dumpDatabase(t, s.App.DB), tok)

		// The wrapper shows the token in its answer: that spends the
		// handle too.
		createHost(t, s, "wrapped", "nodes")
		require.Equal(t, map[string]int{"reveal/ok": 3, "reveal/spent": 1}, revealAudit(t, s, tok))
	})
}

// TestRevealExpiresHTTP: past its TTL a handle is reveal_expired (and the
// sweeper audits the expiry of one never redeemed); a handle of an
// operation not yet succeeded is a conflict and stays redeemable.
func TestRevealExpiresHTTP(t *testing.T) {
	t.Parallel()
	var skew atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		skew.Store(0)
		var op revealOpJSON
		s.Admin(t, http.MethodPost, "/api/v1/operations", inviteBody("exp-1", apitest.RandomID("r")), http.StatusCreated, &op)
		var other revealOpJSON
		s.Admin(t, http.MethodPost, "/api/v1/operations", inviteBody("exp-2", apitest.RandomID("r")), http.StatusCreated, &other)
		waitOperation(t, s, s.AdminToken, op.OperationID)
		waitOperation(t, s, s.AdminToken, other.OperationID)
		skew.Store(int64(secrets.RevealTTL + time.Second))
		s.Problem(t, http.MethodGet, "/api/v1/reveals/"+op.Reveals[ledger.FieldEnrollmentToken], nil, s.AdminToken, http.StatusGone, "reveal_expired")
		_, err := s.App.Secrets.Sweep(t.Context())
		require.NoError(t, err)
		s.Problem(t, http.MethodGet, "/api/v1/reveals/"+other.Reveals[ledger.FieldEnrollmentToken], nil, s.AdminToken, http.StatusGone, "reveal_expired")
		require.Equal(t, map[string]int{"reveal/expired": 2, "expire/expired": 2}, revealAudit(t, s, op.Reveals[ledger.FieldEnrollmentToken]))
	}, apitest.WithConfig(func(c *controlplane.Config) { c.Now = clock }))
}
