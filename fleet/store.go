package fleet

import (
	"context"
	"errors"
	"time"
)

// ErrNoRows is what a Store returns when the one row a method looks up by
// key does not exist. Listings answer an empty result instead.
var ErrNoRows = errors.New("no rows")

// ErrDuplicate is what a Store returns when an insert hits a unique key.
var ErrDuplicate = errors.New("duplicate key")

// NodeFilter selects nodes for a listing, newest first.
type NodeFilter struct {
	State State // empty: any
	// Before is the keyset cursor: nodes strictly older than this one.
	BeforeCreated *time.Time
	BeforeID      string
	// LeaseBefore, when set, keeps only nodes whose lease ends before it
	// (with State ready: the nodes about to be marked lost).
	LeaseBefore *time.Time
	Limit       int
}

// SummaryWindow says what Store.Summarize counts besides nodes by state.
type SummaryWindow struct {
	// LapseBefore: ready nodes whose lease ends before it are lapsing.
	LapseBefore time.Time
	// RefusedSince: commands refused at or after it are counted.
	RefusedSince time.Time
}

// Due selects the commands a poll may deliver (DECISIONS.md §2).
type Due struct {
	NodeID  string
	Fencing int64
	// RedeliverBefore: a command delivered to this fencing token at or
	// before this time is due again.
	RedeliverBefore time.Time
	Now             time.Time
	Limit           int
}

// LeaseRenewal extends one node's lease, as written by a coalesced batch.
type LeaseRenewal struct {
	NodeID      string
	Until       time.Time
	HeartbeatAt *time.Time // nil when the renewal came from a held long-poll
	Facts       *FactsUpdate
}

// FactsUpdate is a heartbeat's facts, written with its lease renewal.
type FactsUpdate struct {
	JSON         []byte
	AgentVersion string
	ObservedAt   time.Time
	ReceivedAt   time.Time
	Disk         Disk
	// Announce: the capabilities may differ from those stored; the write
	// notifies the node (NotifyNode) in its transaction, so every
	// replica's node cache forgets it.
	Announce bool
}

// Store is the persistence the fleet's rules need. Every method of Tx runs
// inside the one transaction Store.Tx opened; reads outside a transaction
// go through Store's own embedded Reader.
//
// Absence and conflict are answered only as each method says: ErrNoRows
// for a missing row looked up by key, ErrDuplicate for an insert that hits
// a unique key, a false or empty answer where so documented. Any other
// error is a store failure.
type Store interface {
	Reader
	// Tx runs fn in one transaction; a non-nil error from fn rolls it back
	// and is answered unchanged. Notifications fn queued are delivered only
	// once the transaction commits. fn may run more than once (a store
	// runs it again when the database refused it for a deadlock, having
	// rolled back what it wrote): it must set, not accumulate, what it
	// hands its caller.
	Tx(ctx context.Context, fn func(tx Tx) error) error
	// RenewLeases writes a batch of coalesced lease renewals in one commit:
	// ready and lost nodes get the new lease (lost ones become ready);
	// retired and enrolling nodes are left alone. It answers how many rows
	// changed; an unknown node id changes none and is no error.
	RenewLeases(ctx context.Context, batch []LeaseRenewal) (int, error)
	// Settle is Tx.SettlePending in a transaction of its own, answered
	// likewise; the store may write it in one statement with other nodes'
	// settlements of the same commit.
	Settle(ctx context.Context, nodeID string, at time.Time, ss []Settlement) ([]SettleFound, bool, error)
	// SweepLeases marks ready nodes whose lease ended before now as lost and
	// answers their ids. On a shared database only one replica sweeps at a
	// time; a replica that could not take the lock answers (nil, false, nil).
	// No lapsed lease answers (nil, true, nil).
	SweepLeases(ctx context.Context, now time.Time) (lost []string, swept bool, err error)
	// CountPendingCommands counts commands not yet settled (0 when none).
	CountPendingCommands(ctx context.Context) (int64, error)
	// FoldNodeCounts compacts the nodes-by-state counter (the changes
	// since the last fold into one entry per state); counts read the same
	// before and after.
	FoldNodeCounts(ctx context.Context) error
	// Summarize answers the fleet overview's counts, each from an index
	// or a counter (never a scan of the nodes or the commands).
	Summarize(ctx context.Context, w SummaryWindow) (Summary, error)
	// PublishSessions stores the long-polls this replica holds, creating the
	// replica's row or replacing it whole: there is no conflict.
	PublishSessions(ctx context.Context, replica string, started, now time.Time, sessions []LiveSession) error
	// TouchReplica marks this replica alive without rewriting its sessions;
	// it answers false when the replica has no row yet.
	TouchReplica(ctx context.Context, replica string, now time.Time) (bool, error)
	// ListSessions answers the long-polls of every replica that published
	// since freshAfter; none answers an empty list.
	ListSessions(ctx context.Context, freshAfter time.Time) ([]LiveSession, error)
	// Replicas answers every replica's row: when it started and when it
	// last published or touched it.
	Replicas(ctx context.Context) ([]ReplicaBeat, error)
	// OthersListening tells the store whether another replica may be
	// listening (Service.watchPeers). While none is, the store sends none
	// of the notifications that only wake readers and may follow their
	// commit (Notification.MayFollowCommit). When one appears, the store
	// first tells every replica to resync (NotifyResync), covering what
	// it did not send, then announces again. A store no other replica
	// shares ignores it.
	OthersListening(present bool)
}

