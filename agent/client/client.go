// Package client is the Go client of the agent API (/agent/v1/...): a thin,
// stateless-but-for-the-session-token HTTP client shared by the node agent,
// the server's end-to-end tests and the load tool, so every Go caller speaks
// the wire contract of agent/api the same way.
//
// It keeps no retry policy of its own: callers own backoff, because the
// right reaction differs per door (a long-poll backs off, an enrollment must
// not be replayed blindly). Every refusal the server makes arrives as an
// *Error carrying the problem document's machine Code and the HTTP status;
// transport failures are returned as they are.
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/internal/retryafter"
)

// Machine codes the agent API answers (API.md, DECISIONS §18).
const (
	CodeEnrollmentInvalid    = "enrollment_invalid"
	CodeEnrollmentSpent      = "enrollment_spent"
	CodeEnrollmentSuperseded = "enrollment_superseded"
	CodeNodeRetired          = "node_retired"
	CodeSessionInvalid       = "session_invalid"
	CodeFenced               = "fenced"
	CodeDraining             = "draining"
	CodeUnavailable          = "unavailable"
	CodeOverloaded           = "overloaded"
	CodeRateLimited          = "rate_limited"
	CodeInvalidJSON          = "invalid_json"
	CodeValidationFailed     = "validation_failed"
	CodeInternal             = "internal"
	CodeUnknownOperation     = "unknown_operation"
	CodeNotThisNode          = "not_this_node"
)

// MaxEventBatch is the largest events batch the server accepts (DECISIONS §24).
const MaxEventBatch = 500

