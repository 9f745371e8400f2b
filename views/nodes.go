package views

import (
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Disk report states (API.md: disk.state).
const (
	DiskNeverReported = "never_reported"
	DiskUnmeasurable  = "unmeasurable"
	DiskMeasured      = "measured"
)

// DiskInfo is a node's last disk report.
type DiskInfo struct {
	State      string
	FreeBytes  *int64
	ObservedAt *time.Time
}

// NodeRow is one node in the nodes list.
type NodeRow struct {
	ID            string
	RentalID      string
	Generation    int64
	State         string
	FencingToken  int64
	Hostname      string
	LastHeartbeat *time.Time
	AgentVersion  string
	Disk          DiskInfo
	// Price is the shadow price formatted for display; "" when unpriced.
	Price string
}

// Href is the node's detail page.
func (n NodeRow) Href() string { return NodeHref(n.ID) }

// NodeHref is a node's console page.
func NodeHref(id string) string { return "/console/nodes/" + url.PathEscape(id) }

// NodeFilter is the nodes list's filter as the page was asked for it.
type NodeFilter struct {
	State string
	// Lapsing keeps ready nodes whose lease is about to end.
	Lapsing bool
}

// Query is the filter as a query string (without the cursor), "" when none.
func (f NodeFilter) Query() string {
	q := url.Values{}
	if f.State != "" {
		q.Set("state", f.State)
	}
	if f.Lapsing {
		q.Set("lease", "lapsing")
	}
	return q.Encode()
}

// NodesView is one page of the nodes list, newest first.
type NodesView struct {
	Now    time.Time
	Filter NodeFilter
	Nodes  []NodeRow
	// Paged is true when this is not the first page.
	Paged bool
	// OlderBefore is the cursor of the next (older) page; "" when none.
	OlderBefore string
	// Error explains a filter or cursor that was refused (the list is then
	// empty).
	Error string
}

// OlderHref is the link to the next older page, keeping the filter.
func (v NodesView) OlderHref() string {
	q := v.Filter.Query()
	if q != "" {
		q += "&"
	}
	return "/console/nodes?" + q + "before=" + url.QueryEscape(v.OlderBefore)
}

// Fact is one of a node's facts, as reported by its agent (so never
// trusted: templ escapes it like everything else).
type Fact struct {
	Key   string
	Value string
}

// WorkloadRow is one workload attempt and its latest observation.
type WorkloadRow struct {
	RunID      string
	AttemptID  string
	State      string
	ExitCode   *int
	ObservedAt *time.Time
	// Output is the attempt's reported output tail, when it reported one.
	HasOutput  bool
	StdoutTail string
	StderrTail string
	Truncated  bool
}

// CommandRow is one command sent to a node.
type CommandRow struct {
	OperationID   string
	Kind          string
	State         string
	IssuedAt      time.Time
	SettledAt     *time.Time
	DeliveryCount int
	Failure       string
}

// TimelineRow is one line of a node's timeline: a node audit entry or an
// operation event (DECISIONS.md §41).
type TimelineRow struct {
	At          time.Time
	Source      string
	Action      string
	Actor       string
	OperationID string
	Kind        string
	Detail      string
}

// NodeOperationRow is an operation that targeted the node.
type NodeOperationRow struct {
	ID        string
	Kind      string
	State     string
	CreatedAt time.Time
	Error     string
}

// CommandKinds are the kinds the command form offers (the API's names).
var CommandKinds = []string{"prepare_image", "prepare_artifact", "launch_workload", "stop_workload"}

// CommandForm is the issue-a-command form: its values and errors, and the
// request id minted when it was rendered (a double submit is one
// operation).
type CommandForm struct {
	RequestID   string
	Kind        string
	Payload     string
	OperationID string
	// Errors maps a field (kind, payload, operation_id) to what is wrong.
	Errors map[string]string
	// Error is a refusal of the whole form (the node is retired, …).
	Error string
}

// NodeDetail is one node's page.
type NodeDetail struct {
	Now  time.Time
	Node NodeRow

	CreatedAt      time.Time
	EnrolledAt     *time.Time
	LeaseExpiresAt *time.Time
	RetiredAt      *time.Time

	BillingInterval string // "" when bought in no blocks
	EligibleClasses []string
	AvailableUntil  *time.Time
	CommittedUntil  *time.Time

	Facts           []Fact
	FactsObservedAt *time.Time
	FactsReceivedAt *time.Time

	Workloads  []WorkloadRow
	Pending    []CommandRow
	Recent     []CommandRow
	Timeline   []TimelineRow
	Operations []NodeOperationRow

	Command CommandForm

	Config     ConfigPanel
	ConfigForm ConfigForm
	Caps       Capabilities
	Diagnose   DiagnoseForms
}

// Retired reports whether the node is retired (no more actions).
func (d NodeDetail) Retired() bool { return d.Node.State == "retired" }

// Confirm is a confirmation step before a node action (retire,
// reinvite): its own page, with a required checkbox, no script needed.
type Confirm struct {
	Node      NodeRow
	RequestID string
	// Reason (retire) or RedeemableThrough (reinvite) echo the form.
	Reason            string
	RedeemableThrough string
	Errors            map[string]string
	Error             string
}

// InviteForm is the invite-a-node form.
type InviteForm struct {
	RequestID         string
	RentalID          string
	Generation        string
	NodeID            string
	Price             string
	RedeemableThrough string
	BillingInterval   string
	EligibleClasses   string
	AvailableUntil    string
	Errors            map[string]string
	Error             string
}

// Bootstrap is an invitation's answer, shown once.
type Bootstrap struct {
	NodeID    string
	RentalID  string
	ExpiresAt time.Time
	// JSON is the bootstrap document the agent reads.
	JSON string
	// Command is a ready-to-paste command line that starts the agent.
	Command string
	// Reinvite is true when a reinvite (not an invitation) answered it.
	Reinvite bool
}

// AlreadyShown is the answer to a submit replayed (a reload or a double
// click): the bootstrap was shown once and is not shown again.
type AlreadyShown struct {
	NodeID   string
	Reinvite bool
}

// FleetSummary is the overview's counts beyond nodes by state.
type FleetSummary struct {
	Available bool
	// Lapsing counts ready nodes whose lease ends within LapseWindow.
	Lapsing     int64
	LapseWindow time.Duration
	// Operations counts by state (OperationStates order) the open
	// operations created in the last hour and those that ended in it.
	Operations      []StateCount
	PendingCommands int64
	// Failed counts operations that ended failed in the last 24 h; Refused
	// the commands refused in them.
	Failed  int64
	Refused int64
	// Lagging counts nodes lagging their desired configuration;
	// NeverReported those with one that never reported. ConfigUnavailable:
	// they could not be read.
	Lagging           int64
	NeverReported     int64
	ConfigUnavailable bool
}

// ago is how long before now t was, coarsely ("12 s ago", "5 min ago").
func ago(now, t time.Time) string {
	d := now.Sub(t)
	if d < 0 {
		return "in " + span(-d)
	}
	return span(d) + " ago"
}

func span(d time.Duration) string {
	switch {
	case d < time.Minute:
		return strconv.Itoa(int(d/time.Second)) + " s"
	case d < time.Hour:
		return strconv.Itoa(int(d/time.Minute)) + " min"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d/time.Hour)) + " h"
	default:
		return strconv.Itoa(int(d/(24*time.Hour))) + " d"
	}
}

// bytesText is a byte count for people ("12.3 GiB").
func bytesText(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return strconv.FormatFloat(float64(n)/float64(div), 'f', 1, 64) + " " + string("KMGTP"[exp]) + "iB"
}

func itoa64(n int64) string { return strconv.FormatInt(n, 10) }

func joinClasses(cs []string) string { return strings.Join(cs, ", ") }

func fieldErr(errs map[string]string, field string) string { return errs[field] }
