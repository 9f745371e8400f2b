package ledger

import (
	"context"
	"encoding/json"
	"slices"
	"sort"

	"github.com/nodeward/nodeward/fleet"
)

// Families (DECISIONS.md §12).
const (
	FamilyNodes       = "nodes"
	FamilyCommands    = "commands"
	FamilyFleet       = "fleet"
	FamilyNodeConfig  = "nodeconfig"
	FamilyDiagnose    = "diagnose"
	FamilyCredentials = "credentials"
)

// Families lists every family, in the order DECISIONS.md §12 gives them.
var Families = []string{FamilyNodes, FamilyCommands, FamilyFleet, FamilyNodeConfig, FamilyDiagnose, FamilyCredentials}

// Draft is a submission on its way into the ledger: what a preparer sees
// and may refine before anything is recorded.
type Draft struct {
	Principal Principal
	Kind      *Kind
	Targets   []Target
	// Operation is the canonical request body.
	Operation json.RawMessage
}

// Kind is one served kind of operation and how it is carried out.
type Kind struct {
	Name   string
	Family string
	// TargetKinds are the target kinds its operations are indexed under
	// (Operation.TargetKind; submit refuses another); nil: any. With the
	// family they let a listing's family, kind and target_kind filters
	// read exact ranges of the (kind, target kind) index
	// (Registry.Narrow): family and target kind have no index of their
	// own to write per operation.
	TargetKinds []string
	// Capability is the agent capability a node needs to run it ("" for
	// kinds the control plane runs).
	Capability string
	// LevelTriggered kinds may be run again after a crash: restart
	// recovery re-runs them instead of failing them `interrupted`. So
	// are kinds that run in one transaction (RunTx: nothing of them
	// survives a crash) and fan-outs (their children are idempotent);
	// RerunOnRecovery answers all three.
	LevelTriggered bool
	// AdminOnly kinds are refused to package hosts whatever their grants.
	AdminOnly bool
	// QuotaExempt kinds are not counted nor refused by the per-node quota
	// (node.retire must always be possible).
	QuotaExempt bool

	// Prepare validates and refines a draft inside the submitting call;
	// its refusal records nothing. Required.
	Prepare func(ctx context.Context, d *Draft) error
	// RunTx carries the operation out inside the transaction that ends it,
	// so its effect and its end commit together (and a crash in between
	// leaves nothing to undo: recovery runs it again). Its error rolls the
	// effect back and ends the operation failed.
	RunTx func(ctx context.Context, tx Tx, op Operation) (json.RawMessage, error)
	// Run carries the operation out outside any transaction (work that
	// waits on the world); the dispatcher records its answer after.
	Run func(ctx context.Context, op Operation) (json.RawMessage, error)
	// Record hands the operation to a node: it writes, in the submitting
	// transaction, what the node will be sent (DECISIONS.md §34). Such an
	// operation is on channel long_poll, never passes through the
	// dispatcher, and ends with the node's answer.
	// It answers what it recorded, handed back to the submitter as
	// Operation.Recorded.
	Record func(ctx context.Context, tx Tx, op Operation) (any, error)
	// RecordMany, when set, does Record for many released operations of
	// the kind at once (a fan-out's release) in a few statements, their
	// targets distinct. admit runs under the locks that serialise the
	// targets, with the indexes that passed the kind's own checks
	// (capability included), and may refuse more. It answers, per
	// operation, the refusal that left it unrecorded (nil: recorded);
	// nothing is written for a refused one. An operation its record ended
	// or made running at once is replaced in ops by how it stands after.
	RecordMany func(ctx context.Context, tx Tx, ops []Operation, admit func(ok []int) (map[int]error, error)) ([]error, error)
	// RecordedTogether: a fan-out records this kind's children that fit
	// its slots together right after it commits, lane by lane
	// (recordReleased), rather than releasing them from its advance.
	// RecordMany must be set. Record writes a fleet command under the
	// operation's id, whose presence tells a recorded child from one a
	// recording cut short left behind (Tx.Unrecorded, recordTx) — unless
	// HeldUntilRecorded.
	RecordedTogether bool
	// RecordsOperationOnce: RecordMany writes what children carrying one
	// operation need of it once a call, not once a child (node.configure:
	// one sealed document, fleet.SharedDocument; the command kinds: one
	// stored payload), so a recording
	// transaction's bound on bytes counts that operation once
	// (recordChunks) and recordSharedChildren bounds its children.
	RecordsOperationOnce bool
	// HeldUntilRecorded, for a kind recorded together whose record leaves
	// no row of its own under the operation's id (node.configure): its
	// children are inserted held even when they fit the slots, and the
	// recording releases each in the transaction that records it. Held
	// is what tells them apart: a node's configuration report, delivery
	// and next revision end or run its open configures that are not held,
	// so an unheld child not yet recorded would have been ended
	// succeeded by a report of the node's older revision. A recording cut
	// short leaves them held, for the parent's advance to release.
	HeldUntilRecorded bool
	// PrepareIssue, for a kind whose Record issues one command
	// (fleet.IssueTx), builds that command before the submitting
	// transaction: the submit then tells the store what its transaction
	// will write (Store.TxIssuing), and Record issues exactly it.
	PrepareIssue func(op Operation) (*fleet.PreparedIssue, error)
	// FanOut ends the operation's own work by recording one child per
	// target (see fanout.go); it runs in the claiming transaction, so a
	// crash before it committed leaves nothing recorded.
	FanOut func(ctx context.Context, tx Tx, op Operation) (Plan, error)
	// ChildKinds, for a fan-out kind, names every kind its plans' children
	// may be (a plan naming another fails). When all of them record their
	// operation once (RecordsOperationOnce), an advance releases its held
	// children in batches bounded by their count, not by the parent's
	// operation's bytes (advanceBatch); when all are recorded together
	// (RecordedTogether), their write lanes release them
	// (releasedByLane). Nil: any served kind, bounded by bytes and
	// released in the exclusive lane.
	ChildKinds []string
	// Summarize, for a fan-out kind, starts a fold of what its children
	// found, kept as `summary` in the parent's result when the last child
	// ended (optional). Children are fed a page at a time, never all at
	// once (a fan-out may have 10,000, each with a result).
	Summarize func() Summarizer
	// Reveals names the secrets the kind generates (fields of the
	// submit answer's reveals, DECISIONS.md §16); Reveal produces one
	// from the succeeded operation's result, never from storage.
	Reveals []string
	Reveal  func(ctx context.Context, op Operation, field string) (string, error)
}

