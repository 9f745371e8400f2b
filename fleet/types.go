// Package fleet owns the node registry and command delivery: invitations,
// two-door enrollment, fenced sessions, leases and heartbeats, workload
// reports, retirement, offers, and durable commands delivered over long-polls
// with an exactly-once effect. Its rules are written against the Store
// interface; it knows nothing of HTTP or SQL.
//
// Node lifecycle:
//
//	enrolling --enroll--> ready <--lease lapse / heartbeat--> lost
//	    any state --retire--> retired (terminal)
//
// Command lifecycle: pending --node answers--> applied | refused. A refused
// prepare_* command may be issued again under its operation id (preparing
// content leaves no effect); a refused launch or stop keeps its id spent.
//
// Details settled here where the design left room:
//   - Expiry: enrollment tokens and sessions verify until their expiry plus
//     the 5 s JWT leeway (DECISIONS.md §9), not a moment longer.
//   - Refusal codes a command can end with: refused_by_node (the node said
//     no, with its reason), node_retired (retired before delivery),
//     outcome_unknown (delivered to an earlier enrollment, DECISIONS.md §1).
//   - Redelivery after the visibility timeout happens on the node's next
//     poll; a poll already held is not woken for it (it ends within 60 s).
//   - A held long-poll renews the lease at most once a third of the lease,
//     through the same group commit as heartbeats.
//   - Billing blocks: at the exact instant a block ends, the node is in the
//     next one.
//   - Live sessions: each replica publishes the long-polls it holds every
//     5 s; a replica silent for 15 s is not listed.
package fleet

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
)

// State is a node's place in its lifecycle.
type State string

// Node states.
const (
	// StateEnrolling: invited, not yet redeemed.
	StateEnrolling State = "enrolling"
	// StateReady: enrolled, lease current; offered and sent work.
	StateReady State = "ready"
	// StateLost: the lease lapsed without a heartbeat. Unobserved, not
	// dead: a heartbeat on a valid session makes it ready again.
	StateLost State = "lost"
	// StateRetired: terminal; the identity stays as history.
	StateRetired State = "retired"
)

// Valid reports whether s is a known state.
func (s State) Valid() bool {
	switch s {
	case StateEnrolling, StateReady, StateLost, StateRetired:
		return true
	}
	return false
}

// CanTransition is the node state machine in one place: every change of a
// node's state in Go goes through Node.moveTo, which asks it, and the two
// changes made in SQL for a batch of nodes (models: RenewLeases brings lost
// nodes back to ready, SweepLeases marks ready nodes lost) say there that
// they mirror it. A node is created enrolling (Invite); that is its start,
// not a transition.
func CanTransition(from, to State) bool {
	switch {
	case from == StateRetired:
		return false
	case to == StateRetired:
		return true
	case to == StateReady:
		// Enrollment (from any live state: a re-enrollment fences the old
		// session) or a heartbeat bringing a lost node back.
		return true
	case to == StateLost:
		return from == StateReady
	case to == StateEnrolling:
		return false
	}
	return false
}

// moveTo changes n's state to to, or refuses a change the state machine
// forbids. Callers refuse the forbidden cases with their own errors first
// (ErrNodeRetired, say); this is the guard that no path slips past them.
func (n *Node) moveTo(to State) error {
	if !CanTransition(n.State, to) {
		return fmt.Errorf("fleet: node %s cannot go from %s to %s", n.ID, n.State, to)
	}
	n.State = to
	return nil
}

// Disk states: one of three answers, never a boolean.
const (
	DiskNeverReported = "never_reported"
	DiskUnmeasurable  = "unmeasurable"
	DiskMeasured      = "measured"
)

// Disk is what a node last said of its free disk.
type Disk struct {
	State      string
	FreeBytes  *int64
	ObservedAt *time.Time
}

// Purchase is the terms a node is bought on.
type Purchase struct {
	// BillingIntervalSeconds nil means own hardware, held continuously.
	BillingIntervalSeconds *int64
	// EligibleClasses empty means held for anybody.
	EligibleClasses []string
	AvailableUntil  *time.Time
}

// Node is one node identity (one generation of a rental).
type Node struct {
	ID              string
	RentalID        string
	Generation      int64
	State           State
	FencingToken    int64
	CreatedAt       time.Time
	UpdatedAt       time.Time
	EnrolledAt      *time.Time
	LeaseExpiresAt  *time.Time
	LastHeartbeatAt *time.Time
	RetiredAt       *time.Time
	AgentVersion    string
	// Facts is the node's latest self-report (JSON of api.Facts), with the
	// node's own observation time and the server's receipt time.
	Facts           json.RawMessage
	FactsObservedAt *time.Time
	FactsReceivedAt *time.Time
	Disk            Disk
	// EnrollNonceDigest is the digest of the nonce the agent sent with
	// its latest enrollment ("" when it sent none): proof, on a retry,
	// that the retrying agent is the one that enrolled.
	EnrollNonceDigest string
	// PriceMicros is the shadow price in micro-USD per hour; nil is
	// unpriced (never offered).
	PriceMicros *int64
	Purchase    Purchase
}

