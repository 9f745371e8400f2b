// Package views renders the console: templ components over plain
// view-models. Page components are exported; fragments are private. Views
// never see models or services: handlers build the view-models.
package views

import (
	"strconv"
	"time"
)

// Navigation keys: Shell.Active names the current section.
const (
	NavOverview    = "overview"
	NavNodes       = "nodes"
	NavOperations  = "operations"
	NavSecretAudit = "secret-audit"
	NavHosts       = "package-hosts"
	NavTokens      = "tokens"
	NavAdmins      = "admins"
	NavAudit       = "audit"
	// NavAccount is the signed-in administrator's own page (linked from
	// their name, not the navigation).
	NavAccount = "account"
)

// NavItem is one entry of the main navigation.
type NavItem struct {
	Key   string
	Label string
	Href  string
}

// Nav is the console's main navigation, in display order.
var Nav = []NavItem{
	{NavOverview, "Overview", "/console/"},
	{NavNodes, "Nodes", "/console/nodes"},
	{NavOperations, "Operations", "/console/operations"},
	{NavSecretAudit, "Secret audit", "/console/secret-audit"},
	{NavHosts, "Package hosts", "/console/package-hosts"},
	{NavTokens, "API tokens", "/console/tokens"},
	{NavAdmins, "Administrators", "/console/admins"},
	{NavAudit, "Admin audit", "/console/audit"},
}

// Shell is what every page's frame shows: who is signed in, the CSRF token
// the frame's forms carry (the logout button), the current section and a
// flash message. A zero Shell is the anonymous frame (no navigation).
type Shell struct {
	Username  string
	CSRFToken string
	Active    string
	Flash     Flash
}

// SignedIn reports whether the frame shows navigation and logout.
func (s Shell) SignedIn() bool { return s.Username != "" }

// Flash kinds.
const (
	FlashOK    = "ok"
	FlashError = "error"
	FlashInfo  = "info"
)

// Flash is a one-line message at the top of the page.
type Flash struct {
	Kind    string
	Message string
}

// LoginView is the sign-in form.
type LoginView struct {
	Username string
	// Next is the local path to return to after signing in.
	Next string
	// Error is shown above the form; it never says which field was wrong.
	Error string
}

// SetupView is the first-run form (or, when Closed, the notice that setup
// is over).
type SetupView struct {
	Closed   bool
	Username string
	Error    string
	// FieldErrors maps a form field (setup_token, username, password) to
	// what is wrong with it.
	FieldErrors map[string]string
	// MinPasswordLen is shown as a hint and set on the password input.
	MinPasswordLen int
}

// Node states in lifecycle order; Overview.Counts follows this order.
var NodeStates = []string{"enrolling", "ready", "lost", "retired"}

// StateCount is how many nodes are in one state.
type StateCount struct {
	State string
	Count int
}

// Activity is one line of recent fleet activity.
type Activity struct {
	At      time.Time
	Actor   string
	Summary string
	// Href links to the subject (a node or an operation); may be empty.
	Href string
}

// Overview is the fleet overview.
type Overview struct {
	// Counts has one entry per node state (NodeStates order).
	Counts []StateCount
	// Recent is the latest fleet activity, newest first.
	Recent []Activity
	// BaseURL is this control plane's URL, for the invitation example.
	BaseURL string
	// Summary is what needs attention beyond nodes by state.
	Summary FleetSummary
}

// Total is the number of nodes in every state.
func (o Overview) Total() int {
	n := 0
	for _, c := range o.Counts {
		n += c.Count
	}
	return n
}

// TokenRow is one API token in the list (never the token itself).
type TokenRow struct {
	ID   string
	Name string
	// Owner is the username of the administrator the token acts as.
	Owner      string
	CreatedAt  time.Time
	LastUsedAt *time.Time
	RevokedAt  *time.Time
}

// TokensView is the API tokens page.
type TokensView struct {
	Tokens []TokenRow
	// RequestID is the create form's request id, so the same form sent
	// twice mints one token.
	RequestID string
	// Name and NameError echo a refused create form.
	Name      string
	NameError string
}

// TokenCreatedView shows a new token, once.
type TokenCreatedView struct {
	ID    string
	Name  string
	Token string
}

// AuditRow is one entry of the administrators' audit log.
type AuditRow struct {
	ID      int64
	At      time.Time
	Actor   string
	Action  string
	Target  string
	Outcome string
	Remote  string
	Detail  string
	// Count is how many events a coalesced entry stands for (repeated
	// refused sign-ins of one client); 1 otherwise.
	Count int64
}

// Times is the count of a coalesced entry ("×12"), or "" for one event.
func (a AuditRow) Times() string {
	if a.Count <= 1 {
		return ""
	}
	return "×" + strconv.FormatInt(a.Count, 10)
}

// AuditView is one page of the audit log, newest first.
type AuditView struct {
	Entries []AuditRow
	// Paged is true when this is not the first page.
	Paged bool
	// OlderBefore is the cursor of the next (older) page; 0 when there is none.
	OlderBefore int64
}

// OlderHref is the link to the next older page.
func (a AuditView) OlderHref() string {
	return "/console/audit?before=" + strconv.FormatInt(a.OlderBefore, 10)
}

// ErrorView is an error page.
type ErrorView struct {
	Status    int
	Title     string
	Message   string
	RequestID string
	// Back is a link offered to continue (default: the overview or login).
	Back      string
	BackLabel string
}

// timestamp is how the console shows a time: UTC, to the second.
func timestamp(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") }

// machineTime is a <time datetime> value.
func machineTime(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func statusText(n int) string { return strconv.Itoa(n) }

// inviteExample is the shell command that invites a node.
func inviteExample(baseURL string) string {
	return "curl -sS -X POST " + baseURL + "/api/v1/nodes/invitations \\\n" +
		"  -H \"Authorization: Bearer $NODEWARD_TOKEN\" \\\n" +
		"  -H \"Content-Type: application/json\" \\\n" +
		"  -d '{\"rental_id\": \"rental-1\", \"generation\": 1}'"
}
