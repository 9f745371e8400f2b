package handlers_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

type outputView struct {
	StdoutTail string `json:"stdout_tail"`
	StderrTail string `json:"stderr_tail"`
	Truncated  bool   `json:"truncated"`
}

func TestWorkloadOutputHTTP(t *testing.T) {
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		boot, sess := inviteAndEnroll(t, s)
		read := "/api/v1/nodes/" + boot.NodeID + "/workloads/r1/a1/output"

		t.Run("NeverReportedIsNotFound", func(t *testing.T) {
			s.Problem(t, "GET", read, nil, s.AdminToken, 404, "not_found")
			s.Problem(t, "GET", "/api/v1/nodes/missing/workloads/r1/a1/output", nil, s.AdminToken, 404, "not_found")
		})

		full := strings.Repeat("é", api.MaxOutputTail/2) // exactly 64 KiB of UTF-8
		first := api.OutputRequest{RunID: "r1", AttemptID: "a1", StdoutTail: "hello\n", StderrTail: full, Truncated: true}
		t.Run("RecordedThenRead", func(t *testing.T) {
			var resp api.OutputResponse
			s.JSON(t, "POST", "/agent/v1/output", first, sess.SessionToken, http.StatusOK, &resp)
			require.True(t, resp.Recorded)
			var got outputView
			s.Admin(t, "GET", read, nil, http.StatusOK, &got)
			require.Equal(t, outputView{StdoutTail: "hello\n", StderrTail: full, Truncated: true}, got)
		})

		t.Run("WorstCaseEscapingFitsTheBodyLimit", func(t *testing.T) {
			// Every byte a control character: JSON spells each in six bytes.
			worst := strings.Repeat("\x01", api.MaxOutputTail)
			var resp api.OutputResponse
			s.JSON(t, "POST", "/agent/v1/output", api.OutputRequest{RunID: "r1", AttemptID: "worst", StdoutTail: worst, StderrTail: worst, Truncated: true},
				sess.SessionToken, http.StatusOK, &resp)
			require.True(t, resp.Recorded)
		})

		t.Run("SameAttemptAgainKeepsTheFirst", func(t *testing.T) {
			var resp api.OutputResponse
			s.JSON(t, "POST", "/agent/v1/output", api.OutputRequest{RunID: "r1", AttemptID: "a1", StdoutTail: "other", StderrTail: "other"},
				sess.SessionToken, http.StatusOK, &resp)
			require.False(t, resp.Recorded)
			var got outputView
			s.Admin(t, "GET", read, nil, http.StatusOK, &got)
			require.Equal(t, "hello\n", got.StdoutTail)
		})

		t.Run("BadInputs", func(t *testing.T) {
			tooLong := strings.Repeat("x", api.MaxOutputTail+1)
			// Fewer characters than the limit, more bytes: the limit is bytes.
			tooManyBytes := strings.Repeat("é", api.MaxOutputTail/2+1)
			for name, c := range map[string]struct {
				body   any
				status int
				code   string
				field  string // the field a validation_failed names
			}{
				"UnknownField":   {apitest.Raw(`{"run_id":"r","attempt_id":"a","stdout_tail":"","stderr_tail":"","truncated":false,"exit_code":0}`), 400, "invalid_json", ""},
				"Malformed":      {apitest.Raw(`{"run_id":`), 400, "invalid_json", ""},
				"TailNotAString": {apitest.Raw(`{"run_id":"r","attempt_id":"a","stdout_tail":7,"stderr_tail":"","truncated":false}`), 400, "invalid_json", ""},
				"RunIDEmpty":     {api.OutputRequest{AttemptID: "a"}, 422, "validation_failed", "run_id"},
				"TailMissing":    {apitest.Raw(`{"run_id":"r","attempt_id":"a","stderr_tail":"","truncated":false}`), 422, "validation_failed", "stdout_tail"},
				"TailNull":       {apitest.Raw(`{"run_id":"r","attempt_id":"a","stdout_tail":null,"stderr_tail":"","truncated":false}`), 422, "validation_failed", "stdout_tail"},
				"TruncatedNull":  {apitest.Raw(`{"run_id":"r","attempt_id":"a","stdout_tail":"","stderr_tail":"","truncated":null}`), 422, "validation_failed", "truncated"},
				"AttemptIDBad":   {api.OutputRequest{RunID: "r", AttemptID: "../etc"}, 422, "validation_failed", "attempt_id"},
				"StdoutTooLong":  {api.OutputRequest{RunID: "r", AttemptID: "a", StdoutTail: tooLong}, 422, "validation_failed", "stdout_tail"},
				"StderrTooLong":  {api.OutputRequest{RunID: "r", AttemptID: "a", StderrTail: tooManyBytes}, 422, "validation_failed", "stderr_tail"},
				"NUL":            {api.OutputRequest{RunID: "r", AttemptID: "a", StdoutTail: "a\x00b"}, 422, "validation_failed", "stdout_tail"},
			} {
				t.Run(name, func(t *testing.T) {
					before := dbtest.Count(t, s.App.DB.DB, &models.WorkloadOutput{})
					p := s.Problem(t, "POST", "/agent/v1/output", c.body, sess.SessionToken, c.status, c.code)
					require.NotContains(t, p.Raw, "xxxxxxxx", "a refusal does not echo the output")
					if c.field != "" {
						require.Len(t, p.Errors, 1)
						require.Equal(t, c.field, p.Errors[0].Field)
					}
					require.Equal(t, before, dbtest.Count(t, s.App.DB.DB, &models.WorkloadOutput{}), "a refused report stores nothing")
				})
			}
		})

		t.Run("MissingSession", func(t *testing.T) {
			s.Problem(t, "POST", "/agent/v1/output", first, "", 401, "session_invalid")
			s.Problem(t, "GET", read, nil, "", 401, "unauthenticated")
		})

		t.Run("RetiredNodeMayReport", func(t *testing.T) {
			s.Admin(t, "POST", "/api/v1/nodes/"+boot.NodeID+"/retire", nil, http.StatusOK, nil)
			var resp api.OutputResponse
			s.JSON(t, "POST", "/agent/v1/output", api.OutputRequest{RunID: "r1", AttemptID: "a2", StdoutTail: "bye"},
				sess.SessionToken, http.StatusOK, &resp)
			require.True(t, resp.Recorded)
		})
	})
}

