package views

import (
	"net/url"
	"time"
)

// Desired configuration, capabilities and diagnostics on the node page
// (ARCHITECTURE.md §2, DECISIONS.md §32, §45, §46), the lagging list, and
// diagnose evidence on the operation page.

// ConfigVerdicts are the verdicts of a node's last report (fleet.Verdict*).
var ConfigVerdicts = []string{"applied", "failed", "stale", "mismatch", "none"}

// ConfigPanel is a node's desired configuration and its last report, as
// administrators read it (GET /api/v1/nodes/{id}/config): the document
// with sealed values masked, never decrypted into the page.
type ConfigPanel struct {
	// Unavailable: the configuration could not be read just now.
	Unavailable bool
	Desired     *DesiredConfig
	Reported    *ConfigReportRow
	// AppliedRevision is 0 before any apply.
	AppliedRevision int64
	Verdict         string
	Lagging         bool
}

// DesiredConfig is the desired configuration.
type DesiredConfig struct {
	Revision    int64
	Hash        string
	Format      string
	SizeBytes   int64
	UpdatedAt   time.Time
	OperationID string
	// Document is the indented document, sealed values as "[sealed]";
	// Cleared when the configuration was cleared (JSON null).
	Document string
	Cleared  bool
}

// ConfigReportRow is the node's last configuration report.
type ConfigReportRow struct {
	Revision   int64
	Hash       string
	State      string
	Message    string
	ObservedAt time.Time
}

// ShortHash is the first 12 characters of a hash (the full one goes in a
// title).
func ShortHash(h string) string {
	if len(h) > 12 {
		return h[:12] + "…"
	}
	return h
}

// ConfigForm is the set-configuration form and the clear-configuration
// form, each with the request id minted when the page was rendered.
type ConfigForm struct {
	RequestID string
	Format    string
	Document  string
	Force     bool
	// Errors maps a field (format, document, force) to what is wrong.
	Errors map[string]string
	Error  string

	ClearRequestID string
	ClearErrors    map[string]string
	ClearError     string
}

// Capabilities is what the node's agent reports it understands.
type Capabilities struct {
	// Known: the agent reported facts (false for an enrolling node).
	Known bool
	// Legacy: the facts carry no list; they are read as commands.v1 and
	// config.v1 (DECISIONS.md §45).
	Legacy bool
	List   []string
	// Diag: the node may be sent diagnostics (diag.v1, or not known yet:
	// checked when the command is delivered).
	Diag bool
}

// DiagnoseAction is one diagnose action the node page offers, with its
// form's parameters.
type DiagnoseAction struct {
	Action string
	Title  string
	Help   string
	Params []DiagnoseParam
}

// DiagnoseParam is one parameter field of a diagnose form.
type DiagnoseParam struct {
	Name  string
	Label string
	Hint  string
	// Multi: a textarea, one value a line.
	Multi bool
	// Numeric: a number field (inputmode).
	Numeric bool
}

// DiagnoseActions are the whitelisted actions (DECISIONS.md §46), in form
// order.
var DiagnoseActions = []DiagnoseAction{
	{Action: "clock", Title: "Clock", Help: "The node's time against the server's: the skew, with its uncertainty."},
	{Action: "agent", Title: "Agent", Help: "Version, uptime, spool and journal sizes, capabilities."},
	{Action: "workloads", Title: "Workloads", Help: "Every attempt the node's runtime knows, with its supervisor's state."},
	{Action: "disk", Title: "Disk", Help: "Usage of the agent's state directory and up to 8 more paths.", Params: []DiagnoseParam{
		{Name: "paths", Label: "Paths (optional)", Hint: "Absolute paths, one a line, e.g. /var/lib/docker.", Multi: true}}},
	{Action: "connect", Title: "Connect", Help: "A TCP connect from the node to host:port.", Params: []DiagnoseParam{
		{Name: "host", Label: "Host", Hint: "A host name or an IP address."},
		{Name: "port", Label: "Port", Hint: "1 to 65535.", Numeric: true},
		{Name: "timeout_seconds", Label: "Timeout, seconds (optional)", Hint: "At most 10; default 5.", Numeric: true}}},
	{Action: "resolve", Title: "Resolve", Help: "DNS lookups from the node.", Params: []DiagnoseParam{
		{Name: "names", Label: "Host names", Hint: "Up to 10, one a line.", Multi: true}}},
}

// DiagnoseForms are the node page's diagnose forms: a request id per
// action, and the values and errors of the one submitted (Action).
type DiagnoseForms struct {
	RequestIDs map[string]string
	Action     string
	Values     map[string]string
	Errors     map[string]string
	Error      string
}

// value is a field's value on the form of action.
func (f DiagnoseForms) value(action, name string) string {
	if f.Action != action {
		return ""
	}
	return f.Values[name]
}

// fieldError is a field's error on the form of action.
func (f DiagnoseForms) fieldError(action, name string) string {
	if f.Action != action {
		return ""
	}
	return f.Errors[name]
}

// LaggingRow is one node lagging its desired configuration.
type LaggingRow struct {
	NodeID          string
	DesiredRevision int64
	AppliedRevision int64
	Verdict         string
	ReportedAt      *time.Time
}

// LaggingView is one page of the nodes lagging their desired
// configuration, by node id descending.
type LaggingView struct {
	Now           time.Time
	Count         int64
	NeverReported int64
	Nodes         []LaggingRow
	Paged         bool
	// NextBefore is the next page's cursor; "" on the last page.
	NextBefore string
	Error      string
}

// NextHref links the next page.
func (v LaggingView) NextHref() string {
	return "/console/config/lagging?" + url.Values{"before": {v.NextBefore}}.Encode()
}

// Evidence is diagnose evidence (or a configure result) made readable:
// facts as a list, rows as tables, and the JSON itself when its shape is
// not one the console knows. Every value is agent- or endpoint-controlled
// text: templ escapes it.
type Evidence struct {
	Title  string
	Facts  []EvidenceFact
	Tables []EvidenceTable
	// Raw is the indented JSON, shown when the shape is unknown.
	Raw string
}

// EvidenceFact is one labelled value.
type EvidenceFact struct {
	Label string
	Value string
	// Tone colours the value: "ok", "bad", "warn" or "".
	Tone string
}

// EvidenceTable is one table of evidence rows.
type EvidenceTable struct {
	Caption string
	TestID  string
	Columns []string
	Rows    [][]string
	// Empty is what to say when there are no rows.
	Empty string
}

// BytesText is a byte count for people ("12.3 GiB").
func BytesText(n int64) string { return bytesText(n) }
