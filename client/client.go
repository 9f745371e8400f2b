// Package client is the Go client of the operations ledger's HTTP API
// (/api/v1/operations and /api/v1/node-operations), for scripts and package
// hosts. It is thin and hand-written over net/http; its types mirror the
// JSON of openapi.yaml (the Operation, OperationEvent and per-kind schemas)
// and it imports nothing of the server, so it is what an outside program
// would write — and its tests run it against the real server.
//
// Every refusal arrives as an *Error carrying the problem document's
// status, machine code, detail, fields at fault and Retry-After. The
// client keeps no retry policy for submits: a submit is safe to repeat
// with the same RequestID (the ledger answers the operation it recorded),
// so callers retry as they see fit. Watch resumes a dropped stream itself.
package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nodeward/nodeward/internal/retryafter"
)

// Error codes a ledger caller matches on (DECISIONS.md §18, API.md).
const (
	CodeInvalidJSON      = "invalid_json"
	CodeInvalidParameter = "invalid_parameter"
	CodeValidationFailed = "validation_failed"
	CodeUnauthenticated  = "unauthenticated"
	CodePermissionDenied = "permission_denied"
	CodeNotFound         = "not_found"
	CodeRequestConflict  = "request_conflict"
	CodeQuotaExceeded    = "quota_exceeded"
	CodeKindNotServed    = "kind_not_served"
	CodeDraining         = "draining"
	// CodeCapabilityMissing: the target node's agent does not report the
	// capability the kind needs; Error.Capability names it.
	CodeCapabilityMissing = "capability_missing"
	// CodeDestinationNotAllowed: a diagnose.endpoint to a host the
	// operator did not allow.
	CodeDestinationNotAllowed = "destination_not_allowed"
)

// FieldError names one input at fault.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Error is a refusal answered by the control plane (a problem document).
type Error struct {
	// Status is the HTTP status.
	Status int
	// Code is the problem's machine code; "" when the body was not one.
	Code   string
	Title  string
	Detail string
	// Fields are the inputs at fault (validation_failed, invalid_parameter).
	Fields []FieldError
	// RetryAfter is the wait the server asked for (429, 503), or 0.
	RetryAfter time.Duration
	// HTTPRequestID is the problem's request_id: the HTTP request's id in
	// the server's log, not a submission's idempotency key.
	HTTPRequestID string
	// Capability is the agent capability a capability_missing node lacks.
	Capability string
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "nodeward answered %d", e.Status)
	if e.Code != "" {
		fmt.Fprintf(&b, " %s", e.Code)
	}
	switch {
	case e.Detail != "":
		fmt.Fprintf(&b, ": %s", e.Detail)
	case e.Title != "":
		fmt.Fprintf(&b, ": %s", e.Title)
	}
	return b.String()
}

// CodeOf answers the machine code of err when it is an *Error, else "".
func CodeOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// State is where an operation stands.
type State string

// Operation states: pending → running → succeeded | failed | cancelled.
const (
	StatePending   State = "pending"
	StateRunning   State = "running"
	StateSucceeded State = "succeeded"
	StateFailed    State = "failed"
	StateCancelled State = "cancelled"
)

// Served kinds.
const (
	KindNodeInvite   = "node.invite"
	KindNodeReinvite = "node.reinvite"
	KindNodeRetire   = "node.retire"
	// Diagnostics (family diagnose): DiagnoseOperation on a node, a
	// FleetDiagnoseOperation fanned out, an EndpointOperation probed from
	// the control plane.
	KindNodeDiagnose     = "node.diagnose"
	KindFleetDiagnose    = "fleet.diagnose"
	KindDiagnoseEndpoint = "diagnose.endpoint"
)

// DiagnoseOperation is node.diagnose's operation: one action (disk,
// workloads, connect, resolve, clock, agent) with its parameters only.
type DiagnoseOperation struct {
	Action         string   `json:"action"`
	Paths          []string `json:"paths,omitempty"`
	Host           string   `json:"host,omitempty"`
	Port           int      `json:"port,omitempty"`
	TimeoutSeconds float64  `json:"timeout_seconds,omitempty"`
	Names          []string `json:"names,omitempty"`
}

