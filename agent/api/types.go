// Package api holds the wire types of the agent API (/agent/v1/...), shared by
// the control plane's handlers, the agent, the tests and the load tool so the
// two ends of the wire cannot drift apart. openapi.yaml is the contract; these
// types are its Go spelling.
package api

import (
	"encoding/json"
	"time"
)

// Command kinds a node understands.
const (
	KindPrepareImage    = "prepare_image"
	KindPrepareArtifact = "prepare_artifact"
	KindLaunchWorkload  = "launch_workload"
	KindStopWorkload    = "stop_workload"
	// KindDiagnose runs one whitelisted, read-only diagnostic action
	// (DECISIONS.md §46); its result carries the evidence.
	KindDiagnose = "diagnose"
)

// Capabilities an agent reports in its facts (DECISIONS.md §45). Facts
// without a list are read as CapCommands and CapConfig.
const (
	CapCommands = "commands.v1"
	CapConfig   = "config.v1"
	CapOutput   = "output.v1"
	CapDiag     = "diag.v1"
)

// States of a configuration report (DECISIONS.md §32).
const (
	ConfigApplied = "applied"
	ConfigFailed  = "failed"
)

// Event kinds an agent reports.
const (
	EventHeartbeat = "heartbeat"
	EventWorkload  = "workload"
	EventConfig    = "config"
)

// Workload states an agent observes.
const (
	WorkloadCreated = "created"
	WorkloadRunning = "running"
	WorkloadExited  = "exited"
	WorkloadAbsent  = "absent"
)

// Bootstrap is what an invitation answers: everything a machine needs to enroll.
type Bootstrap struct {
	NodeID          string    `json:"node_id"`
	RentalID        string    `json:"rental_id"`
	Generation      int64     `json:"generation"`
	EnrollmentToken string    `json:"enrollment_token"`
	ExpiresAt       time.Time `json:"expires_at"`
	ControlPlaneURL string    `json:"control_plane_url"`
	AgentVersion    string    `json:"agent_version"`
	// CACertificatePEM pins the control plane's private CA, when it has one.
	CACertificatePEM string `json:"ca_certificate_pem,omitempty"`
	// InvitationID names the invitation behind the token (never sent: the
	// ledger keeps it to mint the identical token again for a replay).
	InvitationID string `json:"-"`
}

// EnrollRequest is the body of POST /agent/v1/enroll.
type EnrollRequest struct {
	NodeID                string   `json:"node_id"`
	Generation            int64    `json:"generation"`
	EnrollmentToken       string   `json:"enrollment_token"`
	AgentVersion          string   `json:"agent_version"`
	Facts                 Facts    `json:"facts"`
	UnacknowledgedResults []Result `json:"unacknowledged_results,omitempty"`
	// EnrollmentNonce is a random value the agent chooses once per
	// bootstrap and sends with every attempt to redeem it. A retry whose
	// earlier attempt was redeemed but whose answer was lost is answered
	// again (same fencing token) instead of enrollment_spent.
	EnrollmentNonce string `json:"enrollment_nonce,omitempty"`
}

// EnrollResponse answers a successful enrollment.
type EnrollResponse struct {
	NodeID            string    `json:"node_id"`
	SessionToken      string    `json:"session_token"`
	SessionExpiresAt  time.Time `json:"session_expires_at"`
	SessionTTLSeconds int64     `json:"session_ttl_seconds"`
	FencingToken      int64     `json:"fencing_token"`
	LeaseSeconds      int64     `json:"lease_seconds"`
	HeartbeatSeconds  int64     `json:"heartbeat_seconds"`
}

// RenewResponse answers POST /agent/v1/session/renew.
type RenewResponse struct {
	SessionToken      string    `json:"session_token"`
	SessionExpiresAt  time.Time `json:"session_expires_at"`
	SessionTTLSeconds int64     `json:"session_ttl_seconds"`
}

// Facts is what a node observes about itself. DiskFreeBytes is nil when the
// node could not measure it.
type Facts struct {
	Hostname      string            `json:"hostname"`
	OS            string            `json:"os"`
	Arch          string            `json:"arch"`
	CPUs          int               `json:"cpus"`
	MemoryBytes   int64             `json:"memory_bytes"`
	DiskFreeBytes *int64            `json:"disk_free_bytes,omitempty"`
	AgentVersion  string            `json:"agent_version"`
	Runtimes      []string          `json:"runtimes"`
	Labels        map[string]string `json:"labels,omitempty"`
	// Capabilities names what this agent understands ("commands.v1", …);
	// nil means an agent that predates the list (DECISIONS.md §45).
	Capabilities []string  `json:"capabilities,omitempty"`
	ObservedAt   time.Time `json:"observed_at"`
}