// Reader is the read half of the store, usable in and out of a transaction.
type Reader interface {
	// Node answers the node, or ErrNoRows.
	Node(ctx context.Context, id string) (Node, error)
	// InviteConflicts answers, unlocked and in one read, what inviting a
	// node of that id (none when "") and rental would collide with: the
	// node of that id, if any, and every generation of the rental, lowest
	// generation first.
	InviteConflicts(ctx context.Context, id, rentalID string) ([]Node, error)
	// ReadInvitation answers the invitation, unlocked, or ErrNoRows.
	ReadInvitation(ctx context.Context, id string) (Invitation, error)
	// ListNodes answers the nodes f selects, newest first (by creation,
	// then id); none answers an empty list.
	ListNodes(ctx context.Context, f NodeFilter) ([]Node, error)
	// ReadyPricedNodes answers ready, priced nodes (offer candidates), by
	// id; none answers an empty list.
	ReadyPricedNodes(ctx context.Context) ([]Node, error)
	// Workload answers the latest observation of one workload attempt, or
	// ErrNoRows when it was never reported.
	Workload(ctx context.Context, nodeID, runID, attemptID string) (Workload, error)
	// Workloads answers a node's workload attempts by run and attempt id;
	// an unknown node, or one that reported none, answers an empty list.
	Workloads(ctx context.Context, nodeID string) ([]Workload, error)
	// WorkloadOutput answers the output reported for one attempt, or
	// ErrNoRows when none was.
	WorkloadOutput(ctx context.Context, nodeID, runID, attemptID string) (WorkloadOutput, error)
	// Command answers the command, or ErrNoRows.
	Command(ctx context.Context, operationID string) (Command, error)
	// LaunchCommands answers the operation ids of the node's
	// launch_workload commands for the attempt whose payload carries
	// sealed handles.
	LaunchCommands(ctx context.Context, nodeID, runID, attemptID string) ([]string, error)
	// Commands answers a node's commands, oldest first, optionally only
	// those in one state, at most limit of them (0: no limit). An unknown
	// node answers an empty list (callers check the node first).
	Commands(ctx context.Context, nodeID string, state CommandState, limit int) ([]Command, error)
	// CommandHistory answers a node's commands newest first, optionally
	// only those in one state, only those issued before a key (a page's
	// last), at most limit of them (> 0).
	CommandHistory(ctx context.Context, nodeID string, state CommandState, before *CommandKey, limit int) ([]Command, error)
	// HasDue reports whether any command is due for d (a plain read: no
	// write lock is taken to find out there is nothing to do).
	HasDue(ctx context.Context, d Due) (bool, error)
	// AppliedOperationIDs answers the ids of commands the node applied,
	// oldest first; none answers an empty (non-nil) list.
	AppliedOperationIDs(ctx context.Context, nodeID string) ([]string, error)
	// Audit answers a node's changes, newest first, only those with an id
	// below before (0: from the newest), at most limit (0: no limit); none
	// answers an empty list.
	Audit(ctx context.Context, nodeID string, before int64, limit int) ([]AuditEntry, error)
	// RecentAudit answers the latest changes across the fleet, newest first,
	// at most limit (0: no limit).
	RecentAudit(ctx context.Context, limit int) ([]AuditEntry, error)
	// DueWork is HasDue for a poll, with the node's configuration: whether
	// a command is due, and how a due configuration bears on the poll
	// (DECISIONS.md §32), in one read.
	DueWork(ctx context.Context, d Due) (DueWork, error)
	// NodeConfig answers the node's configuration row, or ErrNoRows.
	NodeConfig(ctx context.Context, nodeID string) (NodeConfig, error)
	// NodesAtRest answers, by id ascending, up to limit nodes that are not
	// retired with an id above after ("": from the first), each with
	// whether a poll at its current fencing token would find it quiet
	// (DueWork.quiet: no pending command, no configuration to deliver), in
	// one read. It fills this replica's memos in pages (warm.go).
	NodesAtRest(ctx context.Context, after string, limit int) ([]NodeAtRest, error)
	// LaggingConfigs answers lagging configurations of nodes not retired,
	// by node id descending, with a node id below before ("" : any), at
	// most limit.
	LaggingConfigs(ctx context.Context, before string, limit int) ([]NodeConfig, error)
	// CountConfigs counts lagging configurations of nodes not retired,
	// and desired configurations of nodes not retired that never got a
	// report.
	CountConfigs(ctx context.Context) (lagging, neverReported int64, err error)
	// CountNodesByState answers how many nodes are in each state; a state
	// with no node is absent from the map.
	CountNodesByState(ctx context.Context) (map[State]int64, error)
}