// FleetDiagnoseOperation fans one DiagnoseOperation out over node targets
// (or the fleet target with a selector).
type FleetDiagnoseOperation struct {
	Diagnose       DiagnoseOperation `json:"diagnose"`
	Selector       map[string]any    `json:"selector,omitempty"`
	MaxConcurrency int               `json:"max_concurrency,omitempty"`
}

// EndpointOperation is diagnose.endpoint's operation; its target is
// EndpointTarget(URL). Credential is a handle sealed for that target and
// field /credential, never the credential itself.
type EndpointOperation struct {
	URL        string `json:"url"`
	Credential string `json:"credential,omitempty"`
}

// EndpointTarget is the target {kind: endpoint, id: url}.
func EndpointTarget(url string) Target { return Target{Kind: "endpoint", ID: url} }

// Target names what an operation acts on.
type Target struct {
	Kind string `json:"kind"`
	ID   string `json:"id,omitempty"`
}

// NodeTarget is the target {kind: node, id}.
func NodeTarget(id string) Target { return Target{Kind: "node", ID: id} }

// InviteOperation is node.invite's operation (NodeInviteOperation).
type InviteOperation struct {
	NodeID                string     `json:"node_id,omitempty"`
	RentalID              string     `json:"rental_id"`
	Generation            int64      `json:"generation"`
	ShadowPriceUSDPerHour *float64   `json:"shadow_price_usd_per_hour,omitempty"`
	RedeemableThrough     *time.Time `json:"redeemable_through,omitempty"`
	Purchase              *Purchase  `json:"purchase,omitempty"`
}

// Purchase is an invitation's purchase terms.
type Purchase struct {
	BillingIntervalSeconds *int64     `json:"billing_interval_seconds,omitempty"`
	EligibleClasses        []string   `json:"eligible_classes,omitempty"`
	AvailableUntil         *time.Time `json:"available_until,omitempty"`
}

// ReinviteOperation is node.reinvite's operation (NodeReinviteOperation).
type ReinviteOperation struct {
	RedeemableThrough *time.Time `json:"redeemable_through,omitempty"`
}

// RetireOperation is node.retire's operation (NodeRetireOperation).
type RetireOperation struct {
	Reason string `json:"reason,omitempty"`
}

// BootstrapResult is the result of node.invite and node.reinvite: the
// bootstrap without its enrollment token (NodeBootstrapResult).
type BootstrapResult struct {
	NodeID          string    `json:"node_id"`
	RentalID        string    `json:"rental_id"`
	Generation      int64     `json:"generation"`
	ExpiresAt       time.Time `json:"expires_at"`
	ControlPlaneURL string    `json:"control_plane_url"`
	AgentVersion    string    `json:"agent_version"`
}

// RetireResult is the result of node.retire (NodeRetireResult).
type RetireResult struct {
	NodeID         string     `json:"node_id"`
	State          string     `json:"state"`
	RetiredAt      *time.Time `json:"retired_at,omitempty"`
	AlreadyRetired bool       `json:"already_retired"`
}

// SubmitRequest is a submission.
type SubmitRequest struct {
	// RequestID is the idempotency key: submitting it again with the same
	// kind, targets and operation answers the operation recorded first.
	RequestID string
	Kind      string
	Targets   []Target
	// Operation is the kind's body (InviteOperation, ReinviteOperation,
	// RetireOperation, or any value that marshals to a JSON object); nil
	// sends none.
	Operation any
	Reason    string
	// Wait holds the answer until the operation ends or Wait passes (at
	// most a minute; whole milliseconds).
	Wait time.Duration
}

type submitBody struct {
	RequestID     string   `json:"request_id"`
	Kind          string   `json:"kind"`
	Targets       []Target `json:"targets,omitempty"`
	Operation     any      `json:"operation,omitempty"`
	Reason        string   `json:"reason,omitempty"`
	WaitTimeoutMS *int64   `json:"wait_timeout_ms,omitempty"`
}

// Principal is who submitted an operation.
type Principal struct {
	Kind string `json:"kind"`
	ID   string `json:"id"`
	Name string `json:"name"`
}

// OperationError is how an operation failed.
type OperationError struct {
	Code      string `json:"code"`
	Message   string `json:"message"`
	Retryable bool   `json:"retryable"`
}

// Counts are a fan-out parent's children by outcome.
type Counts struct {
	Total     int `json:"total"`
	Succeeded int `json:"succeeded"`
	Failed    int `json:"failed"`
	Cancelled int `json:"cancelled"`
	Pending   int `json:"pending"`
	// CapabilityMissing counts the failed children whose node lacked the
	// capability their kind needs.
	CapabilityMissing int `json:"capability_missing,omitempty"`
}

