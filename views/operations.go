package views

import (
	"net/url"
	"strconv"
	"time"
)

// OperationStates are the ledger's states, for the listing's state filter.
var OperationStates = []string{"pending", "running", "succeeded", "failed", "cancelled"}

// OperationFilterField is one field of the operations filter form.
type OperationFilterField struct {
	// Name is the query parameter (the API's).
	Name  string
	Label string
	Hint  string
}

// OperationFilterFields are the listing's text filters, in form order (the
// state filter is a select of its own).
var OperationFilterFields = []OperationFilterField{
	{"kind", "Kind", "e.g. node.invite"},
	{"family", "Family", "e.g. nodes, credentials"},
	{"package_host_id", "Package host id", ""},
	{"request_id", "Request id", "the submitter's idempotency key"},
	{"operation_id", "Operation id", ""},
	{"parent", "Parent operation id", "children of a fan-out"},
	{"target_kind", "Target kind", "e.g. node, fleet, package_host"},
	{"target_id", "Target id", ""},
}

// OperationRow is one operation in the listing.
type OperationRow struct {
	ID        string
	Kind      string
	State     string
	RequestID string
	Principal string
	Target    string
	ParentID  string
	CreatedAt time.Time
	ErrorCode string
}

// OperationsView is one page of the operations listing.
type OperationsView struct {
	// Query is the filter form's values (the request's query, minus the
	// cursor); empty values are left out.
	Query url.Values
	// Error is why the filters were refused; the listing is then empty.
	Error      string
	ErrorField string
	Operations []OperationRow
	// Paged: this is not the first page.
	Paged bool
	// OlderBefore is the next page's cursor, "" on the last page.
	OlderBefore string
}

// Value is the form value of a filter.
func (v OperationsView) Value(name string) string { return v.Query.Get(name) }

// Filtered reports whether any filter is set.
func (v OperationsView) Filtered() bool {
	for k := range v.Query {
		if k != "limit" {
			return true
		}
	}
	return false
}

// OlderHref links the next older page under the same filters.
func (v OperationsView) OlderHref() string {
	q := url.Values{}
	for k, vs := range v.Query {
		q[k] = vs
	}
	q.Set("before", v.OlderBefore)
	return "/console/operations?" + q.Encode()
}

// NewestHref links the first page under the same filters.
func (v OperationsView) NewestHref() string {
	if len(v.Query) == 0 {
		return "/console/operations"
	}
	return "/console/operations?" + v.Query.Encode()
}

// OperationHref is an operation's detail page.
func OperationHref(id string) string { return "/console/operations/" + url.PathEscape(id) }

// opNodeHref is a node's console page.
func opNodeHref(id string) string { return "/console/nodes/" + url.PathEscape(id) }

// OperationsHref is the listing under one filter.
func OperationsHref(name, value string) string {
	return "/console/operations?" + url.Values{name: {value}}.Encode()
}

// TargetRow is one target of an operation.
type TargetRow struct {
	Kind string
	ID   string
}

// EventRow is one event of an operation's timeline.
type EventRow struct {
	Cursor int64
	Type   string
	At     time.Time
	Data   string
}

// CursorText is the event's cursor as the watch stream names it.
func (e EventRow) CursorText() string { return strconv.FormatInt(e.Cursor, 10) }

// OperationDetailView is one operation.
type OperationDetailView struct {
	ID             string
	RequestID      string
	Digest         string
	Kind           string
	Family         string
	State          string
	Terminal       bool
	Channel        string
	Attempt        int
	PrincipalKind  string
	PrincipalID    string
	PrincipalName  string
	HostGeneration int64
	Targets        []TargetRow
	ParentID       string
	Reason         string
	// Operation, Result and Evidence are indented JSON ("" when none).
	Operation string
	Result    string
	Evidence  string
	// Readable is the result made readable (diagnose evidence, a
	// configure's outcome); nil when the kind has none.
	Readable *Evidence
	// Error is set on a failed (or otherwise ended) operation.
	ErrorCode      string
	ErrorMessage   string
	ErrorRetryable bool
	// Counts are a fan-out parent's children.
	Counts            *ChildCounts
	CancelRequestedAt *time.Time
	CancelReason      string
	CreatedAt         time.Time
	AcceptedAt        *time.Time
	FinishedAt        *time.Time
	Deadline          time.Time
	Events            []EventRow
	// MoreEvents: the timeline shows the first events only.
	MoreEvents bool
	// Reason and ReasonError echo a refused cancel form.
	CancelFormReason string
	CancelFormError  string
}

// ChildCounts are a fan-out parent's children by outcome.
type ChildCounts struct {
	Total, Succeeded, Failed, Cancelled, Pending int
}

// WatchURL is the operation's event stream (the API's).
func (v OperationDetailView) WatchURL() string {
	return "/api/v1/operations/" + url.PathEscape(v.ID) + "/watch"
}

func itoa(n int) string { return strconv.Itoa(n) }

func i64toa(n int64) string { return strconv.FormatInt(n, 10) }
