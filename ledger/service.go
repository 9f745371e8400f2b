package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/dbtime"
	"github.com/nodeward/nodeward/metrics"
	"github.com/nodeward/nodeward/secrets"
)

// Errors returned by the service.
var (
	ErrNotFound        = errcode.New(errcode.NotFound, "no such operation")
	ErrRequestConflict = errcode.New(errcode.RequestConflict, "this request_id was already used with a different request")
	ErrDraining        = errcode.New(errcode.Draining, "the server is shutting down")
)

// Operation error codes recorded by the ledger itself.
const (
	CodeInterrupted = "interrupted"
	CodeTimedOut    = "timed_out"
	CodeInternal    = "internal"
)

// Settings are the ledger's tunables; zero values take the defaults.
type Settings struct {
	Workers           int           // local operations run at once per replica; default 16
	Deadline          time.Duration // default 10 min
	MaxWait           time.Duration // longest a submit may wait; default 60 s
	PackageHostQuota  int           // open operations per package host; default 256
	NodeQuota         int           // open operations per target node; default 32
	OwnerLease        time.Duration // a replica's claim on what it runs; default 15 s
	FallbackPoll      time.Duration // dispatcher and waiters re-check while notifications may be missed; default 2 s
	OperationsKeptFor time.Duration // default 90 days
	EventsKeptFor     time.Duration // default 7 days
	PruneInterval     time.Duration // default 1 h
	PruneBatch        int           // rows per prune statement; default 1000
	// Recheck is how often waiters, watches and the dispatcher read
	// again while notifications flow, when other replicas share the
	// store: a replica announces operations that started, ended or may
	// be claimed after its commit, and one that dies between the two
	// never does; default 10 s.
	Recheck time.Duration
	// AdvanceInterval is the shortest time between two advances of one
	// fan-out parent on a replica, unless its ends make one urgent
	// (advance.go); default DefaultAdvanceInterval.
	AdvanceInterval time.Duration
	// ReleasePerAdvance bounds the held children one advance releases in
	// its transaction (a parent with more held and slots free is advanced
	// again at once), and the children a fan-out's recording writes in one
	// transaction (recordReleased). Releasing a node kind's child takes that node's quota
	// lock (an advisory lock on Postgres, kept to the transaction's end),
	// and Postgres's lock table holds max_locks_per_transaction (64) times
	// max_connections entries for all sessions together: a fleet.configure
	// of 10,000 nodes released in one transaction ran out of it ("out of
	// shared memory") and never advanced. Default 500.
	ReleasePerAdvance int
	// SingleProcess is true when no other replica can share the store
	// (SQLite): everything left running at start is a dead process's.
	SingleProcess bool
}

func (s *Settings) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if s.Workers <= 0 {
		s.Workers = 16
	}
	def(&s.Deadline, 10*time.Minute)
	def(&s.MaxWait, 60*time.Second)
	if s.PackageHostQuota <= 0 {
		s.PackageHostQuota = 256
	}
	if s.NodeQuota <= 0 {
		s.NodeQuota = 32
	}
	def(&s.OwnerLease, 15*time.Second)
	def(&s.FallbackPoll, 2*time.Second)
	def(&s.Recheck, 10*time.Second)
	def(&s.OperationsKeptFor, 90*24*time.Hour)
	def(&s.EventsKeptFor, 7*24*time.Hour)
	def(&s.PruneInterval, time.Hour)
	def(&s.AdvanceInterval, DefaultAdvanceInterval)
	if s.PruneBatch <= 0 {
		s.PruneBatch = 1000
	}
	if s.ReleasePerAdvance <= 0 {
		s.ReleasePerAdvance = 500
	}
}

// Options builds a Service.
type Options struct {
	Store    Store
	Kinds    *Registry
	Settings Settings
	// Replica names this process as the owner of what it runs.
	Replica string
	// Predecessors, when set, is a prefix of Replica that names this
	// replica (the server's replica id and "/"): owners whose names start
	// with it are earlier processes of this replica, stopped, since two
	// running replicas never share a name. At start their leases are
	// dropped, so what they left running is recovered at once rather than
	// after their owner lease ran out.
	Predecessors string
	Now          func() time.Time
	Logger       *slog.Logger
	Metrics      *metrics.Metrics
	// CrossReplica is true when other replicas may share the store: the
	// dispatcher and waiters poll as a fallback until the notification
	// listener reports healthy.
	CrossReplica bool
	// CheckPrincipal, when set, runs inside every submitting transaction
	// before the operation is recorded; its error refuses the submission.
	// The server sets it to refuse a package host whose token was revoked
	// or replaced after the request authenticated, so nothing is recorded
	// for a token once its revocation has returned.
	CheckPrincipal func(ctx context.Context, tx Tx, p Principal) error
	// Secrets, when set, resolves the sealed handles an operation carries
	// inside its submitting transaction.
	Secrets *secrets.Service
	// RequireCapability, when set, refuses (capability_missing) work of a
	// kind whose Capability the target node's agent does not report
	// (DECISIONS.md §45). The server sets it to the fleet's check, which
	// reads the per-node cache; a node that never reported facts passes.
	RequireCapability func(ctx context.Context, nodeID, capability string) error
}