// TestWorkloadOutputFenced: a superseded enrollment's session cannot report
// output, and what it tried is not stored.
func TestWorkloadOutputFenced(t *testing.T) {
	s := apitest.Start(t)
	boot, sess := inviteAndEnroll(t, s)
	var fresh api.Bootstrap
	s.Admin(t, "POST", "/api/v1/nodes/"+boot.NodeID+"/reinvite", nil, http.StatusOK, &fresh)
	s.JSON(t, "POST", "/agent/v1/enroll", api.EnrollRequest{NodeID: boot.NodeID, Generation: 1, EnrollmentToken: fresh.EnrollmentToken,
		AgentVersion: "x", Facts: agentFacts()}, "", http.StatusOK, nil)
	s.Problem(t, "POST", "/agent/v1/output", api.OutputRequest{RunID: "r", AttemptID: "a", StdoutTail: "late"}, sess.SessionToken, 409, "fenced")
	s.Problem(t, "GET", "/api/v1/nodes/"+boot.NodeID+"/workloads/r/a/output", nil, s.AdminToken, 404, "not_found")
	require.Zero(t, dbtest.Count(t, s.App.DB.DB, &models.WorkloadOutput{}))
}

func FuzzOutputDecode(f *testing.F) {
	s, tok := fuzzServer(f)
	f.Add([]byte(`{"run_id":"r","attempt_id":"a","stdout_tail":"hi\n","stderr_tail":"","truncated":false}`))
	f.Add([]byte(`{"run_id":"r","attempt_id":"a","stdout_tail":"\u0000","stderr_tail":"\ud800","truncated":true}`))
	f.Add([]byte(`{"run_id":null,"attempt_id":"a"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		checkFuzzAnswer(t, fuzzPost(s, "/agent/v1/output", tok, body))
	})
}
