package handlers_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// TestCapabilitiesHTTP: the node record shows what its agent reported; a
// kind needing a capability the node lacks is 409 capability_missing
// naming it, and nothing is recorded; the capabilities endpoint answers
// administrators and package hosts alike.
func TestCapabilitiesHTTP(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		var boot api.Bootstrap
		s.Admin(t, "POST", "/api/v1/nodes/invitations", map[string]any{"rental_id": apitest.RandomID("r"), "generation": 1}, http.StatusCreated, &boot)
		var rec map[string]any
		s.Admin(t, http.MethodGet, "/api/v1/nodes/"+boot.NodeID, nil, http.StatusOK, &rec)
		require.Nil(t, rec["capabilities"], "never reported: unknown")

		facts := agentFacts()
		facts.Capabilities = []string{api.CapConfig}
		s.JSON(t, "POST", "/agent/v1/enroll", api.EnrollRequest{NodeID: boot.NodeID, Generation: 1,
			EnrollmentToken: boot.EnrollmentToken, AgentVersion: "0.0.0-test", Facts: facts}, "", http.StatusOK, nil)
		s.Admin(t, http.MethodGet, "/api/v1/nodes/"+boot.NodeID, nil, http.StatusOK, &rec)
		require.Equal(t, []any{"config.v1"}, rec["capabilities"])

		legacy, _ := inviteAndEnroll(t, s)
		s.Admin(t, http.MethodGet, "/api/v1/nodes/"+legacy.NodeID, nil, http.StatusOK, &rec)
		require.Equal(t, []any{"commands.v1", "config.v1"}, rec["capabilities"], "facts without a list")

		before := dbtest.Count(t, s.App.DB.DB, &models.Operation{})
		p := s.Problem(t, http.MethodPost, "/api/v1/operations", map[string]any{"request_id": "cap-1", "kind": "node.prepare_image",
			"targets": []any{map[string]any{"kind": "node", "id": boot.NodeID}}, "operation": map[string]any{"image": "x"}},
			s.AdminToken, http.StatusConflict, "capability_missing")
		require.Equal(t, "commands.v1", p.Capability)
		require.Contains(t, p.Detail, "commands.v1")
		require.Equal(t, before, dbtest.Count(t, s.App.DB.DB, &models.Operation{}), "nothing recorded")

		var caps struct {
			Kinds []struct {
				Kind           string  `json:"kind"`
				Capability     *string `json:"capability"`
				LevelTriggered bool    `json:"level_triggered"`
			} `json:"kinds"`
			AgentVersion *string `json:"agent_version"`
		}
		s.Admin(t, http.MethodGet, "/api/v1/capabilities", nil, http.StatusOK, &caps)
		require.Equal(t, "0.0.0-test", *caps.AgentVersion)
		require.NotEmpty(t, caps.Kinds)
		// level_triggered says what restart recovery does: fan-outs and
		// kinds run in one transaction are run again, as node commands
		// are (ledger/dispatcher.go), never failed interrupted.
		rerun := map[string]bool{}
		for _, k := range caps.Kinds {
			rerun[k.Kind] = k.LevelTriggered
		}
		for _, k := range []string{"fleet.configure", "fleet.command", "fleet.diagnose", "node.invite", "node.reinvite",
			"node.retire", "credential.issue", "credential.revoke", "node.configure", "node.launch_workload", "diagnose.endpoint"} {
			require.True(t, rerun[k], "%s is run again after a restart", k)
		}
		host := createHost(t, s, apitest.RandomID("caps-host-"), "commands")
		s.JSON(t, http.MethodGet, "/api/v1/capabilities", nil, host.Token, http.StatusOK, &caps)
	})
}