// Service is the ledger.
type Service struct {
	store    Store
	kinds    *Registry
	settings Settings
	replica  string
	// predecessors: Options.Predecessors.
	predecessors string
	now          func() time.Time
	log          *slog.Logger
	metrics      *metrics.Metrics

	tookOver sync.Once // TakeOver

	wake chan struct{} // the dispatcher's: something may be claimable
	adv  *advancer     // fan-out parents whose children ended
	ends chan End      // runs that ended, for the finisher to record

	mu      sync.Mutex // guards the following
	waiters map[string]map[chan struct{}]struct{}
	running map[string]context.CancelFunc
	// recording are the fan-outs whose commands this replica is recording
	// now (executeFanOut): advance leaves their recording alone.
	recording map[string]struct{}
	// recordSlots bounds the fan-out recordings in flight, which hold no
	// dispatcher slot (executeFanOut): recordingsPerWorker per worker.
	recordSlots chan struct{}
	// unstarted counts claims in flight and claimed runs not yet in
	// running; while it is not zero, changes heard for operations not
	// running here are kept in heard, so a run that registers after its
	// cancel was heard (the claim had committed, the run not started)
	// re-reads its operation and cancels itself. heard is emptied when
	// unstarted returns to zero; past maxHeard ids it keeps none and
	// heardAll makes every run starting meanwhile re-read its operation.
	unstarted    int
	heard        map[string]struct{}
	heardAll     bool
	draining     bool
	drained      chan struct{} // closed on Drain
	notifyHealth bool
	crossReplica bool

	checkPrincipal func(ctx context.Context, tx Tx, p Principal) error
	secrets        *secrets.Service

	requireCapability func(ctx context.Context, nodeID, capability string) error
}

// New returns the ledger. Call Run to start its dispatcher.
func New(o Options) *Service {
	o.Settings.defaults()
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Metrics == nil {
		o.Metrics = metrics.New(nil)
	}
	if o.Kinds == nil {
		o.Kinds = NewRegistry()
	}
	return &Service{
		store: o.Store, kinds: o.Kinds, settings: o.Settings, replica: o.Replica, predecessors: o.Predecessors,
		now: o.Now, log: o.Logger, metrics: o.Metrics,
		wake:         make(chan struct{}, 1),
		adv:          newAdvancer(),
		ends:         make(chan End, 1024),
		waiters:      map[string]map[chan struct{}]struct{}{},
		running:      map[string]context.CancelFunc{},
		recording:    map[string]struct{}{},
		recordSlots:  make(chan struct{}, recordingsPerWorker*o.Settings.Workers),
		heard:        map[string]struct{}{},
		drained:      make(chan struct{}),
		notifyHealth: !o.CrossReplica,
		crossReplica: o.CrossReplica,

		checkPrincipal: o.CheckPrincipal,
		secrets:        o.Secrets,

		requireCapability: o.RequireCapability,
	}
}

// Settings answers the effective settings.
func (s *Service) Settings() Settings { return s.settings }

// Kinds answers the registry of served kinds.
func (s *Service) Kinds() *Registry { return s.kinds }

func (s *Service) clock() time.Time { return dbtime.Norm(s.now()) }

// Submission is a request to record an operation.
type Submission struct {
	// OperationID is the caller's own id for the operation (the command
	// wrapper's operation_id); empty mints a UUID. Ids are globally
	// unique: one taken by another request is operation_conflict.
	OperationID string
	RequestID   string
	Kind        string
	Targets     []Target
	// Operation is the kind's request body (a JSON object).
	Operation json.RawMessage
	Reason    string
	// Wait holds the answer until the operation ends or Wait passes.
	Wait time.Duration
	// InlineSecrets asks for the generated secrets' values in the answer
	// of the submit that records the operation, when it waited for the
	// operation to succeed (spending their reveal handles; DECISIONS.md
	// §37). A replay never shows them.
	InlineSecrets bool
}

