// Package ledger owns operations: every change to the fleet is a typed,
// idempotent request recorded in one table before anything happens, carried
// out by the executor of its kind, and answered by polling, waiting or
// watching (ARCHITECTURE.md §3, DECISIONS.md §12–16, §34–42).
//
// The lifecycle is pending → running → succeeded | failed | cancelled.
// Terminal states never change. An operation's idempotency key is its
// principal and client request id: the same key with the same canonical
// digest answers the recorded operation, with another digest it is
// request_conflict.
//
// Local kinds are claimed by a dispatcher (one statement, FOR UPDATE SKIP
// LOCKED on Postgres), at most Settings.Workers at once per replica. A
// replica holds an owner lease while it runs operations; operations left
// running by a replica whose lease lapsed are recovered by any other:
// re-run when the kind is safe to repeat, else failed `interrupted`
// (retryable). The package knows nothing of HTTP; its Store is implemented
// in models/.
package ledger

import (
	"encoding/json"
	"regexp"
	"time"
)

// State is where an operation stands.
type State string

// Operation states.
const (
	// StatePending: recorded, not yet accepted by its channel.
	StatePending State = "pending"
	// StateRunning: accepted (claimed by an executor, or delivered to a
	// node); it ends with the executor's or the node's answer.
	StateRunning State = "running"
	// StateSucceeded: ended as asked. Terminal.
	StateSucceeded State = "succeeded"
	// StateFailed: ended with an error (code, message, retryable). Terminal.
	StateFailed State = "failed"
	// StateCancelled: withdrawn before it took effect, or its run was
	// cancelled. Terminal.
	StateCancelled State = "cancelled"
)

// States lists every state, in lifecycle order.
var States = []State{StatePending, StateRunning, StateSucceeded, StateFailed, StateCancelled}

// Valid reports whether s is a known state.
func (s State) Valid() bool {
	for _, x := range States {
		if s == x {
			return true
		}
	}
	return false
}

// Terminal reports whether s never changes again.
func (s State) Terminal() bool {
	return s == StateSucceeded || s == StateFailed || s == StateCancelled
}

// transitions is the lifecycle; every state change goes through
// CanTransition (the store's claiming statements mirror pending → running
// and running → pending).
var transitions = map[State][]State{
	StatePending: {StateRunning, StateSucceeded, StateFailed, StateCancelled},
	// running → pending is restart recovery handing a safe-to-repeat
	// operation back to the dispatcher.
	StateRunning: {StatePending, StateSucceeded, StateFailed, StateCancelled},
}

// CanTransition reports whether an operation may move from one state to
// another.
func CanTransition(from, to State) bool {
	for _, x := range transitions[from] {
		if x == to {
			return true
		}
	}
	return false
}

// Channel says how an operation is carried out.
type Channel string

// Channels (DECISIONS.md §14).
const (
	// ChannelLocal: the control plane runs it (the dispatcher).
	ChannelLocal Channel = "local"
	// ChannelLongPoll: a node runs it; it is accepted when first delivered
	// and ends with the node's answer. It holds no executor slot.
	ChannelLongPoll Channel = "long_poll"
)

// PrincipalKind says who submitted an operation.
type PrincipalKind string

// Principal kinds.
const (
	PrincipalAdmin       PrincipalKind = "admin"
	PrincipalPackageHost PrincipalKind = "package_host"
)

// Principal is who asks. Administrators may submit any kind; a package host
// only kinds of its granted families (DECISIONS.md §15).
type Principal struct {
	Kind PrincipalKind
	// ID is stable per principal: the administrator's user id, or the
	// package host's id.
	ID string
	// Name is for display (a username, a package host's name).
	Name string
	// Generation is the package host's token generation (0 for admins).
	Generation int64
	// Families are a package host's grants.
	Families []string
}

// Key is the principal's idempotency namespace: request ids are unique per
// principal (DECISIONS.md §13).
func (p Principal) Key() string { return string(p.Kind) + ":" + p.ID }

// May reports whether p may submit kinds of family.
func (p Principal) May(family string) bool {
	if p.Kind == PrincipalAdmin {
		return true
	}
	for _, f := range p.Families {
		if f == family {
			return true
		}
	}
	return false
}

