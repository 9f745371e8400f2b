package ledger_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/ledger"
)

var diagCaps = []string{api.CapCommands, api.CapDiag}

func TestNodeDiagnose(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		b.start(t)
		t.Run("BadInputIs422NamingTheFieldNothingRecorded", func(t *testing.T) {
			_, sess := b.nodeWith(t, diagCaps)
			nine := `["/a","/b","/c","/d","/e","/f","/g","/h","/i"]`
			eleven := `["a","b","c","d","e","f","g","h","i","j","k"]`
			for _, c := range []struct{ name, op, field string }{
				{"UnknownAction", `{"action":"shell"}`, "operation/action"},
				{"NoAction", `{}`, "operation/action"},
				{"RelativePath", `{"action":"disk","paths":["var/log"]}`, "operation/paths/0"},
				{"MoreThan8Paths", `{"action":"disk","paths":` + nine + `}`, "operation/paths"},
				{"PortZero", `{"action":"connect","host":"db.internal","port":0}`, "operation/port"},
				{"PortTooHigh", `{"action":"connect","host":"db.internal","port":65536}`, "operation/port"},
				{"NoPort", `{"action":"connect","host":"db.internal"}`, "operation/port"},
				{"NotAHostName", `{"action":"connect","host":"db internal;ls","port":5432}`, "operation/host"},
				{"HostNameTooLong", `{"action":"connect","host":"` + strings.Repeat("a", 64) + `.example","port":5432}`, "operation/host"},
				{"TimeoutOver10s", `{"action":"connect","host":"10.0.0.1","port":5432,"timeout_seconds":10.5}`, "operation/timeout_seconds"},
				{"NegativeTimeout", `{"action":"connect","host":"10.0.0.1","port":5432,"timeout_seconds":-1}`, "operation/timeout_seconds"},
				{"MoreThan10Names", `{"action":"resolve","names":` + eleven + `}`, "operation/names"},
				{"NoNames", `{"action":"resolve","names":[]}`, "operation/names"},
				{"BadName", `{"action":"resolve","names":["ok.example","under_score"]}`, "operation/names/1"},
				{"ParameterOfAnotherAction", `{"action":"clock","paths":["/"]}`, "operation/paths"},
				{"NullParameter", `{"action":"disk","paths":null}`, "operation/paths"},
			} {
				t.Run(c.name, func(t *testing.T) {
					before := countOps(t, b)
					_, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindNodeDiagnose,
						Targets: []ledger.Target{{Kind: ledger.TargetNode, ID: sess.NodeID}}, Operation: json.RawMessage(c.op)})
					requireCode(t, err, errcode.ValidationFailed)
					var e *errcode.Error
					require.ErrorAs(t, err, &e)
					require.Equal(t, c.field, e.Fields[0].Field, "%v", e.Fields)
					require.Equal(t, before, countOps(t, b), "nothing recorded")
				})
			}
		})
		t.Run("EvidenceIsTheResult", func(t *testing.T) {
			_, sess := b.nodeWith(t, diagCaps)
			op := b.command(t, sess.NodeID, ledger.KindNodeDiagnose, `{"action":"connect","host":"127.0.0.1","port":1}`)
			require.Equal(t, ledger.ChannelLongPoll, op.Channel)
			require.Equal(t, ledger.FamilyDiagnose, op.Family)
			cmds := b.poll(t, sess)
			require.Len(t, cmds, 1)
			require.Equal(t, api.KindDiagnose, cmds[0].Kind)
			evidence := `{"action":"connect","host":"127.0.0.1","port":1,"connected":false,"error":"connection refused"}`
			b.settle(t, sess, api.Result{OperationID: op.ID, Applied: true, Evidence: json.RawMessage(evidence)})
			done := b.waitState(t, op.ID, ledger.StateSucceeded)
			require.JSONEq(t, evidence, string(done.Result), "a refused connect is evidence, not failure")
		})
		t.Run("RefusedByTheAgentFails", func(t *testing.T) {
			_, sess := b.nodeWith(t, diagCaps)
			op := b.command(t, sess.NodeID, ledger.KindNodeDiagnose, `{"action":"agent"}`)
			b.poll(t, sess)
			b.settle(t, sess, api.Result{OperationID: op.ID, Failure: "diagnose refused: action: nope"})
			done := b.waitState(t, op.ID, ledger.StateFailed)
			require.Equal(t, "refused_by_node", done.Error.Code)
			require.True(t, done.Error.Retryable, "a diagnose has no effect: asking again is safe")
		})
		t.Run("EvidenceNotAnObjectOrTooLargeFails", func(t *testing.T) {
			_, sess := b.nodeWith(t, diagCaps)
			for _, ev := range []string{`[1,2]`, `{"action":"disk","pad":"` + strings.Repeat("x", api.MaxEvidenceBytes) + `"}`} {
				op := b.command(t, sess.NodeID, ledger.KindNodeDiagnose, `{"action":"disk"}`)
				b.poll(t, sess)
				b.settle(t, sess, api.Result{OperationID: op.ID, Applied: true, Evidence: json.RawMessage(ev)})
				done := b.waitState(t, op.ID, ledger.StateFailed)
				require.Equal(t, fleet.CodeEvidenceInvalid, done.Error.Code)
				require.Less(t, len(done.Result), 100)
			}
		})
		// The node knows only its clock and issued_at; the server bounds
		// the skew by its own delivery and receipt times.
		t.Run("ClockSkewBoundedByTheServer", func(t *testing.T) {
			_, sess := b.nodeWith(t, diagCaps)
			op := b.command(t, sess.NodeID, ledger.KindNodeDiagnose, `{"action":"clock"}`)
			b.clock.Advance(10 * time.Second) // it waited before delivery
			delivered := b.clock.Now()
			b.poll(t, sess)
			b.clock.Advance(2 * time.Second)                            // the answer takes 2 s to arrive
			nodeTime := delivered.Add(time.Second).Add(5 * time.Minute) // read 1 s in, 5 min ahead
			ev, _ := json.Marshal(api.ClockEvidence{Action: "clock", RanAt: nodeTime, NodeTime: nodeTime})
			b.settle(t, sess, api.Result{OperationID: op.ID, Applied: true, Evidence: ev})
			done := b.waitState(t, op.ID, ledger.StateSucceeded)
			var got api.ClockEvidence
			require.NoError(t, json.Unmarshal(done.Result, &got))
			require.NotNil(t, got.Server)
			want := (5 * time.Minute).Milliseconds()
			require.LessOrEqual(t, got.Server.SkewMinMs, want)
			require.GreaterOrEqual(t, got.Server.SkewMaxMs, want)
			require.Equal(t, int64(1000), got.Server.UncertaintyMs, "half the delivery-to-receipt window")
			require.Equal(t, want, got.Server.SkewMs)
		})
		t.Run("FleetDiagnoseSummarises", func(t *testing.T) {
			sessions := map[string]fleet.Session{}
			var ids []string
			for range 3 {
				_, s := b.nodeWith(t, diagCaps)
				sessions[s.NodeID] = s
				ids = append(ids, s.NodeID)
			}
			parent, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindFleetDiagnose,
				Targets: nodeTargets(ids...), Operation: json.RawMessage(`{"diagnose":{"action":"connect","host":"db.internal","port":5432}}`)})
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				for id, s := range sessions {
					for _, c := range b.poll(t, s) {
						ev := `{"action":"connect","connected":` + map[bool]string{true: "true", false: "false"}[id != ids[0]] + `}`
						b.settle(t, s, api.Result{OperationID: c.OperationID, Applied: true, Evidence: json.RawMessage(ev)})
					}
				}
				op, err := b.store.Operation(ctx, parent.ID)
				require.NoError(t, err)
				return op.Terminal()
			}, waitLong, tick)
			done := b.waitState(t, parent.ID, ledger.StateSucceeded)
			var res struct {
				Summary ledger.DiagnoseSummary `json:"summary"`
			}
			require.NoError(t, json.Unmarshal(done.Result, &res))
			require.Equal(t, "connect", res.Summary.Action)
			require.Equal(t, 3, res.Summary.Answered)
			require.Equal(t, 2, *res.Summary.Connected)
			require.Equal(t, 1, *res.Summary.Unreachable)
		})
		t.Run("FleetDiagnoseBadInput", func(t *testing.T) {
			_, s := b.nodeWith(t, diagCaps)
			before := countOps(t, b)
			_, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindFleetDiagnose,
				Targets: nodeTargets(s.NodeID), Operation: json.RawMessage(`{"diagnose":{"action":"connect","host":"x","port":99999}}`)})
			requireCode(t, err, errcode.ValidationFailed)
			var e *errcode.Error
			require.ErrorAs(t, err, &e)
			require.Equal(t, "operation/diagnose/port", e.Fields[0].Field)
			require.Equal(t, before, countOps(t, b))
		})
	})
}