// Submit records an operation, or answers the one recorded for the same
// request (created false). A replay answers whatever quotas, preparers and
// the target's state say now (DECISIONS.md §13): its lookup comes before
// them for a submission with secrets, and after any refusal otherwise.
// Errors:
// validation_failed, ErrRequestConflict, kind_not_served,
// permission_denied, quota_exceeded, and any preparer refusal.
func (s *Service) Submit(ctx context.Context, p Principal, sub Submission) (Operation, bool, error) {
	var v errcode.Validation
	v.Check(ValidRequestID(sub.RequestID), "request_id", "required: 1-128 characters of letters, digits, '.', '_', ':' or '-'")
	v.Check(sub.Kind != "", "kind", "required")
	v.Check(sub.Wait >= 0 && sub.Wait <= s.settings.MaxWait, "wait_timeout_ms", "0 to %d", s.settings.MaxWait.Milliseconds())
	v.Check(len(sub.Reason) <= 1024, "reason", "at most 1024 bytes")
	if sub.OperationID != "" {
		v.Check(ValidRequestID(sub.OperationID), "operation_id", "1-128 characters of letters, digits, '.', '_', ':' or '-'")
	}
	for i, t := range sub.Targets {
		v.Check(t.Kind != "", "targets/"+itoa(i)+"/kind", "required")
		// Every target names its object but the fleet, which is one.
		if t.Kind == TargetFleet {
			v.Check(t.ID == "", "targets/"+itoa(i)+"/id", "not with the fleet target")
		} else {
			v.Check(t.ID != "", "targets/"+itoa(i)+"/id", "required")
		}
	}
	if len(sub.Operation) == 0 {
		sub.Operation = json.RawMessage("{}")
	}
	canon, err := Canonical(sub.Operation)
	v.Check(err == nil && len(canon) > 0 && canon[0] == '{', "operation", "must be a JSON object")
	if err := v.Err(); err != nil {
		return Operation{}, false, err
	}
	if sub.Targets == nil {
		sub.Targets = []Target{}
	}
	digest, err := digestCanonical(sub.Kind, sub.Targets, canon)
	if err != nil {
		return Operation{}, false, err
	}
	kind, ok := s.kinds.Kind(sub.Kind)
	// A submission that carries sealed handles or mints reveals looks its
	// replay up first, so a replay never reaches the secrets (nor their
	// audit). Any other goes straight to recording: a replay is refused
	// there (its request id is taken, or a check before the insert
	// refuses) and looked up then, which spares every first submit a
	// round trip.
	lookedUp := !ok || len(kind.Reveals) > 0 || (s.secrets != nil && secrets.Carries(canon))
	if lookedUp {
		if op, err := s.replay(ctx, p, sub, digest); err == nil || !errors.Is(err, ErrNoRows) {
			return s.waitAnswer(ctx, p, op, false, sub, err)
		}
	}
	op, err := s.record(ctx, p, sub, kind, canon, digest)
	if err == nil {
		s.metrics.OperationsSubmitted.WithLabelValues(op.Kind).Inc()
		return s.waitAnswer(ctx, p, op, true, sub, nil)
	}
	if errors.Is(err, ErrDuplicate) || !lookedUp {
		// A replay, or a concurrent submit of the same request that won
		// the insert; or the caller's operation id belongs to another
		// request; or (not looked up yet) a refusal of a new request.
		replayed, rerr := s.replay(ctx, p, sub, digest)
		switch {
		case rerr == nil || errors.Is(rerr, ErrRequestConflict):
			return s.waitAnswer(ctx, p, replayed, false, sub, rerr)
		case !errors.Is(err, ErrDuplicate):
			// No such request (or the lookup failed): the refusal stands.
		case errors.Is(rerr, ErrNoRows):
			return Operation{}, false, errcode.Errorf(errcode.OperationConflict, "operation id %q is taken by another request", op.ID)
		default:
			return Operation{}, false, rerr
		}
	}
	s.refusedSecrets(ctx, err)
	return Operation{}, false, err
}