// Tx is the write half of the store, inside one transaction.
type Tx interface {
	Reader
	// LockNode answers the node, locked against concurrent change until
	// the transaction ends, or ErrNoRows.
	LockNode(ctx context.Context, id string) (Node, error)
	// LockNodes answers the nodes of ids that exist, by id, locked in id
	// order in one statement (the order every multi-node lock takes).
	LockNodes(ctx context.Context, ids []string) (map[string]Node, error)
	// NodesOfRental answers every generation of a rental, locked, lowest
	// generation first; an unknown rental answers an empty list.
	NodesOfRental(ctx context.Context, rentalID string) ([]Node, error)
	// InsertNode adds a node; ErrDuplicate when the id or the (rental,
	// generation) exists.
	InsertNode(ctx context.Context, n Node) error
	// UpdateNode writes every mutable field of n (a cleared field is
	// cleared). A node that does not exist is not an error and nothing is
	// written: callers update only a node they locked.
	UpdateNode(ctx context.Context, n Node) error

	// InsertInvitation adds an invitation; ErrDuplicate when its id exists.
	InsertInvitation(ctx context.Context, inv Invitation) error
	// Invitation answers the invitation locked until the transaction ends,
	// or ErrNoRows.
	Invitation(ctx context.Context, id string) (Invitation, error)
	// OutstandingInvitations answers the node's outstanding invitations,
	// locked, newest first; none answers an empty list.
	OutstandingInvitations(ctx context.Context, nodeID string) ([]Invitation, error)
	// SetInvitationState moves an invitation from one state to another; it
	// answers false when the invitation was not in state from (a concurrent
	// redemption won) or does not exist. Moving to redeemed stamps at.
	SetInvitationState(ctx context.Context, id string, from, to InvitationState, at time.Time) (bool, error)
	// RedeemInvitation locks the node and, in the same step, redeems the
	// invitation id if it is this node's, carries this token digest and is
	// still outstanding (stamping at). It answers the node (ErrNoRows when
	// there is none) and whether it redeemed: of two concurrent redemptions
	// only one answers true. The node is locked before the invitation, as
	// everywhere else.
	RedeemInvitation(ctx context.Context, nodeID, invitationID, tokenDigest string, at time.Time) (Node, bool, error)

	// RecordEventIDs stores event ids for a node and answers which of them
	// were new: an id recorded before is no conflict, only absent from the
	// answer.
	RecordEventIDs(ctx context.Context, nodeID string, ids []string, at time.Time) (map[string]bool, error)
	// UpsertWorkload keeps the newer of the stored and the given
	// observation (for equal times, the later state of created, running,
	// exited); an attempt never seen is inserted.
	UpsertWorkload(ctx context.Context, w Workload) error
	// InsertWorkloadOutput stores an attempt's output unless output for
	// (node, run, attempt) is stored already, in which case it changes
	// nothing; it answers whether it stored o.
	InsertWorkloadOutput(ctx context.Context, o WorkloadOutput) (bool, error)

	// IssueToNode locks the node against enrollment and retirement (not
	// against lease renewals and the lease sweep, nor other submits) and,
	// only when it is
	// ready, inserts c at the node's fencing token (c.FencingToken is
	// ignored), and then notifies the node's long-poll (NotifyCommands,
	// on every replica once the transaction commits): one statement where
	// the dialect allows. It answers the node as locked and whether c was
	// inserted; ErrNoRows when the node does not exist, ErrDuplicate when
	// c's operation id exists.
	//
	// A c marked delivered (DeliveryCount 1, DeliveredFencing: handed to a
	// poll held at that token as it is recorded) is inserted so, its
	// operation running with its event and announcement as a claim's first
	// delivery leaves it, only if the node has that fencing token under
	// the lock; otherwise it is inserted pending. The node answered tells
	// which.
	IssueToNode(ctx context.Context, c Command) (Node, bool, error)
	// InsertCommand adds a command; ErrDuplicate when its operation id
	// exists.
	InsertCommand(ctx context.Context, c Command) error
	// InsertCommands adds many commands in multi-row statements;
	// ErrDuplicate when an operation id is taken. A command inserted
	// delivered (DeliveryCount 1: handed to a held poll as it is
	// recorded) has its operation marked running, with its event and
	// announcement, as ClaimDue marks a first delivery.
	InsertCommands(ctx context.Context, cs []Command) error
	// LockCommand answers the command locked, or ErrNoRows.
	LockCommand(ctx context.Context, operationID string) (Command, error)
	// UpdateCommand writes every mutable field of c. A command that does
	// not exist is not an error and nothing is written: callers update only
	// a command they locked.
	UpdateCommand(ctx context.Context, c Command) error
	// LockCommands answers the commands of ids that exist, by operation
	// id, each locked until the transaction ends (locked in operation id
	// order, so two settlements of overlapping commands cannot deadlock).
	LockCommands(ctx context.Context, ids []string) (map[string]Command, error)
	// SettleCommands writes the settlement (state, failure, settled time)
	// of commands the transaction locked, and ends each one's operation as
	// UpdateCommand does: one statement for all of them where the store
	// can.
	// It answers whether the node of cs (one node) has a pending command
	// besides them, as seen by the settlement (false for none given).
	SettleCommands(ctx context.Context, cs []Command) (bool, error)
	// SettlePending is LockCommands and SettleCommands for settlements
	// decided without reading their commands: it locks the commands of ss
	// that exist (in operation id order), settles at at those of them
	// still pending on nodeID as ss says, ending each one's operation as
	// SettleCommands does, and leaves the others as they are; one
	// statement where the store can. ss's ids are distinct. It answers,
	// for each of ss whose command exists, the command as found before
	// (SettleFound, in no particular order), and whether nodeID has a
	// pending command besides ss's, as SettleCommands does (meaningless
	// when none was settled).
	SettlePending(ctx context.Context, nodeID string, at time.Time, ss []Settlement) ([]SettleFound, bool, error)
	// WithdrawCommand cancels a pending command never delivered to any
	// session and answers true; a command delivered at least once, settled,
	// or absent is left as it is and answers false.
	WithdrawCommand(ctx context.Context, operationID string, at time.Time) (bool, error)
	// ClaimDue marks the due commands delivered to d.Fencing at d.Now and
	// answers them, oldest first, at most d.Limit; nothing due answers an
	// empty list. On a shared database two claims never take the same
	// command. It also answers what DueWork would have before the claim
	// (Commands: something was claimed), so a poll that expects commands
	// may claim without reading first.
	ClaimDue(ctx context.Context, d Due) (DueWork, []Command, error)

	// LockNodeConfig answers the node's configuration row locked, or
	// ErrNoRows.
	LockNodeConfig(ctx context.Context, nodeID string) (NodeConfig, error)
	// LockNodeConfigHead is LockNodeConfig without the document: Box is
	// nil (KeyID and the rest as stored), for writes that do not need it.
	LockNodeConfigHead(ctx context.Context, nodeID string) (NodeConfig, error)
	// LockNodeConfigs answers the configuration rows of the nodes of ids
	// that have one, by node id, locked in node id order.
	LockNodeConfigs(ctx context.Context, ids []string) (map[string]NodeConfig, error)
	// SaveNodeConfig writes every field of c, inserting the row if absent.
	SaveNodeConfig(ctx context.Context, c NodeConfig) error
	// SaveNodeConfigs is SaveNodeConfig for many nodes (each at most once)
	// in one statement.
	SaveNodeConfigs(ctx context.Context, cs []NodeConfig) error
	// SaveConfigDocuments stores shared documents (new ids) for the
	// configuration rows about to name them; every read that answers a
	// row's document fills its Shared.Box. A stored document is deleted
	// by retention once no row names it.
	SaveConfigDocuments(ctx context.Context, docs []SharedDocument) error
	// SaveConfigReport writes a report into the node's existing
	// configuration row (LockNodeConfig found it): the last report, the
	// applied revision, settled and lagging, and nothing of the desired
	// configuration, which a report never changes (its sealed document,
	// up to 256 KiB, is not written again). With end, it also ends the
	// node's open node.configure operations as EndConfigureOperations
	// does, and answers how many.
	SaveConfigReport(ctx context.Context, c NodeConfig, end *ConfigEnd) (int, error)
	// MarkConfigDelivered records that revision was delivered to fencing
	// at at (revision 0 forgets the delivery: due again at once).
	MarkConfigDelivered(ctx context.Context, nodeID string, fencing, revision int64, at time.Time) error
	// EndConfigureOperations ends the node's open node.configure
	// operations other than except as end says, each with its event and
	// announcement, and answers how many it ended.
	EndConfigureOperations(ctx context.Context, nodeID, except string, end ConfigEnd) (int, error)
	// EndConfigureOperationsOf is EndConfigureOperations for the nodes
	// ends names, each ending as its entry says, their open operations
	// found in one statement; none of except ends.
	EndConfigureOperationsOf(ctx context.Context, ends map[string]ConfigEnd, except []string) (int, error)

	// AppendAudit adds an audit entry (the store numbers it). It is written
	// with the commit: reads inside the transaction do not see it.
	AppendAudit(ctx context.Context, e AuditEntry) error
	// Notify tells every replica, once this transaction commits, that
	// something about the node changed (see Notifier).
	Notify(ctx context.Context, n Notification) error
}