// Operation is one operation of the ledger (the Operation schema).
type Operation struct {
	Cursor                string          `json:"cursor"`
	OperationID           string          `json:"operation_id"`
	RequestID             string          `json:"request_id"`
	Digest                string          `json:"digest"`
	Principal             Principal       `json:"principal"`
	PackageHostID         *string         `json:"package_host_id"`
	PackageHostGeneration *int64          `json:"package_host_generation"`
	Family                string          `json:"family"`
	Kind                  string          `json:"kind"`
	State                 State           `json:"state"`
	Terminal              bool            `json:"terminal"`
	Channel               string          `json:"channel"`
	Attempt               int             `json:"attempt"`
	Targets               []Target        `json:"targets"`
	ParentID              *string         `json:"parent_id"`
	Counts                *Counts         `json:"counts"`
	Reason                string          `json:"reason"`
	Operation             json.RawMessage `json:"operation"`
	Result                json.RawMessage `json:"result"`
	Error                 *OperationError `json:"error"`
	Evidence              json.RawMessage `json:"evidence"`
	CancelRequestedAt     *time.Time      `json:"cancel_requested_at"`
	CancelReason          *string         `json:"cancel_reason"`
	CreatedAt             time.Time       `json:"created_at"`
	AcceptedAt            *time.Time      `json:"accepted_at"`
	FinishedAt            *time.Time      `json:"finished_at"`
	Deadline              time.Time       `json:"deadline"`
	UpdatedAt             time.Time       `json:"updated_at"`
}

// ErrNoResult is DecodeResult's answer for an operation without a result
// (not yet succeeded).
var ErrNoResult = errors.New("client: the operation has no result")

// DecodeResult decodes the operation's result into v (a *BootstrapResult,
// *RetireResult, ...). Errors: ErrNoResult.
func (o Operation) DecodeResult(v any) error {
	if len(o.Result) == 0 || string(o.Result) == "null" {
		return ErrNoResult
	}
	return json.Unmarshal(o.Result, v)
}

// Event is one entry of an operation's history, as a watch streams it.
type Event struct {
	// Cursor is the event's SSE id; Watch resumes after it.
	Cursor      string          `json:"cursor"`
	OperationID string          `json:"operation_id"`
	Type        string          `json:"type"`
	At          time.Time       `json:"at"`
	Data        json.RawMessage `json:"data"`
}

// Filter selects operations of the listing; zero fields do not filter.
type Filter struct {
	PackageHostID string
	Family        string
	Kind          string
	State         State
	RequestID     string
	OperationID   string
	Parent        string
	TargetKind    string
	TargetID      string
	// Before is the next cursor of the previous page.
	Before string
	// Limit is the page size (server default 100, at most 500).
	Limit int
}

func (f Filter) query() url.Values {
	q := url.Values{}
	for name, v := range map[string]string{
		"package_host_id": f.PackageHostID, "family": f.Family, "kind": f.Kind, "state": string(f.State),
		"request_id": f.RequestID, "operation_id": f.OperationID, "parent": f.Parent,
		"target_kind": f.TargetKind, "target_id": f.TargetID, "before": f.Before,
	} {
		if v != "" {
			q.Set(name, v)
		}
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	return q
}

// Options configure a Client.
type Options struct {
	// HTTPClient sends the requests; nil is a client without an overall
	// timeout (waits and watches are bounded by their contexts).
	HTTPClient *http.Client
	// UserAgent is sent with every request when not empty.
	UserAgent string
	// ReconnectDelay is how long Watch waits before resuming a dropped
	// stream when the server names no Retry-After; default 1 s.
	ReconnectDelay time.Duration
}

// Client calls one control plane with one API token (an administrator's
// or a package host's). It is safe for concurrent use.
type Client struct {
	base  *url.URL
	token string
	hc    *http.Client
	ua    string
	delay time.Duration
}

// New returns a client of the control plane at baseURL (e.g.
// https://nodeward.example.com) using token as its Bearer credential.
func New(baseURL, token string, opts Options) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(baseURL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: base URL %q must be http(s)://host[:port]", baseURL)
	}
	if token == "" {
		return nil, errors.New("client: an API token is required")
	}
	hc := opts.HTTPClient
	if hc == nil {
		hc = &http.Client{}
	}
	delay := opts.ReconnectDelay
	if delay <= 0 {
		delay = time.Second
	}
	return &Client{base: u, token: token, hc: hc, ua: opts.UserAgent, delay: delay}, nil
}