// record records a new operation for the submission, or refuses it:
// kind_not_served (kind nil), permission_denied, a preparer's or the
// capability check's refusal, quota_exceeded, ErrDuplicate (a taken
// request or operation id), or what the kind's Record refuses. A refusal
// past the preparer still answers the operation it meant to record (for
// its id).
func (s *Service) record(ctx context.Context, p Principal, sub Submission, kind *Kind, canon json.RawMessage, digest string) (Operation, error) {
	if kind == nil {
		return Operation{}, errcode.Errorf(errcode.KindNotServed, "kind %q is not served", sub.Kind)
	}
	if !p.May(kind.Family) || (kind.AdminOnly && p.Kind != PrincipalAdmin) {
		return Operation{}, errcode.Errorf(errcode.PermissionDenied, "not granted family %q", kind.Family)
	}
	d := &Draft{Principal: p, Kind: kind, Targets: sub.Targets, Operation: canon}
	if err := kind.Prepare(ctx, d); err != nil {
		return Operation{}, underOperation(err, kind)
	}
	if err := s.checkCapability(ctx, kind, d.Targets); err != nil {
		return Operation{}, err
	}

	now := s.clock()
	id := sub.OperationID
	if id == "" {
		id = NewID()
	}
	channel := ChannelLocal
	if kind.Record != nil {
		channel = ChannelLongPoll
	}
	op := Operation{
		ID: id, RequestID: sub.RequestID, Digest: digest,
		PrincipalKind: p.Kind, PrincipalID: p.ID, PrincipalName: p.Name, PackageHostGeneration: p.Generation,
		Family: kind.Family, Kind: kind.Name, State: StatePending, Channel: channel,
		Targets: d.Targets, Operation: d.Operation, Reason: sub.Reason,
		CreatedAt: now, Deadline: now.Add(s.settings.Deadline), UpdatedAt: now,
	}
	op.TargetKind, op.TargetID = indexTarget(d.Targets)
	if !kind.IndexedAs(op.TargetKind) {
		// A listing by kind reads only its declared target kinds: an
		// undeclared one would be recorded and never listed.
		return Operation{}, fmt.Errorf("ledger: kind %s: target kind %q is not among its TargetKinds", kind.Name, op.TargetKind)
	}
	submitted := Event{OperationID: op.ID, Type: EventSubmitted, At: now,
		Data: mustJSON(submittedData{p.Key(), op.RequestID})}
	if p.Kind == PrincipalAdmin && kind.Record == nil && !nodeQuotaApplies(kind, op) && !s.carriesSecrets(op) && len(kind.Reveals) == 0 {
		// Nothing to check or write beside it: one atomic write records
		// and announces it (the common case costs one statement).
		err := s.store.Insert(ctx, &op, submitted)
		return op, err
	}
	var ahead *IssueAhead
	if kind.PrepareIssue != nil && p.Kind == PrincipalAdmin && !s.carriesSecrets(op) && len(kind.Reveals) == 0 {
		// An administrator's command: nothing is read or written before
		// the operation and its command (no package quota, no handles, no
		// reveals), so the store is told ahead what the transaction
		// writes, and Record issues the command prepared here.
		prepared, err := kind.PrepareIssue(op)
		if err != nil {
			return op, underOperation(err, kind)
		}
		ctx = fleet.WithPreparedIssue(ctx, prepared)
		ahead = &IssueAhead{Op: &op, Events: []Event{submitted}, Command: prepared.Command,
			Counted: nodeQuotaApplies(kind, op), Exempt: s.kinds.QuotaExempt()}
	}
	record := func(tx Tx) error {
		if s.checkPrincipal != nil {
			if err := s.checkPrincipal(ctx, tx, p); err != nil {
				return err
			}
		}
		if err := s.checkQuotas(ctx, tx, p, kind, op); err != nil {
			return err
		}
		if err := s.resolveSecrets(ctx, tx, p, kind, op); err != nil {
			return err
		}
		if err := tx.InsertOperation(ctx, &op, submitted); err != nil {
			return err
		}
		var err error
		if op.Reveals, err = s.mintReveals(ctx, tx, p, kind, op); err != nil {
			return err
		}
		if kind.Record != nil {
			if nodeQuotaApplies(kind, op) {
				tx.ExpectNodeCount(op.TargetID, op.ID, s.kinds.QuotaExempt())
			}
			// The node's long-poll is woken by what Record writes;
			// nothing here waits on the operation yet.
			recorded, err := kind.Record(ctx, tx, op)
			if err != nil {
				return underOperation(err, kind)
			}
			op, recorded = asRecorded(op, recorded)
			op.Recorded = recorded
			return s.checkNodeQuota(ctx, tx, kind, op, true)
		}
		return tx.NotifyDispatch(ctx, op.ID)
	}
	var err error
	if ahead != nil {
		err = s.store.TxIssuing(nodeRoute(ctx, op), *ahead, record)
	} else {
		err = s.store.Tx(nodeRoute(ctx, op), record)
	}
	return op, err
}

// asRecorded answers op as its kind's Record left it, and what Record
// recorded: ended at once (an unchanged configuration already applied),
// running at once (already delivered; a command recorded delivered to the
// node's held long-poll, fleet.Service.IssueTx),
// or as it was.
func asRecorded(op Operation, recorded any) (Operation, any) {
	switch r := recorded.(type) {
	case changedAtRecord:
		return r.op, r.recorded
	case acceptedAtRecord:
		at := r.at
		op.State, op.AcceptedAt, op.UpdatedAt = StateRunning, &at, at
		return op, r.recorded
	}
	return op, recorded
}

