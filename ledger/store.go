package ledger

import (
	"context"
	"errors"
	"time"

	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/secrets"
)

// ErrNoRows is what a Store returns when a looked-up row does not exist.
var ErrNoRows = errors.New("no rows")

// ErrDuplicate is what a Store returns when an insert hits a unique key
// (an operation id, or a principal's request id).
var ErrDuplicate = errors.New("duplicate key")

// Filter selects operations for a listing, newest first. Zero fields match
// everything.
type Filter struct {
	PrincipalKind PrincipalKind
	PrincipalID   string
	Family        string
	Kind          string
	State         State
	RequestID     string
	OperationID   string
	ParentID      string
	TargetKind    string
	TargetID      string
	// Kinds, when not nil, are the only (kind, target kind) pairs that
	// can match: those Family, Kind and TargetKind leave possible among
	// the served kinds (Registry.Narrow; Service.List sets it): the store
	// reads the listing from the (kind, target kind) index through them
	// unless another filter's index leads. Empty: nothing matches.
	Kinds []KindTarget
	// Before is the keyset cursor: only operations with a smaller cursor.
	Before int64
	Limit  int
}

// KindTarget is a kind and a target kind its operations are indexed
// under ("": any).
type KindTarget struct {
	Kind, TargetKind string
}

// End is how a running operation ends.
type End struct {
	OperationID string
	State       State
	Result      []byte
	Error       *Error
	At          time.Time
}

// Ended is an operation Finish ended, and its fan-out parent.
type Ended struct {
	OperationID string
	Kind        string
	ParentID    string
}

// IssueAhead is what a submit's transaction writes before anything else
// (Store.TxIssuing): it records Op with Events (Tx.InsertOperation), then
// asks for the node's quota count when Counted (Tx.ExpectNodeCount, with
// Exempt), then issues Command (fleet.Tx.IssueToNode), which records both.
type IssueAhead struct {
	Op      *Operation
	Events  []Event
	Command fleet.Command
	Counted bool
	Exempt  []string
}

// Store is the ledger's persistence. Every method of Tx runs inside the one
// transaction Store.Tx opened.
type Store interface {
	Reader
	// Tx runs fn in one transaction; a non-nil error rolls it back. The
	// transaction is shared with the fleet (Tx.Fleet), so an operation and
	// the change it makes commit together.
	Tx(ctx context.Context, fn func(tx Tx) error) error
	// TxIssuing is Tx for a submit that says ahead what fn writes (a
	// command kind's, Kind.PrepareIssue): the store may write it before
	// fn runs, in one statement with other submits' writes, and fn's own
	// calls then find it written. fn must make exactly the calls ahead
	// describes; a store that finds otherwise runs fn again on its own.
	TxIssuing(ctx context.Context, ahead IssueAhead, fn func(tx Tx) error) error
	// Insert records op with its first events, on its own, and announces
	// it to every replica; it sets op's Cursor. ErrDuplicate when its id,
	// or its principal's request id, exists.
	Insert(ctx context.Context, op *Operation, events ...Event) error
	// Finish ends running local operations owned by replica, each as its
	// End says, with an event each, in one write, and announces them; an
	// operation no longer running there (cancelled, recovered elsewhere)
	// is left alone. It answers the operations it ended.
	Finish(ctx context.Context, replica string, ends []End) ([]Ended, error)
	// Claim moves up to limit pending local operations to running, owned by
	// replica, accepted at now, attempt counted, oldest first, and answers
	// them; concurrent claims on other replicas never answer the same
	// operation. It writes each one's running event.
	Claim(ctx context.Context, replica string, now time.Time, limit int) ([]Operation, error)
	// RenewOwner records that replica runs operations until until.
	RenewOwner(ctx context.Context, replica string, until time.Time) error
	// DropOwner forgets replica's lease (a clean shutdown), so its
	// leftovers are recovered at once.
	DropOwner(ctx context.Context, replica string) error
	// DropOwners forgets the lease of every owner whose name starts with
	// prefix, except the one named except (earlier processes of a
	// restarted replica), so their leftovers are recovered at once.
	DropOwners(ctx context.Context, prefix, except string) error
	// Orphans answers up to limit running local operations owned by a
	// replica other than except that holds no lease current at leaseAt.
	Orphans(ctx context.Context, except string, leaseAt time.Time, limit int) ([]Operation, error)
	// FanningOut answers up to limit ids of running fan-out parents.
	FanningOut(ctx context.Context, limit int) ([]string, error)
	// WriteLane answers the write lane a node's transactions run in:
	// transactions that lock only nodes of one lane may be routed together
	// (fleet.OnNode with any of those nodes) and then commit beside other
	// lanes' work instead of holding every lane back. A store with one
	// writer answers 0 for every node.
	WriteLane(nodeID string) int
	// WriteLanes answers how many write lanes the store runs: 0 or 1 for
	// one writer.
	WriteLanes() int
	// Overdue answers up to limit pending operations of channel long_poll
	// whose deadline passed before now, oldest deadline first.
	Overdue(ctx context.Context, now time.Time, limit int) ([]Operation, error)
	// Prune deletes up to batch ended operations finished before opsBefore
	// (with their events and settled commands) and up to batch events older
	// than eventsBefore,
	// and answers how many of each went. On a shared database only one
	// replica prunes at a time; one that could not take the lock answers
	// (0, 0, false, nil).
	Prune(ctx context.Context, opsBefore, eventsBefore time.Time, batch int) (ops, events int, pruned bool, err error)
	// CountOpen answers how many operations are pending and running.
	CountOpen(ctx context.Context) (map[State]int64, error)
	// Summarize answers the fleet overview's counts of operations: by
	// state (every state present), those open now that were created since
	// recentSince and those that ended since recentSince; and those that
	// ended failed since failedSince. Each count is an index range, never
	// a scan of the ledger.
	Summarize(ctx context.Context, recentSince, failedSince time.Time) (Summary, error)
}