// Submit records an operation, or answers the one recorded for the same
// request (created false). With Wait set it answers once the operation
// ended or the wait passed, the operation as it then stands. Errors (as
// *Error): validation_failed, invalid_json, request_conflict,
// kind_not_served, permission_denied, quota_exceeded (RetryAfter set),
// and the kind's refusals (identity_exists, not_found, node_retired, ...).
func (c *Client) Submit(ctx context.Context, r SubmitRequest) (Operation, bool, error) {
	body := submitBody{RequestID: r.RequestID, Kind: r.Kind, Targets: r.Targets, Operation: r.Operation, Reason: r.Reason}
	if r.Wait > 0 {
		ms := r.Wait.Milliseconds()
		body.WaitTimeoutMS = &ms
	}
	var op Operation
	status, err := c.do(ctx, http.MethodPost, "/api/v1/operations", nil, body, &op)
	return op, status == http.StatusCreated, err
}

// Capabilities is what a control plane serves (GET /api/v1/capabilities).
type Capabilities struct {
	Kinds []KindInfo `json:"kinds"`
	// Limits maps each limit's name (package_host_quota, node_quota,
	// max_wait_ms, request_body_bytes, …) to its value.
	Limits map[string]int64 `json:"limits"`
	// AgentVersion is the pinned agent build; "" when none is configured.
	AgentVersion string `json:"agent_version"`
	// AgentCapabilities are those an agent of this release may report.
	AgentCapabilities []string `json:"agent_capabilities"`
}

// KindInfo is one served kind of operation.
type KindInfo struct {
	Kind   string `json:"kind"`
	Family string `json:"family"`
	// Capability is what a target node's agent must report; "" for none.
	Capability     string `json:"capability"`
	LevelTriggered bool   `json:"level_triggered"`
	AdminOnly      bool   `json:"admin_only"`
}

// Kind answers the served kind of that name.
func (c Capabilities) Kind(name string) (KindInfo, bool) {
	for _, k := range c.Kinds {
		if k.Kind == name {
			return k, true
		}
	}
	return KindInfo{}, false
}

// Capabilities answers the kinds served, the limits and the pinned agent
// version, for administrators and package hosts alike.
func (c *Client) Capabilities(ctx context.Context) (Capabilities, error) {
	var out Capabilities
	_, err := c.do(ctx, http.MethodGet, "/api/v1/capabilities", nil, nil, &out)
	return out, err
}

// Get answers an operation. Errors: not_found.
func (c *Client) Get(ctx context.Context, id string) (Operation, error) {
	var op Operation
	_, err := c.do(ctx, http.MethodGet, "/api/v1/operations/"+url.PathEscape(id), nil, nil, &op)
	return op, err
}

// Cancel asks an operation to stop, with a reason (may be empty), and
// answers it; an operation that already ended is answered unchanged.
// Errors: not_found.
func (c *Client) Cancel(ctx context.Context, id, reason string) (Operation, error) {
	var op Operation
	_, err := c.do(ctx, http.MethodPost, "/api/v1/operations/"+url.PathEscape(id)+"/cancel", nil,
		struct {
			Reason string `json:"reason,omitempty"`
		}{reason}, &op)
	return op, err
}

// List answers one page of operations, newest first, and the cursor of the
// next page ("" on the last): pass it as Filter.Before. Errors:
// invalid_parameter naming the filter.
func (c *Client) List(ctx context.Context, f Filter) ([]Operation, string, error) {
	var page struct {
		Operations []Operation `json:"operations"`
		NextBefore *string     `json:"next_before"`
	}
	if _, err := c.do(ctx, http.MethodGet, "/api/v1/node-operations", f.query(), nil, &page); err != nil {
		return nil, "", err
	}
	next := ""
	if page.NextBefore != nil {
		next = *page.NextBefore
	}
	return page.Operations, next, nil
}