// nodeRoute routes a transaction on op's one target node — recording it
// (a command, a configuration, an invitation), or running a node kind's
// RunTx — to that node's write lane (fleet.TxRoute): it locks that node's
// rows and, for a package host, its own row and quota key (Shared), which
// lanes take in one order. One that then locks another lane's node (an
// invitation retiring the rental's older generation) strays and runs again
// alone in the exclusive lane. Anything else runs unrouted, in the
// exclusive lane, which holds every other lane back while it runs.
func nodeRoute(ctx context.Context, op Operation) context.Context {
	if op.TargetKind != TargetNode || op.TargetID == "" {
		return ctx
	}
	r := fleet.TxRoute{Node: op.TargetID}
	if op.PrincipalKind == PrincipalPackageHost {
		r.Shared = "principal:" + Principal{Kind: op.PrincipalKind, ID: op.PrincipalID}.Key()
	}
	return fleet.WithTxRoute(ctx, r)
}

// checkCapability refuses a kind that needs an agent capability for node
// targets that do not report it (capability_missing, nothing recorded). It
// is generic: every kind naming a Capability gets it.
func (s *Service) checkCapability(ctx context.Context, kind *Kind, targets []Target) error {
	if kind.Capability == "" || s.requireCapability == nil {
		return nil
	}
	for _, t := range targets {
		if t.Kind != TargetNode || t.ID == "" {
			continue
		}
		if err := s.requireCapability(ctx, t.ID, kind.Capability); err != nil {
			return err
		}
	}
	return nil
}

// replay answers the operation recorded for sub's request, or
// ErrRequestConflict when that request asked for something else: another
// body, or (a wrapper's caller-chosen id, which the digest leaves out)
// another operation id.
func (s *Service) replay(ctx context.Context, p Principal, sub Submission, digest string) (Operation, error) {
	op, err := s.store.OperationByRequest(ctx, p, sub.RequestID)
	if err != nil {
		return Operation{}, err
	}
	if op.Digest != digest || (sub.OperationID != "" && sub.OperationID != op.ID) {
		return Operation{}, ErrRequestConflict
	}
	return op, nil
}

func (s *Service) waitAnswer(ctx context.Context, p Principal, op Operation, created bool, sub Submission, err error) (Operation, bool, error) {
	if err != nil {
		return op, created, err
	}
	if sub.Wait > 0 && !op.Terminal() {
		reveals := op.Reveals
		if op, err = s.Wait(ctx, op.ID, sub.Wait); err != nil {
			return op, created, err
		}
		op.Reveals = reveals
	}
	op, err = s.withReveals(ctx, p, op, sub.InlineSecrets && sub.Wait > 0 && created)
	return op, created, err
}

// checkQuotas refuses a submission past the open-operation quotas
// (DECISIONS.md §38): per package host (top-level operations), and per
// target node for everyone but quota-exempt kinds. What it locks
// serialises concurrent submissions, so a quota is never overrun.
func (s *Service) checkQuotas(ctx context.Context, tx Tx, p Principal, k *Kind, op Operation) error {
	if p.Kind == PrincipalPackageHost {
		if err := tx.LockKey(ctx, "principal:"+p.Key()); err != nil {
			return err
		}
		n, err := tx.CountOpenForPrincipal(ctx, p)
		if err != nil {
			return err
		}
		if n >= s.settings.PackageHostQuota {
			return errcode.Errorf(errcode.QuotaExceeded, "this package host has %d operations not yet ended (at most %d)", n, s.settings.PackageHostQuota)
		}
	}
	if k.Record == nil {
		return s.checkNodeQuota(ctx, tx, k, op, false)
	}
	return nil
}

// nodeQuotaApplies reports whether op counts against its target node's
// quota.
func nodeQuotaApplies(k *Kind, op Operation) bool {
	return op.TargetKind == TargetNode && op.TargetID != "" && !k.QuotaExempt
}

// checkNodeQuota refuses an operation past its target node's quota. A kind
// that records a command counts after recording it (recorded true); the
// store's count serialises the counts of one node's quota (on Postgres it
// takes the lock LockKey("node:"+id) takes), so the submissions to a node
// are counted one after the other.
func (s *Service) checkNodeQuota(ctx context.Context, tx Tx, k *Kind, op Operation, recorded bool) error {
	nodeID := op.TargetID
	if !nodeQuotaApplies(k, op) {
		return nil
	}
	if !recorded {
		if err := tx.LockKey(ctx, "node:"+nodeID); err != nil {
			return err
		}
	}
	n, err := tx.CountOpenForNode(ctx, nodeID, s.kinds.QuotaExempt())
	if err != nil {
		return err
	}
	if recorded {
		n-- // this operation is counted already
	}
	return s.overNodeQuota(nodeID, n)
}