// The target kinds of the served kinds: a fan-out over one node is
// indexed as that node, over several or a selector as the fleet.
var (
	nodeTarget        = []string{TargetNode}
	fanOutTargets     = []string{TargetNode, TargetFleet}
	packageHostTarget = []string{TargetPackageHost}
	endpointTarget    = []string{TargetEndpoint}
)

// Summarizer folds a fan-out's children into its summary.
type Summarizer interface {
	Add(child Operation)
	Summary() any
}

// Registry maps kind names to kinds. A kind it does not hold is not served.
type Registry struct {
	kinds  map[string]*Kind
	exempt []string // names of QuotaExempt kinds, kept as kinds register
}

// NewRegistry returns a registry of kinds.
func NewRegistry(kinds ...*Kind) *Registry {
	r := &Registry{kinds: map[string]*Kind{}}
	for _, k := range kinds {
		r.Register(k)
	}
	return r
}

// Register adds a kind; registering a name twice, or a kind without a
// preparer or a way to run, is a programming error.
func (r *Registry) Register(k *Kind) {
	if _, dup := r.kinds[k.Name]; dup {
		panic("ledger: kind registered twice: " + k.Name)
	}
	ways := 0
	for _, set := range []bool{k.RunTx != nil, k.Run != nil, k.Record != nil, k.FanOut != nil} {
		if set {
			ways++
		}
	}
	if k.Prepare == nil || ways != 1 {
		panic("ledger: kind " + k.Name + " needs Prepare and exactly one of RunTx, Run, Record, FanOut")
	}
	r.kinds[k.Name] = k
	if k.QuotaExempt {
		r.exempt = append(r.exempt, k.Name)
	}
}

// QuotaExempt answers the names of the kinds the per-node quota neither
// counts nor refuses.
func (r *Registry) QuotaExempt() []string { return r.exempt }

// Kind answers the served kind of that name.
func (r *Registry) Kind(name string) (*Kind, bool) {
	k, ok := r.kinds[name]
	return k, ok
}

// Kinds answers every served kind, by name.
func (r *Registry) Kinds() []*Kind {
	out := make([]*Kind, 0, len(r.kinds))
	for _, k := range r.kinds {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Narrow answers f with Kinds set to the (kind, target kind) pairs its
// Family, Kind and TargetKind leave possible among the served kinds, by
// kind name (none: nothing can match, an unknown family, kind or target
// kind among them); f unchanged when it names none of the three.
func (r *Registry) Narrow(f Filter) Filter {
	if f.Family == "" && f.Kind == "" && f.TargetKind == "" {
		return f
	}
	pairs := []KindTarget{}
	for _, k := range r.Kinds() {
		if (f.Family != "" && k.Family != f.Family) || (f.Kind != "" && k.Name != f.Kind) {
			continue
		}
		switch {
		case f.TargetKind != "":
			if k.IndexedAs(f.TargetKind) {
				pairs = append(pairs, KindTarget{Kind: k.Name, TargetKind: f.TargetKind})
			}
		case k.TargetKinds == nil:
			pairs = append(pairs, KindTarget{Kind: k.Name})
		default:
			for _, tk := range k.TargetKinds {
				pairs = append(pairs, KindTarget{Kind: k.Name, TargetKind: tk})
			}
		}
	}
	f.Kinds = pairs
	return f
}

// RerunOnRecovery answers whether restart recovery runs an operation of
// the kind again, rather than failing it interrupted: what the
// capabilities listing calls level_triggered.
func (k *Kind) RerunOnRecovery() bool {
	return k.LevelTriggered || k.RunTx != nil || k.FanOut != nil
}

// IndexedAs answers whether the kind's operations may be indexed under
// target kind tk.
func (k *Kind) IndexedAs(tk string) bool {
	return k.TargetKinds == nil || slices.Contains(k.TargetKinds, tk)
}

// ServedKinds are the kinds this product serves, carried out through f.
// The wiring adds CredentialKinds (through the auth service) and
// ConfigKinds (through the secrets service too).
func ServedKinds(f *fleet.Service) []*Kind {
	kinds := NodeKinds(f)
	kinds = append(kinds, CommandKindsOf(f)...)
	kinds = append(kinds, DiagnoseKinds(f)...)
	return append(kinds, FleetKinds()...)
}
