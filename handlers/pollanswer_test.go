package handlers

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
)

// TestPollAnswerBody: the poll's answer, whose commands' payloads and
// configuration document are copied rather than re-encoded, reads back as
// encoding/json's encoding of the same answer.
func TestPollAnswerBody(t *testing.T) {
	cmd := api.Command{OperationID: "op-1", NodeID: "n-1", Kind: "launch_workload", FencingToken: 3,
		IssuedAt: time.Date(2026, 12, 6, 1, 2, 3, 0, time.UTC), Payload: json.RawMessage(`{"run_id":"r<1>"}`)}
	big := `{"pad":"` + strings.Repeat("x", 300<<10) + `"}`
	cases := map[string]api.CommandsResponse{
		"NoConfig":          {Commands: []api.Command{cmd}},
		"Nothing":           {Commands: []api.Command{}},
		"ConfigAlone":       {Commands: []api.Command{}, Config: &api.ConfigDelivery{Revision: 2, Hash: "ab", Format: "app/v1", Document: json.RawMessage(`{"a":"<&>","b":[1,2.5,null],"é":"\u2028"}`)}},
		"ConfigAndCommands": {Commands: []api.Command{cmd, cmd}, Config: &api.ConfigDelivery{Revision: 1, Hash: "cd", Format: "x/v1", Document: json.RawMessage(big)}},
		"Cleared":           {Commands: []api.Command{}, Config: &api.ConfigDelivery{Revision: 3, Hash: "ef", Format: "x/v1", Document: json.RawMessage(`null`)}},
		"ClearedAsNil":      {Commands: []api.Command{}, Config: &api.ConfigDelivery{Revision: 3, Hash: "ef", Format: "x/v1"}},
	}
	for name, out := range cases {
		t.Run(name, func(t *testing.T) {
			body, kept, err := pollAnswerBody(out, api.MaxAnswerBytes/2)
			require.NoError(t, err)
			require.Equal(t, len(out.Commands), kept, "small commands all fit")
			want, err := json.Marshal(out)
			require.NoError(t, err)
			for _, c := range out.Commands {
				require.Contains(t, string(body), `"payload":`+string(c.Payload)+`}`, "the payload is copied as it is")
			}
			require.True(t, json.Valid(body), "the answer is JSON")
			var got, expected any
			require.NoError(t, json.Unmarshal(body, &got))
			require.NoError(t, json.Unmarshal(want, &expected))
			require.Equal(t, expected, got)
			var typed api.CommandsResponse
			dec := json.NewDecoder(bytes.NewReader(body))
			dec.DisallowUnknownFields()
			require.NoError(t, dec.Decode(&typed))
			if out.Config != nil {
				require.Equal(t, out.Config.Revision, typed.Config.Revision)
				require.Equal(t, out.Config.Hash, typed.Config.Hash)
			}
		})
	}
	t.Run("ADocumentThatIsNotJSONIsRefused", func(t *testing.T) {
		_, _, err := pollAnswerBody(api.CommandsResponse{Commands: []api.Command{},
			Config: &api.ConfigDelivery{Revision: 1, Hash: "ab", Format: "x/v1", Document: json.RawMessage(`{"a":`)}}, api.MaxAnswerBytes/2)
		require.Error(t, err)
	})
	t.Run("APayloadThatIsNotJSONIsRefused", func(t *testing.T) {
		bad := cmd
		bad.Payload = json.RawMessage(`{"run_id":`)
		_, _, err := pollAnswerBody(api.CommandsResponse{Commands: []api.Command{cmd, bad}}, api.MaxAnswerBytes/2)
		require.Error(t, err)
	})
	t.Run("CommandsBeyondTheBytesWait", func(t *testing.T) {
		large := cmd
		large.Payload = json.RawMessage(`{"blob":"` + strings.Repeat("<", 6000) + `"}`) // 6,140 bytes encoded
		cmds := []api.Command{large, large, large, large}
		body, kept, err := pollAnswerBody(api.CommandsResponse{Commands: cmds}, 13000)
		require.NoError(t, err)
		require.Equal(t, 2, kept, "two fit in 13,000 bytes, a third does not")
		var got api.CommandsResponse
		require.NoError(t, json.Unmarshal(body, &got))
		require.Len(t, got.Commands, 2)
		_, kept, err = pollAnswerBody(api.CommandsResponse{Commands: cmds}, 100)
		require.NoError(t, err)
		require.Equal(t, 1, kept, "one command always goes, however large")
	})
}
