package handlers_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
	"github.com/nodeward/nodeward/secrets"
)

// TestScrubSealedValuesHTTP: a node that refuses a launch with failure
// text naming its sealed environment value, and a workload whose output
// prints it, leave only the placeholder in the command, the operation's
// error, the stored output and the database.
func TestScrubSealedValuesHTTP(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		boot, sess := inviteAndEnroll(t, s)
		secret := "pw-" + apitest.RandomID("v")

		// Refused with the value in the failure text.
		h := sealFor(t, s, s.AdminToken, "scrub-1", boot.NodeID, "/env/DB_PASSWORD", secret)
		var op opJSON
		s.Admin(t, http.MethodPost, "/api/v1/operations", launchWith("scrub-1", boot.NodeID, h), http.StatusCreated, &op)
		var polled api.CommandsResponse
		s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=5", nil, sess.SessionToken, http.StatusOK, &polled)
		require.Len(t, polled.Commands, 1)
		s.JSON(t, http.MethodPost, "/agent/v1/results", api.ResultsRequest{Results: []api.Result{{OperationID: op.OperationID,
			Failure: "cannot connect with password " + secret + " to db"}}}, sess.SessionToken, http.StatusOK, nil)
		var cmd struct {
			State          string  `json:"state"`
			FailureMessage *string `json:"failure_message"`
		}
		s.Admin(t, http.MethodGet, "/api/v1/commands/"+op.OperationID, nil, http.StatusOK, &cmd)
		require.Equal(t, "refused", cmd.State)
		require.NotNil(t, cmd.FailureMessage)
		require.Equal(t, "cannot connect with password "+secrets.Placeholder+" to db", *cmd.FailureMessage)
		var ended opJSON
		s.Admin(t, http.MethodGet, "/api/v1/operations/"+op.OperationID, nil, http.StatusOK, &ended)
		require.NotNil(t, ended.Error)
		require.Contains(t, ended.Error.Message, secrets.Placeholder)
		require.NotContains(t, ended.Error.Message, secret)

		// Launched; the attempt's output prints the value.
		h2 := sealFor(t, s, s.AdminToken, "scrub-2", boot.NodeID, "/env/DB_PASSWORD", secret)
		var op2 opJSON
		body := launchWith("scrub-2", boot.NodeID, h2)
		s.Admin(t, http.MethodPost, "/api/v1/operations", body, http.StatusCreated, &op2)
		s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=5", nil, sess.SessionToken, http.StatusOK, &polled)
		require.Len(t, polled.Commands, 1)
		s.JSON(t, http.MethodPost, "/agent/v1/results", api.ResultsRequest{Results: []api.Result{{OperationID: op2.OperationID, Applied: true}}},
			sess.SessionToken, http.StatusOK, nil)
		// The launch has ended; its value is kept (encrypted) to scrub the
		// attempt's output, the refused launch's is not.
		_, err := s.App.Secrets.Sweep(t.Context())
		require.NoError(t, err)
		require.Equal(t, int64(1), dbtest.Count(t, s.App.DB.DB, &models.SecretDelivery{}))
		s.JSON(t, http.MethodPost, "/agent/v1/output", api.OutputRequest{RunID: "run-1", AttemptID: "scrub-2",
			StdoutTail: "DB_PASSWORD=" + secret + "\n", StderrTail: "login " + secret + " refused"}, sess.SessionToken, http.StatusOK, nil)
		var out outputView
		s.Admin(t, http.MethodGet, "/api/v1/nodes/"+boot.NodeID+"/workloads/run-1/scrub-2/output", nil, http.StatusOK, &out)
		require.Equal(t, "DB_PASSWORD="+secrets.Placeholder+"\n", out.StdoutTail)
		require.Equal(t, "login "+secrets.Placeholder+" refused", out.StderrTail)

		// The output is recorded: nothing is left to scrub for.
		_, err = s.App.Secrets.Sweep(t.Context())
		require.NoError(t, err)
		require.Zero(t, dbtest.Count(t, s.App.DB.DB, &models.SecretDelivery{}))
		require.NotContains(t, dumpDatabase(t, s.App.DB), secret, "no table holds the value")
	})
}
