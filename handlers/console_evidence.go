package handlers

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/diagnose"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/views"
)

// readableResult makes an operation's result readable on its page:
// diagnose evidence (node.diagnose, the fleet.diagnose summary,
// diagnose.endpoint) as facts and tables, a configure's outcome by
// revision. Evidence comes from nodes and probed endpoints: it is only
// ever text here, escaped by the page. A shape the console does not know
// falls back to the JSON. nil: the kind has nothing to show (yet).
func readableResult(op ledger.Operation) *views.Evidence {
	switch op.Kind {
	case ledger.KindNodeConfigure:
		return configureOutcome(op)
	}
	if len(op.Result) == 0 || string(op.Result) == "null" {
		return nil
	}
	switch op.Kind {
	case ledger.KindNodeDiagnose:
		return nodeEvidence(op.Result)
	case ledger.KindFleetDiagnose:
		return fleetEvidence(op.Result)
	case ledger.KindDiagnoseEndpoint:
		return endpointEvidence(op.Result)
	}
	return nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func okTone(b bool) string {
	if b {
		return "ok"
	}
	return "bad"
}

func msText(ms float64) string { return strconv.FormatFloat(ms, 'f', 1, 64) + " ms" }

func stamp(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func stampPtr(t *time.Time) string {
	if t == nil {
		return "—"
	}
	return stamp(*t)
}

func fact(label, value string) views.EvidenceFact {
	return views.EvidenceFact{Label: label, Value: value}
}

// rawEvidence is the fallback: the JSON, indented.
func rawEvidence(title string, raw json.RawMessage) *views.Evidence {
	return &views.Evidence{Title: title, Raw: prettyJSON(raw)}
}

func nodeEvidence(raw json.RawMessage) *views.Evidence {
	var head struct {
		Action string `json:"action"`
	}
	if json.Unmarshal(raw, &head) != nil {
		return rawEvidence("Evidence", raw)
	}
	title := "Evidence: " + head.Action
	var e *views.Evidence
	switch head.Action {
	case api.DiagDisk:
		e = diskEvidence(raw)
	case api.DiagWorkloads:
		e = workloadsEvidence(raw)
	case api.DiagConnect:
		e = connectEvidence(raw)
	case api.DiagResolve:
		e = resolveEvidence(raw)
	case api.DiagClock:
		e = clockEvidence(raw)
	case api.DiagAgent:
		e = agentEvidence(raw)
	}
	if e == nil {
		return rawEvidence(title, raw)
	}
	e.Title = title
	return e
}

func diskEvidence(raw json.RawMessage) *views.Evidence {
	var d api.DiskEvidence
	if json.Unmarshal(raw, &d) != nil {
		return nil
	}
	t := views.EvidenceTable{Caption: "Disk usage", TestID: "evidence-disk",
		Columns: []string{"Path", "Total", "Used", "Free", "Used %", "Error"}, Empty: "No path was measured."}
	for _, p := range d.Paths {
		if p.Error != "" {
			t.Rows = append(t.Rows, []string{p.Path, "—", "—", "—", "—", p.Error})
			continue
		}
		t.Rows = append(t.Rows, []string{p.Path, views.BytesText(p.TotalBytes), views.BytesText(p.UsedBytes),
			views.BytesText(p.FreeBytes), strconv.FormatFloat(p.UsedPct, 'f', 1, 64) + " %", ""})
	}
	return &views.Evidence{Facts: []views.EvidenceFact{fact("Ran at", stamp(d.RanAt))}, Tables: []views.EvidenceTable{t}}
}

func workloadsEvidence(raw json.RawMessage) *views.Evidence {
	var d api.WorkloadsEvidence
	if json.Unmarshal(raw, &d) != nil {
		return nil
	}
	t := views.EvidenceTable{Caption: "Workloads", TestID: "evidence-workloads",
		Columns: []string{"Run", "Attempt", "State", "Exit code", "Signal", "Supervisor lost", "Started", "Exited", "Failure"},
		Empty:   "The node's runtime knows no workload."}
	for _, w := range d.Workloads {
		exit := "—"
		if w.ExitCode != nil {
			exit = strconv.Itoa(*w.ExitCode)
		}
		t.Rows = append(t.Rows, []string{w.RunID, w.AttemptID, w.State, exit, w.Signal, yesNo(w.SupervisorLost),
			stampPtr(w.StartedAt), stampPtr(w.ExitedAt), w.Failure})
	}
	facts := []views.EvidenceFact{fact("Ran at", stamp(d.RanAt))}
	if d.Truncated {
		facts = append(facts, views.EvidenceFact{Label: "Truncated", Value: "more attempts than fit in the evidence", Tone: "warn"})
	}
	return &views.Evidence{Facts: facts, Tables: []views.EvidenceTable{t}}
}

func connectEvidence(raw json.RawMessage) *views.Evidence {
	var d api.ConnectEvidence
	if json.Unmarshal(raw, &d) != nil {
		return nil
	}
	result := "refused or unreachable"
	if d.Connected {
		result = "connected"
	}
	facts := []views.EvidenceFact{
		fact("Target", d.Host+":"+strconv.Itoa(d.Port)),
		{Label: "Result", Value: result, Tone: okTone(d.Connected)},
		fact("Latency", msText(d.LatencyMs)),
		fact("Timeout", strconv.FormatFloat(d.TimeoutSeconds, 'f', -1, 64)+" s"),
	}
	if d.RemoteAddr != "" {
		facts = append(facts, fact("Remote address", d.RemoteAddr))
	}
	if d.Error != "" {
		facts = append(facts, fact("Error", d.Error))
	}
	facts = append(facts, fact("Ran at", stamp(d.RanAt)))
	return &views.Evidence{Facts: facts}
}

func resolveEvidence(raw json.RawMessage) *views.Evidence {
	var d api.ResolveEvidence
	if json.Unmarshal(raw, &d) != nil {
		return nil
	}
	t := views.EvidenceTable{Caption: "Answers", TestID: "evidence-resolve", Columns: []string{"Name", "Addresses", "Error"},
		Empty: "No name was looked up."}
	for _, r := range d.Results {
		t.Rows = append(t.Rows, []string{r.Name, strings.Join(r.Addresses, ", "), r.Error})
	}
	return &views.Evidence{Facts: []views.EvidenceFact{fact("Ran at", stamp(d.RanAt))}, Tables: []views.EvidenceTable{t}}
}

func clockEvidence(raw json.RawMessage) *views.Evidence {
	var d api.ClockEvidence
	if json.Unmarshal(raw, &d) != nil {
		return nil
	}
	facts := []views.EvidenceFact{fact("Node time", stamp(d.NodeTime))}
	if s := d.Server; s != nil {
		facts = append(facts,
			fact("Skew range", fmt.Sprintf("%d ms to %d ms (node minus server)", s.SkewMinMs, s.SkewMaxMs)),
			fact("Skew", fmt.Sprintf("%d ms ± %d ms", s.SkewMs, s.UncertaintyMs)),
			fact("Delivered at", stamp(s.DeliveredAt)),
			fact("Answer received at", stamp(s.ReceivedAt)))
	} else {
		facts = append(facts, fact("Skew range", "not measured by the server"))
	}
	if d.IssuedAt != nil {
		facts = append(facts, fact("Issued at", stamp(*d.IssuedAt)))
	}
	if d.NodeMinusIssuedMs != nil {
		facts = append(facts, fact("Node minus issue time", strconv.FormatInt(*d.NodeMinusIssuedMs, 10)+" ms (an upper bound of how far the node runs ahead)"))
	}
	return &views.Evidence{Facts: facts}
}

func agentEvidence(raw json.RawMessage) *views.Evidence {
	var d api.AgentEvidence
	if json.Unmarshal(raw, &d) != nil {
		return nil
	}
	return &views.Evidence{Facts: []views.EvidenceFact{
		fact("Version", d.Version),
		fact("Started", stamp(d.StartedAt)),
		fact("Uptime", (time.Duration(d.UptimeSeconds) * time.Second).String()),
		fact("Spool", strconv.Itoa(d.SpoolEvents)+" events, "+views.BytesText(d.SpoolBytes)),
		fact("Dropped heartbeats", strconv.Itoa(d.DroppedHeartbeats)),
		fact("Journal", strconv.Itoa(d.JournalOps)+" operations, "+views.BytesText(d.JournalBytes)),
		fact("Unacknowledged results", strconv.Itoa(d.UnackedResults)),
		fact("Capabilities", strings.Join(d.Capabilities, ", ")),
		fact("Runtimes", strings.Join(d.Runtimes, ", ")),
		fact("Ran at", stamp(d.RanAt)),
	}}
}

func endpointEvidence(raw json.RawMessage) *views.Evidence {
	var d diagnose.Evidence
	if json.Unmarshal(raw, &d) != nil {
		return rawEvidence("Endpoint evidence", raw)
	}
	status := "—"
	if d.Status != 0 {
		status = strconv.Itoa(d.Status)
	}
	facts := []views.EvidenceFact{
		fact("URL", d.URL),
		{Label: "Reached", Value: yesNo(d.Reached), Tone: okTone(d.Reached)},
		fact("Status", status),
		fact("Latency", msText(d.LatencyMs)),
	}
	if d.ConnectedTo != "" {
		facts = append(facts, fact("Connected to", d.ConnectedTo))
	}
	if len(d.Addresses) > 0 {
		facts = append(facts, fact("Addresses", strings.Join(d.Addresses, ", ")))
	}
	facts = append(facts, fact("Credential sent", yesNo(d.CredentialSent)))
	if t := d.TLS; t != nil {
		expiry := stamp(t.NotAfter) + " (in " + (time.Duration(t.ExpiresInSeconds) * time.Second).String() + ")"
		tone := ""
		if t.ExpiresInSeconds < 14*24*3600 {
			tone = "warn"
		}
		if t.ExpiresInSeconds <= 0 {
			expiry, tone = stamp(t.NotAfter)+" (expired)", "bad"
		}
		facts = append(facts, fact("TLS version", t.Version), fact("Certificate subject", t.Subject),
			fact("Certificate issuer", t.Issuer), views.EvidenceFact{Label: "TLS expiry", Value: expiry, Tone: tone},
			views.EvidenceFact{Label: "Certificate verified", Value: yesNo(t.Verified), Tone: okTone(t.Verified)})
		if t.VerifyError != "" {
			facts = append(facts, fact("Verify error", t.VerifyError))
		}
	}
	if rd := d.Redirect; rd != nil {
		where := "to another host"
		if rd.SameHost {
			where = "to the same host"
		}
		facts = append(facts, fact("Redirect", rd.Location+" ("+where+", followed: "+yesNo(rd.Followed)+")"))
	}
	if d.Error != "" {
		facts = append(facts, fact("Error", d.Error))
	}
	facts = append(facts, fact("Ran at", stamp(d.RanAt)))
	return &views.Evidence{Title: "Endpoint evidence", Facts: facts}
}

func fleetEvidence(raw json.RawMessage) *views.Evidence {
	var d struct {
		Summary *ledger.DiagnoseSummary `json:"summary"`
	}
	if json.Unmarshal(raw, &d) != nil || d.Summary == nil {
		return rawEvidence("Fleet diagnose summary", raw)
	}
	s := d.Summary
	facts := []views.EvidenceFact{fact("Action", s.Action), fact("Nodes that answered", strconv.Itoa(s.Answered)),
		{Label: "Nodes that failed", Value: strconv.Itoa(s.Failed), Tone: map[bool]string{true: "bad", false: ""}[s.Failed > 0]}}
	if s.Connected != nil {
		facts = append(facts, fact("Connected", strconv.Itoa(*s.Connected)))
	}
	if s.Unreachable != nil {
		facts = append(facts, fact("Unreachable", strconv.Itoa(*s.Unreachable)))
	}
	if w := s.WorstClock; w != nil {
		facts = append(facts, fact("Worst clock skew", fmt.Sprintf("%d ms ± %d ms on node %s", w.SkewMs, w.UncertaintyMs, w.NodeID)))
	}
	if f := s.FullestDisk; f != nil {
		facts = append(facts, fact("Fullest disk", fmt.Sprintf("%s on node %s: %.1f %% used, %s free", f.Path, f.NodeID, f.UsedPercent, views.BytesText(f.FreeBytes))))
	}
	return &views.Evidence{Title: "Fleet diagnose summary", Facts: facts}
}

// configureOutcome is a node.configure's outcome: the format it set and,
// once the node reported, the revision it applied.
func configureOutcome(op ledger.Operation) *views.Evidence {
	var o ledger.ConfigureOperation
	_ = json.Unmarshal(op.Operation, &o)
	facts := []views.EvidenceFact{fact("Format", o.Format)}
	if string(o.Document) == "null" {
		facts = append(facts, fact("Document", "cleared"))
	}
	switch op.State {
	case ledger.StateSucceeded:
		var res ledger.ConfigureResult
		if json.Unmarshal(op.Result, &res) != nil {
			return rawEvidence("Configuration", op.Result)
		}
		facts = append(facts, views.EvidenceFact{Label: "Verdict", Value: res.State, Tone: "ok"},
			fact("Revision", strconv.FormatInt(res.Revision, 10)), fact("Hash", res.Hash))
	case ledger.StateFailed, ledger.StateCancelled:
		code := ""
		if op.Error != nil {
			code = op.Error.Code
		}
		facts = append(facts, views.EvidenceFact{Label: "Verdict", Value: string(op.State) + " " + code, Tone: "bad"})
	default:
		facts = append(facts, fact("Verdict", "waiting for the node's report"))
	}
	if len(op.Targets) == 1 {
		facts = append(facts, fact("Node", op.Targets[0].ID))
	}
	return &views.Evidence{Title: "Configuration", Facts: facts}
}