// Summary is the fleet overview's count of the ledger.
type Summary struct {
	// RecentByState counts, by state, the operations open now that were
	// created since RecentSince (pending, running) and those that ended
	// since RecentSince (succeeded, failed, cancelled): what the last hour
	// brought and settled. Every state has an entry.
	RecentByState map[State]int64
	RecentSince   time.Time
	// Failed counts operations that ended failed since FailedSince.
	Failed      int64
	FailedSince time.Time
}

// Reader is the read half of the store, usable in and out of a transaction.
type Reader interface {
	// Operation answers the operation or ErrNoRows.
	Operation(ctx context.Context, id string) (Operation, error)
	// OperationByRequest answers the principal's operation of that request
	// id, or ErrNoRows.
	OperationByRequest(ctx context.Context, p Principal, requestID string) (Operation, error)
	// List answers operations matching f, newest first.
	List(ctx context.Context, f Filter) ([]Operation, error)
	// Events answers the operation's events with a cursor above after,
	// oldest first, at most limit.
	Events(ctx context.Context, operationID string, after int64, limit int) ([]Event, error)
	// NodeEvents answers the latest events of operations that targeted the
	// node, newest first, at most limit, each with its operation's kind.
	NodeEvents(ctx context.Context, nodeID string, limit int) ([]NodeEvent, error)
}

