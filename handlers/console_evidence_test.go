package handlers

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/views"
)

// factsOf answers an evidence's facts by label.
func evidenceFacts(e *views.Evidence) map[string]string {
	out := map[string]string{}
	for _, f := range e.Facts {
		out[f.Label] = f.Value
	}
	return out
}

func TestReadableResult(t *testing.T) {
	op := func(kind, result string) ledger.Operation {
		return ledger.Operation{Kind: kind, State: ledger.StateSucceeded, Result: json.RawMessage(result)}
	}

	t.Run("Disk", func(t *testing.T) {
		e := readableResult(op(ledger.KindNodeDiagnose, `{"action":"disk","ran_at":"2026-01-01T00:00:00Z","paths":[
			{"path":"/state","total_bytes":1073741824,"free_bytes":536870912,"used_bytes":536870912,"used_percent":50},
			{"path":"/gone","error":"no such file"}]}`))
		require.Equal(t, "Evidence: disk", e.Title)
		require.Len(t, e.Tables, 1)
		require.Equal(t, [][]string{{"/state", "1.0 GiB", "512.0 MiB", "512.0 MiB", "50.0 %", ""}, {"/gone", "—", "—", "—", "—", "no such file"}}, e.Tables[0].Rows)
	})

	t.Run("Workloads", func(t *testing.T) {
		e := readableResult(op(ledger.KindNodeDiagnose, `{"action":"workloads","ran_at":"2026-01-01T00:00:00Z","truncated":true,
			"workloads":[{"run_id":"r1","attempt_id":"a1","state":"exited","exit_code":3,"supervisor_lost":true}]}`))
		require.Equal(t, []string{"r1", "a1", "exited", "3", "", "yes", "—", "—", ""}, e.Tables[0].Rows[0])
		require.Contains(t, evidenceFacts(e), "Truncated")
	})

	t.Run("Resolve", func(t *testing.T) {
		e := readableResult(op(ledger.KindNodeDiagnose, `{"action":"resolve","ran_at":"2026-01-01T00:00:00Z","results":[
			{"name":"db","addresses":["10.0.0.1","10.0.0.2"]},{"name":"nope","addresses":[],"error":"no such host"}]}`))
		require.Equal(t, [][]string{{"db", "10.0.0.1, 10.0.0.2", ""}, {"nope", "", "no such host"}}, e.Tables[0].Rows)
	})

	t.Run("Clock", func(t *testing.T) {
		e := readableResult(op(ledger.KindNodeDiagnose, `{"action":"clock","ran_at":"2026-01-01T00:00:00Z","node_time":"2026-01-01T00:00:00Z",
			"server":{"delivered_at":"2026-01-01T00:00:00Z","received_at":"2026-01-01T00:00:01Z","skew_min_ms":-400,"skew_max_ms":600,"skew_ms":100,"uncertainty_ms":500}}`))
		f := evidenceFacts(e)
		require.Equal(t, "-400 ms to 600 ms (node minus server)", f["Skew range"])
		require.Equal(t, "100 ms ± 500 ms", f["Skew"])
	})

	t.Run("Agent", func(t *testing.T) {
		e := readableResult(op(ledger.KindNodeDiagnose, `{"action":"agent","ran_at":"2026-01-01T00:00:00Z","version":"1.2.3",
			"uptime_seconds":3700,"spool_events":4,"spool_bytes":2048,"capabilities":["commands.v1","diag.v1"],"runtimes":["process"]}`))
		f := evidenceFacts(e)
		require.Equal(t, "1.2.3", f["Version"])
		require.Equal(t, "1h1m40s", f["Uptime"])
		require.Equal(t, "4 events, 2.0 KiB", f["Spool"])
		require.Equal(t, "commands.v1, diag.v1", f["Capabilities"])
	})

	t.Run("UnknownShapeIsJSON", func(t *testing.T) {
		e := readableResult(op(ledger.KindNodeDiagnose, `{"action":"teleport","x":1}`))
		require.Contains(t, e.Raw, `"teleport"`)
		e = readableResult(op(ledger.KindNodeDiagnose, `{"action":"connect","port":"not a number"}`))
		require.Contains(t, e.Raw, "not a number")
		require.Nil(t, readableResult(ledger.Operation{Kind: ledger.KindNodeDiagnose, State: ledger.StateRunning}))
	})

	t.Run("Endpoint", func(t *testing.T) {
		e := readableResult(op(ledger.KindDiagnoseEndpoint, `{"action":"endpoint","url":"https://svc.example/health","ran_at":"2026-01-01T00:00:00Z",
			"reached":true,"status":301,"latency_ms":12.34,"credential_sent":false,
			"tls":{"version":"TLS 1.3","subject":"CN=svc","issuer":"CN=ca","not_after":"2026-01-05T00:00:00Z","expires_in_seconds":345600,"verified":true},
			"redirect":{"location":"https://elsewhere.example/","same_host":false,"followed":false}}`))
		f := evidenceFacts(e)
		require.Equal(t, "301", f["Status"])
		require.Equal(t, "12.3 ms", f["Latency"])
		require.Equal(t, "2026-01-05T00:00:00Z (in 96h0m0s)", f["TLS expiry"])
		require.Equal(t, "https://elsewhere.example/ (to another host, followed: no)", f["Redirect"])
		for _, x := range e.Facts {
			if x.Label == "TLS expiry" {
				require.Equal(t, "warn", x.Tone, "expiring within two weeks")
			}
		}
	})

	t.Run("FleetSummary", func(t *testing.T) {
		e := readableResult(op(ledger.KindFleetDiagnose, `{"counts":{"total":3},"summary":{"action":"clock","answered":2,"failed":1,
			"worst_clock_skew":{"node_id":"n7","skew_ms":-900,"uncertainty_ms":20}}}`))
		f := evidenceFacts(e)
		require.Equal(t, "2", f["Nodes that answered"])
		require.Equal(t, "-900 ms ± 20 ms on node n7", f["Worst clock skew"])
	})

	t.Run("Configure", func(t *testing.T) {
		o := op(ledger.KindNodeConfigure, `{"revision":4,"hash":"abc","state":"applied"}`)
		o.Operation = json.RawMessage(`{"format":"app/v1","document":{"a":1}}`)
		f := evidenceFacts(readableResult(o))
		require.Equal(t, "applied", f["Verdict"])
		require.Equal(t, "4", f["Revision"])
		require.Equal(t, "app/v1", f["Format"])
		o = ledger.Operation{Kind: ledger.KindNodeConfigure, State: ledger.StatePending, Operation: json.RawMessage(`{"format":"app/v1","document":null}`)}
		f = evidenceFacts(readableResult(o))
		require.Equal(t, "waiting for the node's report", f["Verdict"])
		require.Equal(t, "cleared", f["Document"])
	})
}