// InvitationState is an invitation's place in its lifecycle.
type InvitationState string

// Invitation states.
const (
	InvitationOutstanding InvitationState = "outstanding"
	InvitationRedeemed    InvitationState = "redeemed"
	InvitationSuperseded  InvitationState = "superseded"
	InvitationRevoked     InvitationState = "revoked"
)

// Invitation is one enrollment token's record: the claims needed to re-mint
// it and the digest, never the token.
type Invitation struct {
	ID          string
	NodeID      string
	Generation  int64
	TokenDigest string
	IssuedAt    time.Time
	ExpiresAt   time.Time
	State       InvitationState
	RedeemedAt  *time.Time
}

// CommandState is a command's place in its lifecycle.
type CommandState string

// Command states.
const (
	CommandPending CommandState = "pending"
	CommandApplied CommandState = "applied"
	CommandRefused CommandState = "refused"
	// CommandCancelled: withdrawn before it was ever delivered (its
	// operation was cancelled or passed its deadline). Terminal.
	CommandCancelled CommandState = "cancelled"
)

// Command is a durable unit of work for one node.
type Command struct {
	OperationID      string
	NodeID           string
	Kind             string
	Payload          json.RawMessage
	PayloadDigest    string
	FencingToken     int64
	IssuedAt         time.Time
	State            CommandState
	FailureCode      string
	FailureMessage   string
	DeliveredFencing *int64
	FirstDeliveredAt *time.Time
	LastDeliveredAt  *time.Time
	DeliveryCount    int
	SettledAt        *time.Time
	// Duplicate is set by a settlement whose node said it had already
	// applied the command (not stored on the command; its operation's
	// result records it).
	Duplicate bool
	// Evidence is a settled diagnose command's answer (not stored on the
	// command; its operation's result records it).
	Evidence json.RawMessage
}

// Wire returns the command as delivered to an agent.
func (c Command) Wire() api.Command {
	return api.Command{OperationID: c.OperationID, NodeID: c.NodeID, Kind: c.Kind,
		FencingToken: c.FencingToken, IssuedAt: c.IssuedAt, Payload: c.Payload}
}

// LeavesNoEffectOnFailure reports whether a refused command of kind can be
// asked again safely: preparing content either completes or leaves nothing,
// and a diagnose is read-only.
func LeavesNoEffectOnFailure(kind string) bool {
	return kind == api.KindPrepareImage || kind == api.KindPrepareArtifact || kind == api.KindDiagnose
}

// Workload is the latest observation of one workload attempt.
type Workload struct {
	NodeID     string
	RunID      string
	AttemptID  string
	State      string
	ExitCode   *int
	ObservedAt time.Time
	ReceivedAt time.Time
}

// AuditEntry records one change to a node: who, what, when. The operations
// ledger folds these in; they never hold a secret.
type AuditEntry struct {
	ID     int64
	At     time.Time
	Actor  string
	Action string
	NodeID string
	Detail map[string]any
}

// Errors of the fleet, each with its stable code.
var (
	ErrNotFound             = errcode.New(errcode.NotFound, "no such node")
	ErrIdentityExists       = errcode.New(errcode.IdentityExists, "that node identity exists already")
	ErrGenerationStale      = errcode.New(errcode.GenerationStale, "a newer generation of this rental exists")
	ErrEnrollmentInvalid    = errcode.New(errcode.EnrollmentInvalid, "enrollment token is not valid for this node and generation, or its window has closed")
	ErrEnrollmentSpent      = errcode.New(errcode.EnrollmentSpent, "enrollment token was already redeemed")
	ErrEnrollmentSuperseded = errcode.New(errcode.EnrollmentSuperseded, "enrollment token was replaced by a newer invitation")
	ErrNodeRetired          = errcode.New(errcode.NodeRetired, "node is retired")
	ErrNodeNotReady         = errcode.New(errcode.NodeNotReady, "node is not ready")
	ErrSessionInvalid       = errcode.New(errcode.SessionInvalid, "missing, invalid or expired session credential")
	ErrFenced               = errcode.New(errcode.Fenced, "session belongs to a superseded enrollment")
	ErrOperationConflict    = errcode.New(errcode.OperationConflict, "operation id was used for a different command")
	ErrCommandNotFound      = errcode.New(errcode.NotFound, "no such command")
	ErrDraining             = errcode.New(errcode.Draining, "control plane is shutting down; retry shortly")
	ErrEnrollmentShed       = errcode.New(errcode.Overloaded, "too many enrollments at once; retry shortly (nothing was redeemed)")
)