// Settlement is a node's result for one command, decided before the
// command is read (Tx.SettlePending): the state it settles in (applied or
// refused) with its failure, if the command is still pending.
type Settlement struct {
	OperationID    string
	State          CommandState
	FailureCode    string
	FailureMessage string
	// Duplicate: the node said it had applied the command before (its
	// operation's result records it).
	Duplicate bool
}

// SettleFound is a command Tx.SettlePending was asked to settle, as it
// found it: its node and kind, and its state and failure code before the
// settlement. Settled says the settlement wrote it.
type SettleFound struct {
	OperationID string
	NodeID      string
	Kind        string
	State       CommandState
	FailureCode string
	Settled     bool
}

// ReplicaBeat is a replica's start and latest heartbeat, as it stored
// them (its own clock).
type ReplicaBeat struct {
	ID                     string
	StartedAt, HeartbeatAt time.Time
}

// LiveSession is one long-poll held now.
type LiveSession struct {
	NodeID     string    `json:"node_id"`
	Replica    string    `json:"replica"`
	Since      time.Time `json:"since"`
	RemoteAddr string    `json:"remote_addr"`
}

// TxRoute says, before a transaction runs, which rows it will lock, so a
// store that runs several transactions at once can keep them from waiting
// on each other (models/group.go runs one lane per share of the nodes).
// A transaction routed to a node locks rows of that node only (the node,
// its commands, operations, configuration, invitations) and, besides,
// at most the one lock Shared names; one routed to an operation (a
// fan-out's parent, which targets no node) locks that operation's row and
// the rows of nodes that share its lane only. A store may run a routed
// transaction again, alone, if it strays (the run it strayed in is rolled
// back first). A transaction with no route may lock anything.
type TxRoute struct {
	// Node is the one node whose rows the transaction locks.
	Node string
	// Operation, when Node is empty, is the one operation of no node
	// whose row the transaction locks.
	Operation string
	// Shared is the key of a lock that transactions of other nodes take
	// too (a package host's quota: "principal:…"), or "".
	Shared string
	// Bulk, with Operation, is a transaction that writes much — a
	// fan-out's children, up to 10,000 rows each carrying the operation's
	// document — and locks nothing but that operation. It runs on a
	// connection of its own, beside the write lanes rather than in one,
	// so it holds back neither its lane's other writes nor, once the
	// exclusive lane waits for it, every lane's.
	Bulk bool
	// Background is a write that may wait behind the others queued in its
	// lane: one of the burst a fleet-wide operation sets off on every
	// node (a configuration's delivery, its report), which would
	// otherwise queue every other write of the fleet behind thousands of
	// its own. It takes a small share of each batch, so every batch stays
	// short, and keeps it while it waits.
	Background bool
	// Finishing, with Background, is a background write that ends what
	// another handed out (a configuration's report, after its
	// delivery): it goes ahead of the background writes still queued,
	// so a wave's nodes finish as they are reached, and the progress an
	// operator watches moves through the wave rather than all at its
	// end. It cannot starve them: each is set off by one of them.
	Finishing bool
}

