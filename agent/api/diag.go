package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"path"
	"sort"
	"strings"
	"time"
)

// Diagnostics (DECISIONS.md §46). A diagnose command's payload is
// `{action, …parameters}`: one action of a fixed whitelist, each with its
// own parameters and nothing else. The control plane validates it at
// submit and the agent again before running it (ValidateDiagnose, shared by
// both), so an agent refuses whatever a compromised or buggy server sends.
// No action runs a shell or any program.

// MaxEvidenceBytes bounds a diagnose result's evidence.
const MaxEvidenceBytes = 64 << 10

// Diagnose actions.
const (
	DiagDisk      = "disk"
	DiagWorkloads = "workloads"
	DiagConnect   = "connect"
	DiagResolve   = "resolve"
	DiagClock     = "clock"
	DiagAgent     = "agent"
)

// Limits of the diagnose parameters.
const (
	MaxDiagPaths          = 8
	MaxDiagNames          = 10
	MaxDiagConnectTimeout = 10 * time.Second
	// DefaultDiagConnectTimeout is connect's timeout when none is given.
	DefaultDiagConnectTimeout = 5 * time.Second
	maxDiagPathBytes          = 4096
)

// diagParams names the parameters each action takes.
var diagParams = map[string][]string{
	DiagDisk:      {"paths"},
	DiagWorkloads: {},
	DiagConnect:   {"host", "port", "timeout_seconds"},
	DiagResolve:   {"names"},
	DiagClock:     {},
	DiagAgent:     {},
}