// Error is a refusal answered by the control plane.
type Error struct {
	Status int    // HTTP status
	Code   string // the problem document's code; "" when the body was not one
	Title  string
	Detail string
	// RetryAfter is the Retry-After the server asked for (503, 429), or 0.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "control plane answered %d", e.Status)
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

// Is makes errors.Is(err, &client.Error{Code: c}) match any refusal with code c.
func (e *Error) Is(target error) bool {
	var t *Error
	if !errors.As(target, &t) {
		return false
	}
	return t.Code != "" && t.Code == e.Code
}

// ConnectionLost reports whether err is a transport failure that says the
// control plane's process is gone rather than slow or unreachable: the
// connection was refused (nothing listens: it is restarting), reset, or
// closed before the answer (it died under a held request). A timeout, a
// DNS failure or an unreachable network are not: they may be a partition,
// where backing off longer is right.
func ConnectionLost(err error) bool {
	var answered *Error
	if err == nil || errors.As(err, &answered) {
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// CodeOf returns the machine code of err when it is (or wraps) an *Error,
// else "".
func CodeOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// Options configure a Client.
type Options struct {
	// BaseURL is the control plane URL from the bootstrap, e.g.
	// https://cp.example.com. Plain http is refused unless AllowInsecureHTTP
	// is set, and even then only towards a loopback host (127.0.0.0/8, ::1,
	// localhost): a session token must never cross a network in clear.
	BaseURL           string
	AllowInsecureHTTP bool
	// CACertificatePEM, when set, pins the control plane's CA: only
	// certificates chaining to it are trusted (the system roots are not).
	CACertificatePEM string
	// HTTPClient replaces the default client (the load tool shares one
	// transport among many simulated agents). It must not set a Timeout
	// shorter than the longest long-poll.
	HTTPClient *http.Client
	// UserAgent is sent on every request.
	UserAgent string
	// RequestTimeout bounds every request but the long-poll, which gets its
	// wait plus this (default 30s).
	RequestTimeout time.Duration
}

// Client talks to one control plane. It is safe for concurrent use.
type Client struct {
	base    *url.URL
	hc      *http.Client
	ua      string
	timeout time.Duration

	mu    sync.Mutex // guards the following
	token string
}

// New validates opts and returns a Client.
func New(opts Options) (*Client, error) {
	u, err := CheckURL(opts.BaseURL, opts.AllowInsecureHTTP)
	if err != nil {
		return nil, err
	}
	hc := opts.HTTPClient
	if hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 4
		if opts.CACertificatePEM != "" {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM([]byte(opts.CACertificatePEM)) {
				return nil, errors.New("client: ca_certificate_pem holds no usable certificate")
			}
			tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		}
		hc = &http.Client{
			Transport: tr,
			// The agent API never redirects; following one could carry the
			// session token somewhere else.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	ua := opts.UserAgent
	if ua == "" {
		ua = "nodeward-agent"
	}
	timeout := opts.RequestTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	return &Client{base: u, hc: hc, ua: ua, timeout: timeout}, nil
}

// CheckURL parses a control plane URL and applies the transport policy: https
// always; http only with allowInsecure and only to a loopback host.
func CheckURL(raw string, allowInsecure bool) (*url.URL, error) {
	u, err := url.Parse(strings.TrimRight(raw, "/"))
	if err != nil {
		return nil, fmt.Errorf("client: control plane url: %w", err)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("client: control plane url %q has no host", raw)
	}
	switch u.Scheme {
	case "https":
	case "http":
		if !allowInsecure {
			return nil, fmt.Errorf("client: refusing plain http control plane url %q (use https, or --allow-insecure-http for a loopback address)", raw)
		}
		if !IsLoopbackHost(u.Hostname()) {
			return nil, fmt.Errorf("client: refusing plain http to non-loopback host %q even with --allow-insecure-http: session credentials must not cross a network in clear", u.Hostname())
		}
	default:
		return nil, fmt.Errorf("client: unsupported scheme %q in control plane url", u.Scheme)
	}
	return u, nil
}

// IsLoopbackHost reports whether host is localhost or a loopback IP.
func IsLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// SetSessionToken sets the bearer credential used by every door but Enroll.
func (c *Client) SetSessionToken(tok string) {
	c.mu.Lock()
	c.token = tok
	c.mu.Unlock()
}

// SessionToken is the current bearer credential.
func (c *Client) SessionToken() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.token
}

// Enroll redeems the enrollment token of req (POST /agent/v1/enroll). It does
// not set the session token; callers store the answer first, then set it.
// Refusals: enrollment_invalid (401), enrollment_spent and
// enrollment_superseded (409), node_retired (410).
func (c *Client) Enroll(ctx context.Context, req api.EnrollRequest) (*api.EnrollResponse, error) {
	var out api.EnrollResponse
	if err := c.do(ctx, http.MethodPost, "/agent/v1/enroll", nil, req, &out, false, c.timeout); err != nil {
		return nil, err
	}
	return &out, nil
}

// Renew mints a fresh session credential from the current one
// (POST /agent/v1/session/renew). Refusals: session_invalid (401), fenced
// (409), node_retired (410).
func (c *Client) Renew(ctx context.Context) (*api.RenewResponse, error) {
	var out api.RenewResponse
	if err := c.do(ctx, http.MethodPost, "/agent/v1/session/renew", nil, struct{}{}, &out, true, c.timeout); err != nil {
		return nil, err
	}
	return &out, nil
}

// Commands long-polls for commands (GET /agent/v1/commands?wait=N), holding up
// to wait (whole seconds, 0–60). Refusals: session_invalid (401), fenced
// (409), node_retired (410), draining (503, RetryAfter set).
func (c *Client) Commands(ctx context.Context, wait time.Duration) (*api.CommandsResponse, error) {
	return c.Poll(ctx, wait, PollOptions{})
}

// PollOptions are a long-poll's optional parameters.
type PollOptions struct {
	// Resume (resume=true) says an earlier answer may have been lost (the
	// last poll failed, or this process has just started): the server hands
	// out again at once what it delivered to the session and has not seen
	// settled, instead of after its visibility timeout. The caller must
	// answer such a redelivery from its own record of what it applied.
	Resume bool
}

// Poll is Commands with options.
func (c *Client) Poll(ctx context.Context, wait time.Duration, opts PollOptions) (*api.CommandsResponse, error) {
	secs := int(wait / time.Second)
	secs = max(0, min(secs, 60))
	q := url.Values{"wait": {strconv.Itoa(secs)}}
	if opts.Resume {
		q.Set("resume", "true")
	}
	var out api.CommandsResponse
	if err := c.do(ctx, http.MethodGet, "/agent/v1/commands", q, nil, &out, true, time.Duration(secs)*time.Second+c.timeout); err != nil {
		return nil, err
	}
	return &out, nil
}

// Results reports command results (POST /agent/v1/results); the answer settles
// each item. Refusals: session_invalid, fenced.
func (c *Client) Results(ctx context.Context, results []api.Result) (*api.ResultsResponse, error) {
	if results == nil {
		results = []api.Result{}
	}
	var out api.ResultsResponse
	if err := c.do(ctx, http.MethodPost, "/agent/v1/results", nil, api.ResultsRequest{Results: results}, &out, true, c.timeout); err != nil {
		return nil, err
	}
	return &out, nil
}

// Events reports events (POST /agent/v1/events), at most MaxEventBatch.
func (c *Client) Events(ctx context.Context, events []api.Event) (*api.EventsResponse, error) {
	if len(events) > MaxEventBatch {
		return nil, fmt.Errorf("client: %d events exceed the batch limit of %d", len(events), MaxEventBatch)
	}
	if events == nil {
		events = []api.Event{}
	}
	var out api.EventsResponse
	if err := c.do(ctx, http.MethodPost, "/agent/v1/events", nil, api.EventsRequest{Events: events}, &out, true, c.timeout); err != nil {
		return nil, err
	}
	return &out, nil
}

func (c *Client) do(ctx context.Context, method, path string, q url.Values, body, out any, auth bool, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	u := *c.base
	u.Path = strings.TrimRight(u.Path, "/") + path
	if q != nil {
		u.RawQuery = q.Encode()
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json, application/problem+json")
	req.Header.Set("User-Agent", c.ua)
	if auth {
		tok := c.SessionToken()
		if tok == "" {
			return &Error{Status: http.StatusUnauthorized, Code: CodeSessionInvalid, Detail: "no session credential"}
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, api.MaxAnswerBytes))
	if err != nil {
		return fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return parseError(resp, data)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

func parseError(resp *http.Response, data []byte) error {
	e := &Error{Status: resp.StatusCode, RetryAfter: retryafter.Parse(resp.Header.Get("Retry-After"))}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	var p api.Problem
	if (mt == "application/problem+json" || mt == "application/json") && json.Unmarshal(data, &p) == nil {
		e.Code, e.Title, e.Detail = p.Code, p.Title, p.Detail
	}
	if e.Title == "" {
		e.Title = http.StatusText(resp.StatusCode)
	}
	return e
}