// Tx is the write half of the store, inside one transaction.
type Tx interface {
	Reader
	// Fleet is the same transaction seen by the fleet's rules.
	Fleet() fleet.Tx
	// Auth is the same transaction seen by the administrators' and package
	// hosts' rules (the credential kinds, and the submit-time check that a
	// package host's token is still current).
	Auth() auth.Store
	// Secrets is the same transaction seen by the sealed secrets' rules
	// (handles an operation carries are spent as it is recorded).
	Secrets() secrets.Tx
	// LockKey serialises, until the transaction ends, every transaction
	// that locks the same key (quota checks per principal and per node).
	LockKey(ctx context.Context, key string) error
	// LockOperation answers the operation locked against concurrent change,
	// or ErrNoRows.
	LockOperation(ctx context.Context, id string) (Operation, error)
	// LockParent is LockOperation for a fan-out's advance, which locks its
	// parent for every batch of children that end: Targets is answered
	// empty, not read. A parent naming 10,000 nodes holds half a megabyte
	// of them, and decoding it on every advance was a quarter of a rolling
	// wave's CPU (BENCHMARKS.md, forty-fifth sitting).
	LockParent(ctx context.Context, id string) (Operation, error)
	// InsertOperation records op with its first events and sets its
	// Cursor; ErrDuplicate when its id, or its principal's request id,
	// exists. The store may send it with the transaction's next
	// statement (a command kind's, with its command's insert): the
	// Cursor is set, and ErrDuplicate answered by, that statement.
	InsertOperation(ctx context.Context, op *Operation, events ...Event) error
	// UpdateOperation writes every mutable field of op.
	UpdateOperation(ctx context.Context, op Operation) error
	// CountOpenForNode counts operations not yet ended that target the
	// node, other than kinds in except. It first takes the lock
	// LockKey("node:"+nodeID) takes, held until the transaction ends, so
	// two transactions' counts of one node never overlap: the later sees
	// what the earlier recorded.
	CountOpenForNode(ctx context.Context, nodeID string, except []string) (int, error)
	// ExpectNodeCount announces that once the transaction's next write for
	// the node has locked it (the command of operation operationID), the
	// caller will ask CountOpenForNode(nodeID, except): a store may answer
	// that count from the write itself instead of a statement of its own.
	ExpectNodeCount(nodeID, operationID string, except []string)
	// CountOpenForNodes is CountOpenForNode for many nodes in one
	// statement: node id → count (absent: 0).
	CountOpenForNodes(ctx context.Context, nodeIDs []string, except []string) (map[string]int, error)
	// CountOpenForPrincipal counts the principal's top-level operations
	// not yet ended (a fan-out counts once).
	CountOpenForPrincipal(ctx context.Context, p Principal) (int, error)
	// OpenNodeOperations answers the operations not yet ended that target
	// the node, oldest first, locked.
	OpenNodeOperations(ctx context.Context, nodeID string) ([]Operation, error)
	// ChildCounts counts a parent's children by state, and how many of
	// them are held.
	// The answer also holds, under CountCapabilityMissing, how many
	// children failed capability_missing (they count under their state
	// too).
	ChildCounts(ctx context.Context, parentID string) (byState map[State]int, held int, err error)
	// InsertOperations records many operations and their events (a
	// fan-out's children) in a few multi-row statements, however many
	// there are; ErrDuplicate on a taken id or request.
	InsertOperations(ctx context.Context, ops []Operation, events []Event) error
	// ReleaseHeld releases (held → not held, updated_at now) up to limit
	// of a parent's held children, oldest first, in one statement, and
	// answers them as they stand after.
	ReleaseHeld(ctx context.Context, parentID string, limit int, now time.Time) ([]Operation, error)
	// HeldChildren answers up to limit of a parent's held children,
	// oldest first (the order ReleaseHeld releases them), without locking
	// them: a rolling advance picks in its parent's lane what the write
	// lanes then release (Service.advance).
	HeldChildren(ctx context.Context, parentID string, limit int) ([]Operation, error)
	// ReleaseChildren releases (held → not held, updated_at now) the held
	// operations among ids, locked by the caller, in one statement, and
	// answers them as they stand after. Unlike ReleaseHeld it locks no
	// operation the caller did not name, so a write lane may run it for
	// its own nodes' children.
	ReleaseChildren(ctx context.Context, ids []string, now time.Time) ([]Operation, error)
	// OpenChildren answers a parent's children not yet ended, oldest
	// first.
	OpenChildren(ctx context.Context, parentID string) ([]Operation, error)
	// LockOperations answers the operations of ids that exist, locked
	// against concurrent change in id order.
	LockOperations(ctx context.Context, ids []string) ([]Operation, error)
	// Unrecorded answers a parent's children of the given kinds that were
	// released (not held), have not ended, and have no command recorded
	// yet: a fan-out's recording cut short (Service.recordReleased).
	Unrecorded(ctx context.Context, parentID string, kinds []string) ([]Operation, error)
	// AppendEvents records events (one multi-row insert).
	AppendEvents(ctx context.Context, events ...Event) error
	// Notify tells every replica, once this transaction commits, that the
	// operation changed (waiters, watchers and dispatchers wake).
	Notify(ctx context.Context, operationID string) error
	// NotifyDispatch tells every replica, once this transaction commits,
	// that the operation may be claimed (dispatchers look for work).
	NotifyDispatch(ctx context.Context, operationID string) error
	// NotifyParent tells this replica, once this transaction commits, that
	// a child of the fan-out parent ended (the parent is advanced).
	NotifyParent(ctx context.Context, parentID string) error
	// Savepoint runs fn so that its writes are undone, and the
	// transaction goes on, when it fails.
	Savepoint(ctx context.Context, fn func() error) error
}