// overNodeQuota refuses an operation whose node has n others open.
func (s *Service) overNodeQuota(nodeID string, n int) error {
	if n >= s.settings.NodeQuota {
		return errcode.Errorf(errcode.QuotaExceeded, "node %s has %d operations not yet ended (at most %d)", nodeID, n, s.settings.NodeQuota)
	}
	return nil
}

// indexTarget answers the target a listing filters on: the single target,
// or the fleet for many.
func indexTarget(ts []Target) (string, string) {
	switch len(ts) {
	case 0:
		return "", ""
	case 1:
		return ts[0].Kind, ts[0].ID
	}
	return TargetFleet, ""
}

// Get answers an operation the principal may read: administrators read
// every operation, package hosts their own. Errors: ErrNotFound.
func (s *Service) Get(ctx context.Context, p Principal, id string) (Operation, error) {
	op, err := s.store.Operation(ctx, id)
	if errors.Is(err, ErrNoRows) || (err == nil && !readable(p, op)) {
		return Operation{}, ErrNotFound
	}
	return op, err
}

// readable: a package host reads its own operations only; to it, others'
// do not exist.
func readable(p Principal, op Operation) bool {
	return p.Kind == PrincipalAdmin || (op.PrincipalKind == p.Kind && op.PrincipalID == p.ID)
}

// List answers operations newest first; a package host sees only its own,
// whatever it asks (DECISIONS.md §39).
func (s *Service) List(ctx context.Context, p Principal, f Filter) ([]Operation, error) {
	if p.Kind != PrincipalAdmin {
		f.PrincipalKind, f.PrincipalID = p.Kind, p.ID
	}
	return s.store.List(ctx, s.kinds.Narrow(f))
}

// Summarize answers the overview's counts: by state, open operations
// created within recent and operations that ended within recent; and
// operations that ended failed within failures.
func (s *Service) Summarize(ctx context.Context, recent, failures time.Duration) (Summary, error) {
	now := s.clock()
	sum, err := s.store.Summarize(ctx, now.Add(-recent), now.Add(-failures))
	sum.RecentSince, sum.FailedSince = now.Add(-recent), now.Add(-failures)
	return sum, err
}

// Events answers an operation's events after a cursor. Errors: ErrNotFound.
func (s *Service) Events(ctx context.Context, p Principal, id string, after int64, limit int) ([]Event, error) {
	if _, err := s.Get(ctx, p, id); err != nil {
		return nil, err
	}
	return s.store.Events(ctx, id, after, limit)
}

// NodeEvents answers the latest events of operations that targeted the
// node, newest first (the operations' half of the node's timeline;
// DECISIONS.md §41). Administrators only: a package host sees its own
// operations through the listing.
func (s *Service) NodeEvents(ctx context.Context, nodeID string, limit int) ([]NodeEvent, error) {
	return s.store.NodeEvents(ctx, nodeID, limit)
}

// Cancel asks an operation to stop, with a reason: a pending one ends
// cancelled at once; a running one has its run's context cancelled (on
// whichever replica runs it) and ends when its executor returns. Cancelling
// an ended operation answers it unchanged. Errors: ErrNotFound,
// validation_failed.
func (s *Service) Cancel(ctx context.Context, p Principal, id, reason string) (Operation, error) {
	var v errcode.Validation
	v.Check(len(reason) <= 1024, "reason", "at most 1024 bytes")
	if err := v.Err(); err != nil {
		return Operation{}, err
	}
	now := s.clock()
	var out Operation
	err := s.store.Tx(ctx, func(tx Tx) error {
		op, err := tx.LockOperation(ctx, id)
		if errors.Is(err, ErrNoRows) || (err == nil && !readable(p, op)) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		out, err = s.cancelTx(ctx, tx, op, reason, now)
		return err
	})
	return out, err
}

