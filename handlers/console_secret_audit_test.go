package handlers_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/apitest"
)

func auditActions(t *testing.T, c *liveConsole, query string) []string {
	t.Helper()
	status, doc := c.get("/console/secret-audit?" + query)
	require.Equal(t, http.StatusOK, status, query)
	var out []string
	for _, n := range byTestID(doc, "secret-action") {
		out = append(out, text(n))
	}
	return out
}

func TestConsoleSecretAudit(t *testing.T) {
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		c := newLiveConsole(t, s)
		status, doc := c.get("/console/secret-audit")
		require.Equal(t, http.StatusOK, status)
		require.Contains(t, text(one(t, doc, "no-secret-audit")), "No secrets handled yet")

		const value = "s3cret-value-never-shown"
		sealFor(t, s, s.AdminToken, "seal-1", "node-a", "/env/A", value)
		sealFor(t, s, s.AdminToken, "seal-2", "node-b", "/env/B", value)
		// A package host's token is a generated secret, revealed inline.
		host := createHost(t, s, "auditor", "nodes")

		status, doc = c.get("/console/secret-audit")
		require.Equal(t, http.StatusOK, status)
		require.NotContains(t, text(doc), value)
		require.NotContains(t, text(doc), host.Token)
		require.Equal(t, []string{"reveal", "seal", "seal"}, auditActions(t, c, ""))

		require.Equal(t, []string{"seal"}, auditActions(t, c, "target_id=node-b"))
		require.Equal(t, []string{"seal", "seal"}, auditActions(t, c, url.Values{"action": {"seal"}, "outcome": {""}, "principal_id": {""}}.Encode()))
		require.Equal(t, []string{"reveal"}, auditActions(t, c, "operation_id="+url.QueryEscape(host.OperationID)))
		require.Equal(t, []string{"reveal", "seal", "seal"}, auditActions(t, c, "principal_kind=admin&principal_id="+url.QueryEscape(s.AdminUserID)))
		require.Empty(t, auditActions(t, c, "outcome=denied"))

		// Paging keeps the filters.
		status, doc = c.get("/console/secret-audit?principal_kind=admin&limit=2")
		require.Equal(t, http.StatusOK, status)
		require.Len(t, byTestID(doc, "secret-audit-row"), 2)
		older := attr(one(t, doc, "secret-older"), "href")
		status, doc = c.get(older)
		require.Equal(t, http.StatusOK, status)
		require.Len(t, byTestID(doc, "secret-audit-row"), 1)
		one(t, doc, "secret-newest")

		// A bad filter is explained on the page.
		for _, q := range []string{"action=peek", "outcome=maybe", "principal_kind=robot", "before=-1", "limit=0"} {
			status, doc := c.get("/console/secret-audit?" + q)
			require.Equal(t, http.StatusBadRequest, status, q)
			require.Contains(t, text(one(t, doc, "secret-filter-error")), "query parameter", q)
		}

		// The API answers the same filters.
		var page struct {
			Entries []struct {
				Action string `json:"action"`
				Target struct {
					ID string `json:"id"`
				} `json:"target"`
			} `json:"entries"`
			NextBefore *string `json:"next_before"`
		}
		s.Admin(t, http.MethodGet, "/api/v1/secret-audit?action=seal&target_kind=node&target_id=node-a", nil, http.StatusOK, &page)
		require.Len(t, page.Entries, 1)
		require.Equal(t, "node-a", page.Entries[0].Target.ID)
		require.Nil(t, page.NextBefore)
		s.Admin(t, http.MethodGet, "/api/v1/secret-audit?outcome=ok&limit=1", nil, http.StatusOK, &page)
		require.Equal(t, "reveal", page.Entries[0].Action)
		require.NotNil(t, page.NextBefore)
		res, err := http.DefaultClient.Do(s.NewRequest(t, http.MethodGet, "/api/v1/secret-audit?action=peek", nil, s.AdminToken))
		require.NoError(t, err)
		raw, err := io.ReadAll(res.Body)
		res.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusBadRequest, res.StatusCode)
		var p struct {
			Code string `json:"code"`
		}
		require.NoError(t, json.Unmarshal(raw, &p))
		require.Equal(t, "invalid_parameter", p.Code)
	})
}