// Key is what the route's lane is chosen by: the node, else the
// operation.
func (r TxRoute) Key() string {
	if r.Node != "" {
		return r.Node
	}
	return "operation:" + r.Operation
}

type txRouteKey struct{}

// WithTxRoute answers ctx carrying r for the Store.Tx it is passed to.
func WithTxRoute(ctx context.Context, r TxRoute) context.Context {
	return context.WithValue(ctx, txRouteKey{}, r)
}

// OnNode is WithTxRoute for a transaction that locks one node's rows.
func OnNode(ctx context.Context, nodeID string) context.Context {
	return WithTxRoute(ctx, TxRoute{Node: nodeID})
}

// OnOperation is WithTxRoute for a transaction that locks one operation
// of no node (a fan-out's parent).
func OnOperation(ctx context.Context, operationID string) context.Context {
	return WithTxRoute(ctx, TxRoute{Operation: operationID})
}

// OnNodeBackground is OnNode for a background write (TxRoute.Background).
func OnNodeBackground(ctx context.Context, nodeID string) context.Context {
	return WithTxRoute(ctx, TxRoute{Node: nodeID, Background: true})
}

// OnNodeFinishing is OnNodeBackground for a background write that ends
// what another handed out (TxRoute.Finishing).
func OnNodeFinishing(ctx context.Context, nodeID string) context.Context {
	return WithTxRoute(ctx, TxRoute{Node: nodeID, Background: true, Finishing: true})
}

// OnOperationBulk is OnOperation for a bulk transaction (TxRoute.Bulk).
func OnOperationBulk(ctx context.Context, operationID string) context.Context {
	return WithTxRoute(ctx, TxRoute{Operation: operationID, Bulk: true})
}

// TxRouteOf answers the route ctx carries, if any.
func TxRouteOf(ctx context.Context) (TxRoute, bool) {
	r, ok := ctx.Value(txRouteKey{}).(TxRoute)
	return r, ok && (r.Node != "" || r.Operation != "")
}