func (s *Service) cancelTx(ctx context.Context, tx Tx, op Operation, reason string, now time.Time) (Operation, error) {
	if op.Terminal() || op.CancelRequestedAt != nil {
		return op, nil
	}
	op.CancelRequestedAt, op.CancelReason = &now, reason
	// A configure's operation ends at once, delivered (running) or not;
	// its configuration stays desired.
	withdrawn := op.State == StatePending || op.Kind == KindNodeConfigure
	if op.Channel == ChannelLongPoll && op.Kind != KindNodeConfigure {
		// A node's command is withdrawn only while undelivered; once
		// delivered, its operation ends with the node's answer. (A
		// configure's operation ends at once; its configuration stays.)
		var err error
		if withdrawn, err = tx.Fleet().WithdrawCommand(ctx, op.ID, now); err != nil {
			return op, err
		}
	}
	if op.Held {
		withdrawn = true // nothing was handed out yet
	}
	if withdrawn {
		return s.endTx(ctx, tx, op, StateCancelled, nil, &Error{Code: "cancelled", Message: cancelMessage(reason)}, now)
	}
	if op.Counts != nil {
		// A fan-out parent: its children are cancelled; it ends once they
		// have.
		op.UpdatedAt = now
		if err := tx.UpdateOperation(ctx, op); err != nil {
			return op, err
		}
		if err := tx.AppendEvents(ctx, Event{OperationID: op.ID, Type: EventCancelRequested, At: now,
			Data: mustJSON(map[string]any{"reason": reason})}); err != nil {
			return op, err
		}
		return op, s.cancelChildren(ctx, tx, op, reason)
	}
	op.UpdatedAt = now
	if err := tx.UpdateOperation(ctx, op); err != nil {
		return op, err
	}
	if err := tx.AppendEvents(ctx, Event{OperationID: op.ID, Type: EventCancelRequested, At: now,
		Data: mustJSON(map[string]any{"reason": reason})}); err != nil {
		return op, err
	}
	return op, tx.Notify(ctx, op.ID)
}

func cancelMessage(reason string) string {
	if reason == "" {
		return "cancelled"
	}
	return "cancelled: " + reason
}

// endTx moves op to a terminal state inside tx, with its result or error,
// and records the event. An operation already ended is answered unchanged.
func (s *Service) endTx(ctx context.Context, tx Tx, op Operation, to State, result json.RawMessage, opErr *Error, now time.Time) (Operation, error) {
	op, result, opErr, err := s.scrubEnd(ctx, tx, op, result, opErr)
	if err != nil {
		return op, err
	}
	ended, err := endOperationTx(ctx, tx, op, to, result, opErr, now)
	if err == nil && ended.State == to && op.State != to {
		s.metrics.OperationsEnded.WithLabelValues(op.Kind, string(to)).Inc()
	}
	return ended, err
}

// endOperationTx is endTx for callers without the service (kinds).
func endOperationTx(ctx context.Context, tx Tx, op Operation, to State, result json.RawMessage, opErr *Error, now time.Time) (Operation, error) {
	if !CanTransition(op.State, to) {
		return op, nil
	}
	from := op.State
	op.State, op.Result, op.Error = to, result, opErr
	op.FinishedAt, op.UpdatedAt = &now, now
	if err := tx.UpdateOperation(ctx, op); err != nil {
		return op, err
	}
	data := map[string]any{"from": from}
	if opErr != nil {
		data["error"] = opErr
	}
	if err := tx.AppendEvents(ctx, Event{OperationID: op.ID, Type: string(to), At: now, Data: mustJSON(data)}); err != nil {
		return op, err
	}
	if op.ParentID != "" {
		if err := tx.NotifyParent(ctx, op.ParentID); err != nil {
			return op, err
		}
	}
	return op, tx.Notify(ctx, op.ID)
}

// Wait answers the operation once it has ended, or as it stands when wait
// passes, ctx ends, or the server drains. Errors: ErrNotFound.
func (s *Service) Wait(ctx context.Context, id string, wait time.Duration) (Operation, error) {
	ch := s.subscribe(id)
	defer s.unsubscribe(id, ch)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		op, err := s.store.Operation(ctx, id)
		if errors.Is(err, ErrNoRows) {
			return Operation{}, ErrNotFound
		}
		if err != nil || op.Terminal() {
			return op, err
		}
		select {
		case <-ctx.Done():
			return op, nil
		case <-timer.C:
			return op, nil
		case <-s.drained:
			return op, nil
		case <-s.recheck():
		case <-ch:
		}
	}
}

// recheck answers when a waiter or the dispatcher reads again unless told
// sooner: FallbackPoll while notifications may be missed, Recheck while
// they flow from other replicas, never for a lone replica (nil).
func (s *Service) recheck() <-chan time.Time {
	switch {
	case !s.notifierOK():
		return time.After(s.settings.FallbackPoll)
	case s.crossReplica:
		return time.After(s.settings.Recheck)
	}
	return nil
}