// DiagActions are the whitelisted actions, sorted.
func DiagActions() []string {
	out := make([]string, 0, len(diagParams))
	for a := range diagParams {
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}

// Diagnose is a diagnose command's payload.
type Diagnose struct {
	Action string `json:"action"`
	// Paths (disk): absolute paths to measure besides the state directory.
	Paths []string `json:"paths,omitempty"`
	// Host, Port, TimeoutSeconds (connect): a TCP connect from the node.
	Host           string   `json:"host,omitempty"`
	Port           int      `json:"port,omitempty"`
	TimeoutSeconds *float64 `json:"timeout_seconds,omitempty"`
	// Names (resolve): host names to look up.
	Names []string `json:"names,omitempty"`
}

// ConnectTimeout is connect's timeout: the one asked for, else the default.
func (d Diagnose) ConnectTimeout() time.Duration {
	if d.TimeoutSeconds == nil {
		return DefaultDiagConnectTimeout
	}
	return time.Duration(*d.TimeoutSeconds * float64(time.Second))
}

// DiagProblem names one parameter at fault (Field is relative to the
// payload: "action", "paths/2", …).
type DiagProblem struct {
	Field   string
	Message string
}

// ValidateDiagnose decodes and checks a diagnose payload: a known action,
// only its own parameters, each within its bounds. Problems name the
// fields at fault; none means d is safe to run.
func ValidateDiagnose(payload json.RawMessage) (d Diagnose, problems []DiagProblem) {
	add := func(field, format string, args ...any) {
		problems = append(problems, DiagProblem{Field: field, Message: fmt.Sprintf(format, args...)})
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(payload, &raw); err != nil || raw == nil {
		add("", "a JSON object {action, …parameters}")
		return d, problems
	}
	var action string
	if err := json.Unmarshal(raw["action"], &action); err != nil || action == "" {
		add("action", "required: one of %s", strings.Join(DiagActions(), ", "))
		return d, problems
	}
	allowed, ok := diagParams[action]
	if !ok {
		add("action", "one of %s", strings.Join(DiagActions(), ", "))
		return d, problems
	}
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k != "action" && !contains(allowed, k) {
			add(k, "not a parameter of %s", action)
		}
	}
	if len(problems) > 0 {
		return d, problems
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		add("", "does not match the %s action's parameters: %s", action, strings.TrimPrefix(err.Error(), "json: "))
		return d, problems
	}
	for _, k := range keys {
		if string(raw[k]) == "null" {
			add(k, "must not be null")
		}
	}
	switch action {
	case DiagDisk:
		if len(d.Paths) > MaxDiagPaths {
			add("paths", "at most %d paths", MaxDiagPaths)
		}
		for i, p := range d.Paths {
			if !path.IsAbs(p) || len(p) > maxDiagPathBytes || strings.ContainsRune(p, 0) {
				add(fmt.Sprintf("paths/%d", i), "an absolute path (starting with /), at most %d bytes", maxDiagPathBytes)
			}
		}
	case DiagConnect:
		if !ValidHost(d.Host) {
			add("host", "required: a host name or an IP address")
		}
		if d.Port < 1 || d.Port > 65535 {
			add("port", "required: 1 to 65535")
		}
		if t := d.TimeoutSeconds; t != nil && (*t <= 0 || *t > MaxDiagConnectTimeout.Seconds()) {
			add("timeout_seconds", "more than 0, at most %d", int(MaxDiagConnectTimeout.Seconds()))
		}
	case DiagResolve:
		if len(d.Names) == 0 || len(d.Names) > MaxDiagNames {
			add("names", "required: 1 to %d host names", MaxDiagNames)
		}
		for i, n := range d.Names {
			if !ValidHostName(n) {
				add(fmt.Sprintf("names/%d", i), "a host name (letters, digits, '-' and '.', at most 253 characters)")
			}
		}
	}
	return d, problems
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

// ValidHost reports whether s is an IP address or a host name.
func ValidHost(s string) bool {
	return net.ParseIP(s) != nil || ValidHostName(s)
}

// ValidHostName reports whether s is a DNS host name: dot-separated labels
// of letters, digits and inner hyphens, each 1–63 characters, at most 253
// in all (one trailing dot allowed).
func ValidHostName(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

// Evidence shapes (the `evidence` of a diagnose result). Every evidence
// object carries `action` and `ran_at` (the node's clock when it ran).

// DiskUsage is one measured path.
type DiskUsage struct {
	Path       string  `json:"path"`
	TotalBytes int64   `json:"total_bytes,omitempty"`
	FreeBytes  int64   `json:"free_bytes,omitempty"`
	UsedBytes  int64   `json:"used_bytes,omitempty"`
	UsedPct    float64 `json:"used_percent,omitempty"`
	// Error says why the path could not be measured.
	Error string `json:"error,omitempty"`
}

// DiskEvidence answers disk: the state directory first, then each path.
type DiskEvidence struct {
	Action string      `json:"action"`
	RanAt  time.Time   `json:"ran_at"`
	Paths  []DiskUsage `json:"paths"`
}

// WorkloadEvidence is one attempt the runtime knows.
type WorkloadEvidence struct {
	RunID     string `json:"run_id"`
	AttemptID string `json:"attempt_id"`
	State     string `json:"state"`
	ExitCode  *int   `json:"exit_code,omitempty"`
	Signal    string `json:"signal,omitempty"`
	// SupervisorLost: the supervisor vanished without recording an exit.
	SupervisorLost bool       `json:"supervisor_lost,omitempty"`
	Failure        string     `json:"failure,omitempty"`
	StartedAt      *time.Time `json:"started_at,omitempty"`
	ExitedAt       *time.Time `json:"exited_at,omitempty"`
}

// WorkloadsEvidence answers workloads.
type WorkloadsEvidence struct {
	Action    string             `json:"action"`
	RanAt     time.Time          `json:"ran_at"`
	Workloads []WorkloadEvidence `json:"workloads"`
	// Truncated: more attempts than fit in the evidence.
	Truncated bool `json:"truncated,omitempty"`
}

// ConnectEvidence answers connect. A refused or timed-out connect is
// evidence (Connected false, Error saying why), not a failure.
type ConnectEvidence struct {
	Action         string    `json:"action"`
	RanAt          time.Time `json:"ran_at"`
	Host           string    `json:"host"`
	Port           int       `json:"port"`
	TimeoutSeconds float64   `json:"timeout_seconds"`
	Connected      bool      `json:"connected"`
	LatencyMs      float64   `json:"latency_ms"`
	RemoteAddr     string    `json:"remote_addr,omitempty"`
	Error          string    `json:"error,omitempty"`
}

// ResolveResult is one looked-up name.
type ResolveResult struct {
	Name      string   `json:"name"`
	Addresses []string `json:"addresses"`
	Error     string   `json:"error,omitempty"`
}

// ResolveEvidence answers resolve.
type ResolveEvidence struct {
	Action  string          `json:"action"`
	RanAt   time.Time       `json:"ran_at"`
	Results []ResolveResult `json:"results"`
}

// ClockEvidence answers clock. The node knows only its own clock and the
// command's issued_at (the server's clock when the command was recorded,
// which may be long before delivery), so NodeMinusIssuedMs is an upper
// bound of how far the node runs ahead, not the skew. The server adds a
// Server section when it settles the result: the skew bounds from the
// delivery and receipt times it measured itself.
type ClockEvidence struct {
	Action   string    `json:"action"`
	RanAt    time.Time `json:"ran_at"`
	NodeTime time.Time `json:"node_time"`
	// IssuedAt and NodeMinusIssuedMs are absent when the agent ran it
	// again after a restart (its journal keeps no issue time).
	IssuedAt          *time.Time   `json:"issued_at,omitempty"`
	NodeMinusIssuedMs *int64       `json:"node_minus_issued_ms,omitempty"`
	Server            *ClockBounds `json:"server,omitempty"`
}

// ClockBounds is the server's honest account of a node's clock skew: the
// node's time was read between the server's delivery of the command and
// its receipt of the answer, so skew (node minus server) lies in
// [SkewMinMs, SkewMaxMs]; SkewMs is the interval's middle and
// UncertaintyMs its half width.
type ClockBounds struct {
	DeliveredAt   time.Time `json:"delivered_at"`
	ReceivedAt    time.Time `json:"received_at"`
	SkewMinMs     int64     `json:"skew_min_ms"`
	SkewMaxMs     int64     `json:"skew_max_ms"`
	SkewMs        int64     `json:"skew_ms"`
	UncertaintyMs int64     `json:"uncertainty_ms"`
}

// AgentEvidence answers agent.
type AgentEvidence struct {
	Action            string    `json:"action"`
	RanAt             time.Time `json:"ran_at"`
	Version           string    `json:"version"`
	StartedAt         time.Time `json:"started_at"`
	UptimeSeconds     int64     `json:"uptime_seconds"`
	SpoolEvents       int       `json:"spool_events"`
	SpoolBytes        int64     `json:"spool_bytes"`
	DroppedHeartbeats int       `json:"dropped_heartbeats"`
	JournalOps        int       `json:"journal_operations"`
	JournalBytes      int64     `json:"journal_bytes"`
	UnackedResults    int       `json:"unacked_results"`
	Capabilities      []string  `json:"capabilities"`
	Runtimes          []string  `json:"runtimes"`
}