// Command is one unit of work delivered to a node.
type Command struct {
	OperationID  string          `json:"operation_id"`
	NodeID       string          `json:"node_id"`
	Kind         string          `json:"kind"`
	FencingToken int64           `json:"fencing_token"`
	IssuedAt     time.Time       `json:"issued_at"`
	Payload      json.RawMessage `json:"payload"`
}

// MaxAnswerBytes is the most of an answer the agent reads. The server
// keeps a poll answer's commands within half of it (at least one command
// an answer), so a node with many large commands pending takes them over
// several polls instead of failing to read one answer again and again.
const MaxAnswerBytes = 8 << 20

// CommandsResponse answers GET /agent/v1/commands.
type CommandsResponse struct {
	Commands []Command `json:"commands"`
	// Config is the node's desired configuration while it is due
	// (DECISIONS.md §32); nil when nothing is due.
	Config *ConfigDelivery `json:"config,omitempty"`
}

// ConfigDelivery is a node's desired configuration as the poll carries it.
// Document is JSON null when the configuration was cleared.
type ConfigDelivery struct {
	Revision int64           `json:"revision"`
	Hash     string          `json:"hash"`
	Format   string          `json:"format"`
	Document json.RawMessage `json:"document"`
}

// ConfigReport is a node's account of converging on a revision: State is
// ConfigApplied or ConfigFailed, Message says why it failed.
type ConfigReport struct {
	Revision int64  `json:"revision"`
	Hash     string `json:"hash"`
	State    string `json:"state"`
	Message  string `json:"message,omitempty"`
}

// Result is a node's answer for one command: Applied false means refused,
// with Failure saying why; Duplicate true means it had been applied before.
type Result struct {
	OperationID string `json:"operation_id"`
	Applied     bool   `json:"applied"`
	Duplicate   bool   `json:"duplicate"`
	Failure     string `json:"failure,omitempty"`
	// Evidence is a diagnose command's structured answer (≤ 64 KiB).
	Evidence json.RawMessage `json:"evidence,omitempty"`
}

// ResultsRequest is the body of POST /agent/v1/results.
type ResultsRequest struct {
	Results []Result `json:"results"`
}

// Settled is the server's answer for one result.
type Settled struct {
	OperationID string `json:"operation_id"`
	State       string `json:"state,omitempty"`
	Code        string `json:"code,omitempty"`
}

// ResultsResponse answers POST /agent/v1/results.
type ResultsResponse struct {
	Settled []Settled `json:"settled"`
}

// WorkloadObservation is one observed state of a workload attempt.
type WorkloadObservation struct {
	RunID      string    `json:"run_id"`
	AttemptID  string    `json:"attempt_id"`
	State      string    `json:"state"`
	ExitCode   *int      `json:"exit_code,omitempty"`
	ObservedAt time.Time `json:"observed_at"`
}

// Event is one report from a node; ID makes a replayed spool harmless.
type Event struct {
	ID         string               `json:"id"`
	Kind       string               `json:"kind"`
	ObservedAt time.Time            `json:"observed_at"`
	Facts      *Facts               `json:"facts,omitempty"`
	Workload   *WorkloadObservation `json:"workload,omitempty"`
	Config     *ConfigReport        `json:"config,omitempty"`
}

// EventsRequest is the body of POST /agent/v1/events.
type EventsRequest struct {
	Events []Event `json:"events"`
}

// EventsResponse answers POST /agent/v1/events.
type EventsResponse struct {
	Recorded   int `json:"recorded"`
	Duplicates int `json:"duplicates"`
}

// Problem is an RFC 9457 problem document with the stable machine code.
type Problem struct {
	Type   string `json:"type,omitempty"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	Code   string `json:"code"`
}

// Command payloads.

// PrepareArtifact downloads url into the content-addressed cache.
type PrepareArtifact struct {
	ArtifactID string `json:"artifact_id"`
	URL        string `json:"url"`
	SHA256     string `json:"sha256"`
}

// PrepareImage makes a named image ready; for the process runtime it is an
// unpacked artifact.
type PrepareImage struct {
	Image      string `json:"image"`
	ArtifactID string `json:"artifact_id,omitempty"`
}

// LaunchWorkload starts one attempt of a run.
type LaunchWorkload struct {
	RunID        string            `json:"run_id"`
	AttemptID    string            `json:"attempt_id"`
	Image        string            `json:"image,omitempty"`
	Command      string            `json:"command"`
	Args         []string          `json:"args,omitempty"`
	Env          map[string]string `json:"env,omitempty"`
	CacheVolumes []string          `json:"cache_volumes,omitempty"`
}

// StopWorkload stops one attempt: SIGTERM, then SIGKILL after the grace.
type StopWorkload struct {
	RunID        string `json:"run_id"`
	AttemptID    string `json:"attempt_id"`
	GraceSeconds int    `json:"grace_seconds"`
}
