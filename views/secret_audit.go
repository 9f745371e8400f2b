package views

import (
	"net/url"
	"time"
)

// SecretAuditRow is one seal, use, reveal or expiry (never a value).
type SecretAuditRow struct {
	At            time.Time
	Action        string
	Outcome       string
	PrincipalKind string
	PrincipalID   string
	HandleDigest  string
	RequestID     string
	OperationID   string
	TargetKind    string
	TargetID      string
	Field         string
}

// SecretAuditFilterField is one text filter of the secret audit.
type SecretAuditFilterField struct {
	Name  string
	Label string
	Hint  string
}

// SecretAuditFilterFields are the secret audit's text filters, in form
// order (principal kind, action and outcome are selects).
var SecretAuditFilterFields = []SecretAuditFilterField{
	{"principal_id", "Principal id", "user or package host id"},
	{"operation_id", "Operation id", ""},
	{"target_kind", "Target kind", "node, fleet, package_host"},
	{"target_id", "Target id", ""},
}

// SecretAuditView is one page of the secret audit.
type SecretAuditView struct {
	// Query is the filter form's values (empty values left out, no cursor).
	Query      url.Values
	Error      string
	ErrorField string
	// Actions, Outcomes and PrincipalKinds are the selects' options.
	Actions        []string
	Outcomes       []string
	PrincipalKinds []string
	Entries        []SecretAuditRow
	Paged          bool
	OlderBefore    string
}

// Value is the form value of a filter.
func (v SecretAuditView) Value(name string) string { return v.Query.Get(name) }

// Filtered reports whether any filter is set.
func (v SecretAuditView) Filtered() bool {
	for k := range v.Query {
		if k != "limit" {
			return true
		}
	}
	return false
}

// OlderHref links the next older page under the same filters.
func (v SecretAuditView) OlderHref() string {
	q := url.Values{}
	for k, vs := range v.Query {
		q[k] = vs
	}
	q.Set("before", v.OlderBefore)
	return "/console/secret-audit?" + q.Encode()
}

// NewestHref links the first page under the same filters.
func (v SecretAuditView) NewestHref() string {
	if len(v.Query) == 0 {
		return "/console/secret-audit"
	}
	return "/console/secret-audit?" + v.Query.Encode()
}

// SecretAuditHref is the secret audit under one filter.
func SecretAuditHref(name, value string) string {
	return "/console/secret-audit?" + url.Values{name: {value}}.Encode()
}