func TestSummarizeDiagnose(t *testing.T) {
	ok := func(node, result string) ledger.Operation {
		return ledger.Operation{TargetID: node, State: ledger.StateSucceeded, Operation: json.RawMessage(`{"action":"` + actionOf(result) + `"}`),
			Result: json.RawMessage(result)}
	}
	s := ledger.SummarizeDiagnose([]ledger.Operation{
		ok("n1", `{"action":"clock","server":{"skew_ms":-900,"uncertainty_ms":5}}`),
		ok("n2", `{"action":"clock","server":{"skew_ms":300,"uncertainty_ms":5}}`),
		{TargetID: "n3", State: ledger.StateFailed, Operation: json.RawMessage(`{"action":"clock"}`)},
	})
	require.Equal(t, 2, s.Answered)
	require.Equal(t, 1, s.Failed)
	require.Equal(t, "n1", s.WorstClock.NodeID)
	require.Equal(t, int64(-900), s.WorstClock.SkewMs)

	s = ledger.SummarizeDiagnose([]ledger.Operation{
		ok("n1", `{"action":"disk","paths":[{"path":"/var/lib/nodeward","total_bytes":100,"free_bytes":40,"used_percent":60}]}`),
		ok("n2", `{"action":"disk","paths":[{"path":"/data","total_bytes":100,"free_bytes":5,"used_percent":95},{"path":"/x","error":"no such file"}]}`),
	})
	require.Equal(t, "n2", s.FullestDisk.NodeID)
	require.Equal(t, "/data", s.FullestDisk.Path)
	require.Equal(t, 95.0, s.FullestDisk.UsedPercent)
}

func actionOf(result string) string {
	var h struct {
		Action string `json:"action"`
	}
	_ = json.Unmarshal([]byte(result), &h)
	return h.Action
}
