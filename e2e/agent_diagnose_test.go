package e2e

import (
	"encoding/json"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/internal/testwait"
)

// diagnoseOp is the part of an operation a diagnose test reads.
type diagnoseOp struct {
	OperationID string          `json:"operation_id"`
	State       string          `json:"state"`
	Result      json.RawMessage `json:"result"`
	Error       *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// diagnose submits node.diagnose and waits for it to end.
func diagnose(t *testing.T, s *Server, nodeID, requestID string, op any) diagnoseOp {
	t.Helper()
	var got diagnoseOp
	s.API(t, http.MethodPost, "/api/v1/operations", map[string]any{"request_id": requestID, "kind": "node.diagnose",
		"targets": []any{map[string]any{"kind": "node", "id": nodeID}}, "operation": op}, http.StatusCreated, &got)
	testwait.For(t, "diagnose "+requestID+" to end", time.Minute, func() bool {
		s.API(t, http.MethodGet, "/api/v1/operations/"+got.OperationID, nil, http.StatusOK, &got)
		return got.State == "succeeded" || got.State == "failed" || got.State == "cancelled"
	})
	if got.State != "succeeded" {
		t.Fatalf("diagnose %s: %s %+v", requestID, got.State, got.Error)
	}
	return got
}

// TestAgentDiagnose runs every diagnostic action on a real agent binary
// through the ledger: the node reports diag.v1, and disk, connect (an open
// and a closed port), resolve, workloads, clock and agent answer evidence
// as the operation's result.
func TestAgentDiagnose(t *testing.T) {
	t.Parallel()
	s := StartServer(t, ServerOptions{})
	f, b, a := enrolledAgent(t, s, "e2e-diagnose", AgentOptions{Name: "agent"})
	node := b.NodeID

	var rec struct {
		Capabilities []string `json:"capabilities"`
	}
	s.API(t, http.MethodGet, "/api/v1/nodes/"+node, nil, http.StatusOK, &rec)
	if !slices.Contains(rec.Capabilities, api.CapDiag) {
		t.Fatalf("node capabilities %v, want %s", rec.Capabilities, api.CapDiag)
	}

	var disk api.DiskEvidence
	op := diagnose(t, s, node, "e2e-disk", map[string]any{"action": "disk", "paths": []string{"/"}})
	if err := json.Unmarshal(op.Result, &disk); err != nil {
		t.Fatal(err)
	}
	if len(disk.Paths) != 2 || disk.Paths[0].Path != a.StateDir || disk.Paths[0].TotalBytes <= 0 || disk.Paths[1].Path != "/" {
		t.Fatalf("disk evidence %s", op.Result)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var conn api.ConnectEvidence
	op = diagnose(t, s, node, "e2e-connect-open", map[string]any{"action": "connect", "host": "127.0.0.1",
		"port": ln.Addr().(*net.TCPAddr).Port, "timeout_seconds": 5})
	if err := json.Unmarshal(op.Result, &conn); err != nil || !conn.Connected {
		t.Fatalf("connect to a listening port: %s", op.Result)
	}
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := closed.Addr().(*net.TCPAddr).Port
	closed.Close()
	op = diagnose(t, s, node, "e2e-connect-closed", map[string]any{"action": "connect", "host": "127.0.0.1", "port": port})
	conn = api.ConnectEvidence{}
	if err := json.Unmarshal(op.Result, &conn); err != nil || conn.Connected || conn.Error == "" {
		t.Fatalf("connect to a closed port is evidence: %s", op.Result)
	}

	var clk api.ClockEvidence
	op = diagnose(t, s, node, "e2e-clock", map[string]any{"action": "clock"})
	if err := json.Unmarshal(op.Result, &clk); err != nil || clk.Server == nil || clk.IssuedAt == nil {
		t.Fatalf("clock evidence %s", op.Result)
	}
	// One machine, one clock: the server's bounds hold zero skew.
	if clk.Server.SkewMinMs > 0 || clk.Server.SkewMaxMs < 0 {
		t.Fatalf("skew bounds [%d, %d] ms exclude 0 on one machine", clk.Server.SkewMinMs, clk.Server.SkewMaxMs)
	}

	var res api.ResolveEvidence
	op = diagnose(t, s, node, "e2e-resolve", map[string]any{"action": "resolve", "names": []string{"localhost", "nodeward-e2e.invalid"}})
	if err := json.Unmarshal(op.Result, &res); err != nil || len(res.Results) != 2 {
		t.Fatalf("resolve evidence %s", op.Result)
	}
	if r := res.Results[0]; r.Name != "localhost" || len(r.Addresses) == 0 || r.Error != "" {
		t.Fatalf("localhost resolves on any machine: %+v", r)
	}
	// A name that cannot resolve is evidence too (RFC 6761 reserves .invalid).
	if r := res.Results[1]; r.Name != "nodeward-e2e.invalid" || len(r.Addresses) != 0 || r.Error == "" {
		t.Fatalf("an .invalid name answered %+v", r)
	}

	f.issue(node, api.KindLaunchWorkload, "e2e-diag-launch", launchPayload("diag-run", "exit 3", nil))
	f.waitApplied("e2e-diag-launch", time.Minute)
	var wl api.WorkloadsEvidence
	testwait.For(t, "the workload's exit in the workloads evidence", time.Minute, func() bool {
		op = diagnose(t, s, node, "e2e-workloads-"+time.Now().Format("150405.000000"), map[string]any{"action": "workloads"})
		wl = api.WorkloadsEvidence{}
		if err := json.Unmarshal(op.Result, &wl); err != nil {
			t.Fatal(err)
		}
		for _, w := range wl.Workloads {
			if w.RunID == "diag-run" && w.State == api.WorkloadExited && w.ExitCode != nil && *w.ExitCode == 3 {
				return true
			}
		}
		return false
	})

	var ag api.AgentEvidence
	op = diagnose(t, s, node, "e2e-agent", map[string]any{"action": "agent"})
	if err := json.Unmarshal(op.Result, &ag); err != nil || ag.Version == "" || ag.StartedAt.IsZero() ||
		!slices.Contains(ag.Capabilities, api.CapDiag) || ag.JournalOps == 0 {
		t.Fatalf("agent evidence %s", op.Result)
	}
}