// Watch calls fn with the operation's events, oldest first, after the
// event lastEventID ("" from the first), until the operation has ended and
// its last event was handed over (nil), fn fails (its error), or ctx ends.
// A stream the server ends early (draining) or that breaks mid-way is
// resumed after the last event handed over, so fn sees every event once.
// Errors: not_found, and the error of a reconnection that fails.
func (c *Client) Watch(ctx context.Context, id, lastEventID string, fn func(Event) error) error {
	path := "/api/v1/operations/" + url.PathEscape(id) + "/watch"
	stalled := 0
	for {
		before := lastEventID
		resumeAfter, err := c.watchOnce(ctx, path, &lastEventID, fn)
		if err == nil || resumeAfter < 0 {
			return err
		}
		// Resume for as long as streams make progress; a server that keeps
		// ending them without a new event is reported.
		if lastEventID != before {
			stalled = 0
		} else if stalled++; stalled >= maxStalledStreams {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		t := time.NewTimer(resumeAfter)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// errResume marks a stream that ended before the operation did.
var errResume = errors.New("client: the watch stream kept ending before the operation did")

// maxStalledStreams bounds Watch's resumptions in a row that brought no
// new event.
const maxStalledStreams = 5

// watchOnce reads one stream. It answers how long to wait before resuming
// (negative: do not resume) with the error that ended it.
func (c *Client) watchOnce(ctx context.Context, path string, last *string, fn func(Event) error) (time.Duration, error) {
	req, err := c.request(ctx, http.MethodGet, path, nil, nil)
	if err != nil {
		return -1, err
	}
	req.Header.Set("Accept", "text/event-stream")
	if *last != "" {
		req.Header.Set("Last-Event-ID", *last)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return -1, ctx.Err()
		}
		return -1, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		e := readError(resp)
		if e.Status == http.StatusServiceUnavailable {
			return c.retryDelay(e.RetryAfter), e
		}
		return -1, e
	}
	var eventType, data string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if line != "" {
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "event":
				eventType = value
			case "data":
				data += value
			}
			continue
		}
		// A blank line dispatches the message.
		switch {
		case eventType == "draining":
			return c.delay, errResume
		case data != "":
			var ev Event
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				return -1, fmt.Errorf("client: watch event: %w", err)
			}
			if err := fn(ev); err != nil {
				return -1, err
			}
			*last = ev.Cursor
		}
		eventType, data = "", ""
	}
	if err := sc.Err(); err != nil {
		if ctx.Err() != nil {
			return -1, ctx.Err()
		}
		// The connection broke mid-stream: resume after the last event.
		return c.delay, errResume
	}
	return -1, nil
}

func (c *Client) retryDelay(d time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return c.delay
}

func (c *Client) request(ctx context.Context, method, path string, q url.Values, body any) (*http.Request, error) {
	target := c.base.String() + path // path segments are escaped by the callers
	if len(q) > 0 {
		target += "?" + q.Encode()
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("client: encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.ua != "" {
		req.Header.Set("User-Agent", c.ua)
	}
	return req, nil
}

// do sends one JSON exchange and decodes a 2xx answer into out; it
// answers the status.
func (c *Client) do(ctx context.Context, method, path string, q url.Values, body, out any) (int, error) {
	req, err := c.request(ctx, method, path, q, body)
	if err != nil {
		return 0, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, readError(resp)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return resp.StatusCode, fmt.Errorf("client: decode answer to %s %s: %w", method, path, err)
	}
	return resp.StatusCode, nil
}

// readError reads a refusal; a body that is not a problem document still
// gives the status.
func readError(resp *http.Response) *Error {
	e := &Error{Status: resp.StatusCode, RetryAfter: retryafter.Parse(resp.Header.Get("Retry-After"))}
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var p struct {
		Title     string       `json:"title"`
		Detail    string       `json:"detail"`
		Code      string       `json:"code"`
		RequestID string       `json:"request_id"`
		Errors    []FieldError `json:"errors"`
		// Capability: capability_missing's member.
		Capability string `json:"capability"`
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if (mt == "application/problem+json" || mt == "application/json") && json.Unmarshal(data, &p) == nil {
		e.Code, e.Title, e.Detail, e.Fields, e.HTTPRequestID = p.Code, p.Title, p.Detail, p.Errors, p.RequestID
		e.Capability = p.Capability
	}
	if e.Title == "" {
		e.Title = http.StatusText(resp.StatusCode)
	}
	return e
}
