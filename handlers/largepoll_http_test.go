package handlers_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/apitest"
)

// submitLargeLaunches submits n launches to node, operation ids prefix0
// onwards, each with 240,000 bytes of payload that encoding/json escapes
// to 1.44 MB, and answers that payload's env value.
func submitLargeLaunches(t *testing.T, s *apitest.Server, node, prefix string, n int) string {
	t.Helper()
	blob := strings.Repeat("<&>", 80000)
	for i := range n {
		body := `{"kind":"launch_workload","operation_id":"` + prefix + strconv.Itoa(i) + `","payload":{"run_id":"r` + strconv.Itoa(i) +
			`","attempt_id":"a1","command":"/bin/true","env":{"BLOB":"` + blob + `"}}}`
		s.Admin(t, http.MethodPost, "/api/v1/nodes/"+node+"/commands", apitest.Raw(body), http.StatusCreated, nil)
	}
	return blob
}

// TestLargeCommandsSpanPolls: commands whose answers together pass what
// the agent reads (api.MaxAnswerBytes) reach the node over several polls,
// each answer readable, each command once; none is stuck in an answer
// too large to read.
func TestLargeCommandsSpanPolls(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		boot, sess := inviteAndEnroll(t, s)
		// Eight pass the agent's 8 MiB together.
		const n = 8
		blob := submitLargeLaunches(t, s, boot.NodeID, "big-", n)
		seen := map[string]int{}
		for polls := 0; len(seen) < n; polls++ {
			require.Less(t, polls, 2*n, "every command delivered within a few polls")
			status, _, raw := s.Do(t, http.MethodGet, "/agent/v1/commands?wait=5", nil, sess.SessionToken)
			require.Equal(t, http.StatusOK, status)
			require.LessOrEqual(t, len(raw), api.MaxAnswerBytes, "the agent reads the whole answer")
			var polled api.CommandsResponse
			require.NoError(t, json.Unmarshal(raw, &polled))
			require.NotEmpty(t, polled.Commands)
			for _, c := range polled.Commands {
				seen[c.OperationID]++
				var p struct {
					Env map[string]string `json:"env"`
				}
				require.NoError(t, json.Unmarshal(c.Payload, &p))
				require.Equal(t, blob, p.Env["BLOB"], "the payload whole")
			}
		}
		for id, times := range seen {
			require.Equal(t, 1, times, "%s handed out once", id)
		}
	})
}

// TestTrimmedCommandsSurviveReenrollment: commands trimmed from a full
// answer were never sent, so a re-enrollment before the next poll
// redelivers them under the new session; only the launches the answer
// carried may have run, and only those end outcome_unknown (DECISIONS.md
// §1).
func TestTrimmedCommandsSurviveReenrollment(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		boot, sess := inviteAndEnroll(t, s)
		const n = 6
		submitLargeLaunches(t, s, boot.NodeID, "trim-", n)
		var first api.CommandsResponse
		s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=5", nil, sess.SessionToken, http.StatusOK, &first)
		require.NotEmpty(t, first.Commands)
		require.Less(t, len(first.Commands), n, "the answer is full before the last command")
		sent := map[string]bool{}
		for _, c := range first.Commands {
			sent[c.OperationID] = true
		}

		// The machine comes back without its state before polling again.
		var again api.Bootstrap
		s.Admin(t, http.MethodPost, "/api/v1/nodes/"+boot.NodeID+"/reinvite",
			map[string]any{"redeemable_through": time.Now().Add(30 * time.Minute).UTC().Format(time.RFC3339)}, http.StatusOK, &again)
		var resp api.EnrollResponse
		s.JSON(t, http.MethodPost, "/agent/v1/enroll", api.EnrollRequest{NodeID: boot.NodeID, Generation: 1,
			EnrollmentToken: again.EnrollmentToken, AgentVersion: "0.0.0-test", Facts: agentFacts()}, "", http.StatusOK, &resp)

		for i := range n {
			id := "trim-" + strconv.Itoa(i)
			var cmd struct {
				State         string `json:"state"`
				FailureCode   string `json:"failure_code"`
				DeliveryCount int    `json:"delivery_count"`
			}
			s.Admin(t, http.MethodGet, "/api/v1/commands/"+id, nil, http.StatusOK, &cmd)
			if sent[id] {
				require.Equal(t, "refused", cmd.State, id)
				require.Equal(t, "outcome_unknown", cmd.FailureCode, id)
			} else {
				require.Equal(t, "pending", cmd.State, "%s was never sent: redelivered", id)
				require.Zero(t, cmd.DeliveryCount, "%s was never sent", id)
			}
		}
		got := map[string]int{}
		for polls := 0; len(got) < n-len(sent); polls++ {
			require.Less(t, polls, 2*n, "the rest delivered within a few polls")
			var polled api.CommandsResponse
			s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=5", nil, resp.SessionToken, http.StatusOK, &polled)
			for _, c := range polled.Commands {
				require.False(t, sent[c.OperationID], "%s delivered to the earlier enrollment is not sent again", c.OperationID)
				got[c.OperationID]++
			}
		}
		for id, times := range got {
			require.Equal(t, 1, times, "%s handed out once", id)
		}
	})
}
