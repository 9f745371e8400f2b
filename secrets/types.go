// Package secrets seals values a person or script types (ARCHITECTURE.md §4):
// a sealed value is stored encrypted under the sealing subkey and answered as
// a handle bound to its sealer, request id, target and field; an operation
// that carries handles resolves them once, all or none, in the submitting
// transaction. Every seal, use, denial and expiry is audited, never a value.
// The package holds the rules; models/ implements its Store.
package secrets

import (
	"context"
	"errors"
	"time"
)

// HandlePrefix starts every sealed handle (version 1).
const HandlePrefix = "nw-sealed:v1:"

// Limits (DECISIONS.md §37).
const (
	DefaultTTL   = 10 * time.Minute
	MaxTTL       = 24 * time.Hour
	MaxValueSize = 64 << 10
	// DefaultMaxLive is how many unused, unexpired handles one principal
	// may hold.
	DefaultMaxLive = 1000
	// LaunchValuesKept bounds how long a succeeded launch's values are
	// kept, encrypted, to scrub its workload's output when the attempt
	// exits (DECISIONS.md §43); output recorded sooner releases them.
	LaunchValuesKept = 7 * 24 * time.Hour
)

// Target kinds a value may be sealed for. TargetFleet (no id) is a fan-out's.
const (
	TargetFleet       = "fleet"
	TargetNode        = "node"
	TargetEndpoint    = "endpoint"
	TargetPackageHost = "package_host"
)

// State is a sealed handle's state.
type State string

// Handle states.
const (
	StateSealed  State = "sealed"
	StateUsed    State = "used"
	StateExpired State = "expired"
)

// Audit actions and outcomes.
const (
	ActionSeal   = "seal"
	ActionUse    = "use"
	ActionExpire = "expire"

	OutcomeOK     = "ok"
	OutcomeDenied = "denied"
	OutcomePurged = "purged"
)

// ErrNoRows is what a Store answers for a row that does not exist.
var ErrNoRows = errors.New("no rows")

// ErrQuota is what Store.Seal answers when the principal holds the most
// live handles already.
var ErrQuota = errors.New("too many live handles")

// Principal is who sealed or uses a handle.
type Principal struct {
	Kind string
	ID   string
}

// Target is what a value is sealed for.
type Target struct {
	Kind string `json:"kind"`
	ID   string `json:"id,omitempty"`
}

// Sealed is one stored sealed value. The handle itself is never stored:
// Digest is its SHA-256 (hex).
type Sealed struct {
	Digest      string
	Principal   Principal
	RequestID   string
	Target      Target
	Field       string
	KeyID       string
	Box         []byte // nonce and AES-GCM ciphertext
	State       State
	OperationID string
	CreatedAt   time.Time
	ExpiresAt   time.Time
	UsedAt      *time.Time
}

// Delivery is a resolved value kept, encrypted, beside the operation that
// used it, for delivery to the node that runs it.
type Delivery struct {
	OperationID string
	Field       string
	KeyID       string
	Box         []byte
	CreatedAt   time.Time
}

// AuditEntry is one seal, use, denial or expiry. It never holds a value;
// HandleDigest is the first 16 hex characters of the handle's digest.
type AuditEntry struct {
	Cursor       int64
	At           time.Time
	Action       string
	Outcome      string
	Principal    Principal
	HandleDigest string
	RequestID    string
	OperationID  string
	Target       Target
	Field        string
}

// AuditFilter selects audit rows: every field set must match (an empty
// one matches all). Before is the keyset cursor (0: from the newest).
type AuditFilter struct {
	PrincipalKind string
	PrincipalID   string
	OperationID   string
	TargetKind    string
	TargetID      string
	Action        string
	Outcome       string
	Before        int64
	Limit         int
}

// AuditActions and AuditOutcomes are every action and outcome an audit row
// may hold.
var (
	AuditActions  = []string{ActionSeal, ActionUse, ActionReveal, ActionExpire}
	AuditOutcomes = []string{OutcomeOK, OutcomeDenied, OutcomePurged, OutcomeSpent, OutcomeExpired, OutcomeNotReady, OutcomeReplayed}
)

// Store is the secrets' persistence.
type Store interface {
	// Seal records s with its audit row, unless s's principal holds
	// maxLive handles still sealed and unexpired at s.CreatedAt (ErrQuota,
	// nothing written). Concurrent seals never overrun the quota.
	Seal(ctx context.Context, s Sealed, a AuditEntry, maxLive int) error
	// InsertAudit records audit rows on their own.
	InsertAudit(ctx context.Context, a ...AuditEntry) error
	// Audit answers the audit rows f selects, with a cursor below
	// f.Before (0: from the newest), newest first, at most f.Limit; an
	// index serves each filter, so a page never scans the whole log for a
	// rare value.
	Audit(ctx context.Context, f AuditFilter) ([]AuditEntry, error)
	// Purge deletes up to batch handles whose expiry is at or before now,
	// and audits each one that was never used, in one transaction; it
	// answers how many went.
	Purge(ctx context.Context, now time.Time, batch int) (int, error)
	// Deliveries answers the operation's resolved values.
	Deliveries(ctx context.Context, operationID string) ([]Delivery, error)
	// RevealsOf answers the operation's reveal handles.
	RevealsOf(ctx context.Context, operationID string) ([]Reveal, error)
	// LookupReveal answers the reveal handle of that digest, or ErrNoRows.
	LookupReveal(ctx context.Context, digest string) (Reveal, error)
	// SpendReveal moves the handle from open to spent and records a with
	// it, and reports whether it did: of concurrent spends exactly one
	// does.
	SpendReveal(ctx context.Context, digest string, at time.Time, a AuditEntry) (bool, error)
	// ExpireReveals moves up to batch open reveal handles whose expiry is
	// at or before now to expired, auditing each, deletes those that
	// expired before now minus keep, and answers how many it expired.
	ExpireReveals(ctx context.Context, now time.Time, keep time.Duration, batch int) (int, error)
	// PurgeDeliveries deletes up to batch resolved values whose operation
	// has ended (or is gone) — except a succeeded launch's, kept for
	// scrubbing its attempt's output until that output is recorded or
	// the launch ended before keepLaunchSince — and answers how many went.
	PurgeDeliveries(ctx context.Context, keepLaunchSince time.Time, batch int) (int, error)
}

// Tx is the part of the store used inside the ledger's submitting
// transaction, so a refused submission leaves every handle unused.
type Tx interface {
	// Lookup answers the handle of that digest, or ErrNoRows.
	Lookup(ctx context.Context, digest string) (Sealed, error)
	// MarkUsed moves the handle from sealed to used by the operation and
	// reports whether it did: of concurrent uses exactly one does.
	MarkUsed(ctx context.Context, digest, operationID string, at time.Time) (bool, error)
	// InsertDeliveries records resolved values for delivery.
	InsertDeliveries(ctx context.Context, d ...Delivery) error
	// Deliveries answers the operation's resolved values in the
	// transaction.
	Deliveries(ctx context.Context, operationID string) ([]Delivery, error)
	// InsertReveals records reveal handles in the transaction.
	InsertReveals(ctx context.Context, r ...Reveal) error
	// InsertAudit records audit rows in the transaction.
	InsertAudit(ctx context.Context, a ...AuditEntry) error
}