// Target names what an operation acts on.
type Target struct {
	Kind string `json:"kind"`
	ID   string `json:"id,omitempty"`
}

// Target kinds.
const (
	TargetNode        = "node"
	TargetFleet       = "fleet"
	TargetPackageHost = "package_host"
	TargetEndpoint    = "endpoint"
)

// TargetKinds lists every target kind.
var TargetKinds = []string{TargetNode, TargetFleet, TargetPackageHost, TargetEndpoint}

// Error is how an operation failed.
type Error struct {
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
	// CapabilityMissing counts the children (among Failed) whose node
	// lacked the capability their kind needs (DECISIONS.md §45).
	CapabilityMissing int `json:"capability_missing,omitempty"`
}

// Operation is one row of the ledger.
type Operation struct {
	// Cursor orders operations by submission; listings page on it.
	Cursor    int64
	ID        string
	RequestID string
	// Digest is the SHA-256 of the canonical {kind, targets, operation}.
	Digest string

	PrincipalKind PrincipalKind
	PrincipalID   string
	PrincipalName string
	// PackageHostGeneration is the submitting token's generation (package
	// hosts only).
	PackageHostGeneration int64

	Family  string
	Kind    string
	State   State
	Channel Channel
	// Attempt counts runs: 1 on first claim, more after recovery.
	Attempt int
	Targets []Target
	// TargetKind and TargetID index the single target (a fan-out parent
	// over many nodes is indexed as the fleet).
	TargetKind string
	TargetID   string
	ParentID   string
	// Held: a fan-out child waiting for a slot under its parent's
	// max_concurrency; nothing was handed to its node yet.
	Held bool
	// Counts are set on a fan-out parent once it recorded its children:
	// it then waits on them, holding no executor slot.
	Counts *Counts
	Reason string

	// Operation is the canonical request body of the kind (handles, never
	// secret values).
	Operation json.RawMessage
	Result    json.RawMessage
	Error     *Error
	Evidence  json.RawMessage

	CancelRequestedAt *time.Time
	CancelReason      string
	// Owner is the replica running a local operation.
	Owner string

	CreatedAt  time.Time
	AcceptedAt *time.Time
	FinishedAt *time.Time
	Deadline   time.Time
	UpdatedAt  time.Time

	// Recorded is what the kind's Record wrote for it in this very submit
	// (the node's command), so the submitter need not read it back; nil on
	// a replay and on every read. Never stored.
	Recorded any
	// Reveals are the submitter's one-time handles to the secrets the
	// operation generates, field → handle: answered to a submit and its
	// replays within the handles' TTL; nil on every read. Never stored
	// here (secrets keeps them).
	Reveals map[string]string
	// Secrets are the generated values themselves, field → value, shown
	// once in the answer of a submit that waited for the operation to
	// succeed (Submission.InlineSecrets); showing them spent their
	// handles.
	Secrets map[string]string
}

// Terminal reports whether the operation has ended.
func (o Operation) Terminal() bool { return o.State.Terminal() }

// Event types: one per transition, plus cancel requests.
const (
	EventSubmitted       = "submitted"
	EventRunning         = "running"
	EventSucceeded       = "succeeded"
	EventFailed          = "failed"
	EventCancelled       = "cancelled"
	EventCancelRequested = "cancel_requested"
	EventRecovered       = "recovered"
	EventFannedOut       = "fanned_out"
	EventReleased        = "released"
)

// Event is one entry of an operation's history.
type Event struct {
	Cursor      int64
	OperationID string
	Type        string
	At          time.Time
	Data        json.RawMessage
}

// NodeEvent is an event of an operation that targeted a node, with what a
// node's timeline shows of the operation.
type NodeEvent struct {
	Event
	Kind          string
	PrincipalKind PrincipalKind
	PrincipalName string
}

// requestIDPattern is DECISIONS.md §13's request id.
var requestIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

// ValidRequestID reports whether s is a well-formed request id.
func ValidRequestID(s string) bool { return requestIDPattern.MatchString(s) }
