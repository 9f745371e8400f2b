package handlers_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/apitest"
)

// TestLargeCommandsSpanPolls: commands whose answers together pass what
// the agent reads (api.MaxAnswerBytes) reach the node over several polls,
// each answer readable, each command once; none is stuck in an answer
// too large to read.
func TestLargeCommandsSpanPolls(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		boot, sess := inviteAndEnroll(t, s)
		// 240,000 bytes of payload each, 1.44 MB once encoding/json
		// escapes them: eight pass the agent's 8 MiB together.
		blob := strings.Repeat("<&>", 80000)
		const n = 8
		for i := range n {
			body := `{"kind":"launch_workload","operation_id":"big-` + strconv.Itoa(i) + `","payload":{"run_id":"r` + strconv.Itoa(i) +
				`","attempt_id":"a1","command":"/bin/true","env":{"BLOB":"` + blob + `"}}}`
			s.Admin(t, http.MethodPost, "/api/v1/nodes/"+boot.NodeID+"/commands", apitest.Raw(body), http.StatusCreated, nil)
		}
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