// Watch calls fn with the operation's events as they are recorded, from
// the cursor after on, until the operation has ended and every event was
// handed over, fn fails, ctx ends, or the server drains (ErrDraining).
// Errors: ErrNotFound.
func (s *Service) Watch(ctx context.Context, p Principal, id string, after int64, fn func(Event) error) error {
	if _, err := s.Get(ctx, p, id); err != nil {
		return err
	}
	ch := s.subscribe(id)
	defer s.unsubscribe(id, ch)
	for {
		// Read the state before the events: an operation seen ended has
		// all its events recorded, so the read below sees the last.
		op, err := s.store.Operation(ctx, id)
		if err != nil {
			return err
		}
		for {
			evs, err := s.store.Events(ctx, id, after, 500)
			if err != nil {
				return err
			}
			for _, e := range evs {
				if err := fn(e); err != nil {
					return err
				}
				after = e.Cursor
			}
			if len(evs) < 500 {
				break
			}
		}
		if op.Terminal() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.drained:
			return ErrDraining
		case <-s.recheck():
		case <-ch:
		}
	}
}

func (s *Service) subscribe(id string) chan struct{} {
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waiters[id] == nil {
		s.waiters[id] = map[chan struct{}]struct{}{}
	}
	s.waiters[id][ch] = struct{}{}
	return ch
}

func (s *Service) unsubscribe(id string, ch chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.waiters[id], ch)
	if len(s.waiters[id]) == 0 {
		delete(s.waiters, id)
	}
}

// Changed tells this replica that an operation changed (after a commit
// here, or heard from another replica): its waiters and watchers re-read
// it, and a run here whose cancel was asked for is cancelled.
func (s *Service) Changed(ctx context.Context, id string) {
	s.mu.Lock()
	s.wakeWaitersLocked(id)
	_, runsHere := s.running[id]
	if !runsHere && s.unstarted > 0 && !s.heardAll {
		if len(s.heard) < maxHeard {
			s.heard[id] = struct{}{}
		} else {
			s.heardAll = true
			clear(s.heard)
		}
	}
	s.mu.Unlock()
	if runsHere {
		s.checkCancel(ctx, id)
	}
}

// Dispatchable tells this replica that an operation may be claimed: the
// dispatcher looks for work (and its waiters re-read it).
func (s *Service) Dispatchable(id string) {
	s.mu.Lock()
	s.wakeWaitersLocked(id)
	s.mu.Unlock()
	s.kick()
}

func (s *Service) wakeWaitersLocked(id string) {
	for ch := range s.waiters[id] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Resync tells this replica that notifications may have been missed:
// every waiter re-reads and the dispatcher looks for work.
func (s *Service) Resync() {
	s.mu.Lock()
	for _, set := range s.waiters {
		for ch := range set {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
	s.mu.Unlock()
	s.kick()
}

// SetNotifierHealthy records whether cross-replica notifications flow.
func (s *Service) SetNotifierHealthy(ok bool) {
	s.mu.Lock()
	s.notifyHealth = ok
	s.mu.Unlock()
}

func (s *Service) notifierOK() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.notifyHealth
}

// Drain answers every waiting submit and watch at once (DECISIONS.md §36).
func (s *Service) Drain() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.draining {
		s.draining = true
		close(s.drained)
	}
}

func (s *Service) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// submittedData is the submitted event's data: a struct, not a map, on
// the submit path; its members in name order, as a map would write them.
type submittedData struct {
	Principal string `json:"principal"`
	RequestID string `json:"request_id"`
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// NewID mints a ledger id (operations, request ids the server chooses): a
// version 7 UUID, whose leading timestamp places ids minted together side by
// side in every index keyed by them — operations.id, commands, operation
// events, request ids — so a batch of inserts writes a few index pages
// instead of one page per row, as random (version 4) ids did.
func NewID() string { return uuid.Must(uuid.NewV7()).String() }

func itoa(i int) string {
	return string(mustJSON(i))
}

// underOperation answers err with the fields a kind's own checks name
// placed in the submission's body, "operation/…", so every field a submit
// refuses is a path into what was sent. A command kind's operation is the
// command's payload: its "payload/…" fields are "operation/…".
func underOperation(err error, kind *Kind) error {
	var e *errcode.Error
	if !errors.As(err, &e) || len(e.Fields) == 0 {
		return err
	}
	_, command := CommandKinds[kind.Name]
	out := *e
	out.Fields = make([]errcode.FieldError, len(e.Fields))
	for i, f := range e.Fields {
		switch {
		case pathUnder(f.Field, "operation") || pathUnder(f.Field, "targets"):
		case command && pathUnder(f.Field, "payload"):
			f.Field = "operation" + strings.TrimPrefix(f.Field, "payload")
		default:
			f.Field = "operation/" + f.Field
		}
		out.Fields[i] = f
	}
	if old := e.Fields[0].Field + ": "; strings.HasPrefix(e.Message, old) {
		out.Message = out.Fields[0].Field + ": " + strings.TrimPrefix(e.Message, old)
	}
	return &out
}

// pathUnder reports whether field is root or a path below it.
func pathUnder(field, root string) bool {
	return field == root || strings.HasPrefix(field, root+"/")
}
