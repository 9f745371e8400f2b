package ledger

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/secrets"
)

// Desired configuration kinds (family nodeconfig, DECISIONS.md §32). Like
// command kinds they hold no executor slot: node.configure writes the
// node's desired configuration in the submitting transaction (Record) and
// is pending on channel long_poll until its revision is first delivered
// to the node, then running (the store marks it in the statement that
// records the delivery, as for commands) until the node's report for its
// revision ends it — in the transaction that records the report — or a
// later revision supersedes it, its deadline passes, or the node is
// retired. Cancelling one ends the operation; the configuration stays
// desired (it is state, not a queued command).
const (
	KindNodeConfigure  = "node.configure"
	KindFleetConfigure = "fleet.configure"
)

// Codes a configure operation ends with.
const (
	CodeSuperseded   = "superseded"
	CodeConfigFailed = "config_failed"
)

// ConfigureOperation is node.configure's operation. Document is any JSON
// value; JSON null clears the configuration. Sealed handles may stand for
// string values inside the document (field /document/…).
type ConfigureOperation struct {
	Format   string          `json:"format"`
	Document json.RawMessage `json:"document"`
	Force    *bool           `json:"force,omitempty"`
}

// FleetConfigureOperation is fleet.configure's operation: one document
// fanned out like fleet.command (node targets, or the fleet target with a
// selector).
type FleetConfigureOperation struct {
	Format         string          `json:"format"`
	Document       json.RawMessage `json:"document"`
	Force          *bool           `json:"force,omitempty"`
	Selector       *Selector       `json:"selector,omitempty"`
	MaxConcurrency *int            `json:"max_concurrency,omitempty"`
}

// ConfigureResult is what a configure operation that succeeded records.
type ConfigureResult struct {
	Revision int64  `json:"revision"`
	Hash     string `json:"hash"`
	State    string `json:"state"`
}

// checkConfigure validates format, document and force (their fields named
// under operation/).
func checkConfigure(v *errcode.Validation, format string, document json.RawMessage, raw json.RawMessage) {
	fleet.ValidateConfigFormat(v, "operation/format", format)
	if document == nil {
		v.Add("operation/document", "required: a JSON document, or null to clear the configuration")
	} else if doc, err := fleet.CanonicalDocument(document); err != nil || len(doc) > fleet.MaxConfigDocumentBytes {
		v.Add("operation/document", "at most 256 KiB of JSON")
	}
	// force: null is refused like any other non-boolean.
	var probe struct {
		Force json.RawMessage `json:"force"`
	}
	if json.Unmarshal(raw, &probe) == nil && probe.Force != nil && !isBool(probe.Force) {
		v.Add("operation/force", "a boolean")
	}
}

func isBool(raw json.RawMessage) bool {
	t := string(bytes.TrimSpace(raw))
	return t == "true" || t == "false"
}

// decodeConfigure decodes an operation, answering a type error as 422
// naming the field (force: "yes", format: 5) rather than 400.
func decodeConfigure(raw json.RawMessage, out any) error {
	err := DecodeOperation(raw, out)
	if err == nil {
		return nil
	}
	var v errcode.Validation
	checkConfigure(&v, "x", json.RawMessage("null"), raw)
	if verr := v.Err(); verr != nil {
		return verr
	}
	msg := err.Error()
	for _, f := range []string{"format", "document", "selector", "max_concurrency"} {
		if strings.Contains(msg, "ConfigureOperation."+f) || strings.Contains(msg, `"`+f+`"`) {
			return validation("operation/"+f, "has the wrong type")
		}
	}
	return err
}

// sealedPointers answers the pointers of the handles under /document,
// relative to the document; a handle anywhere else is refused.
func sealedPointers(operation json.RawMessage) ([]string, error) {
	if !secrets.Carries(operation) {
		return nil, nil
	}
	all, err := secrets.Pointers(operation)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range all {
		if !strings.HasPrefix(p, "/document/") {
			return nil, validation("operation"+p, "a sealed value may stand only for a string inside the document")
		}
		out = append(out, strings.TrimPrefix(p, "/document"))
	}
	return out, nil
}

// ConfigKinds are the kinds of family nodeconfig, carried out through f;
// sec resolves sealed values inside documents (nil: none are served).
func ConfigKinds(f *fleet.Service, sec *secrets.Service) []*Kind {
	node := &Kind{
		Name: KindNodeConfigure, Family: FamilyNodeConfig, TargetKinds: nodeTarget, Capability: api.CapConfig, LevelTriggered: true,
		Prepare: func(ctx context.Context, d *Draft) error {
			var o ConfigureOperation
			if err := decodeConfigure(d.Operation, &o); err != nil {
				return err
			}
			var v errcode.Validation
			if len(d.Targets) != 1 || d.Targets[0].Kind != TargetNode || d.Targets[0].ID == "" {
				v.Add("targets", "exactly one target {kind: node, id}")
			}
			checkConfigure(&v, o.Format, o.Document, d.Operation)
			if err := v.Err(); err != nil {
				return err
			}
			_, err := sealedPointers(d.Operation)
			return err
		},
		Record: func(ctx context.Context, tx Tx, op Operation) (any, error) {
			return recordConfigure(ctx, f, sec, tx, op)
		},
		RecordMany: func(ctx context.Context, tx Tx, ops []Operation, admit func(ok []int) (map[int]error, error)) ([]error, error) {
			return recordConfigures(ctx, f, sec, tx, ops, admit)
		},
		// A fleet.configure's children are recorded lane by lane as it
		// fans out: released by its advances instead, each release of 500
		// locked nodes of every lane and so ran in the exclusive lane,
		// holding the fleet's other writes back for most of a wave
		// (BENCHMARKS.md, thirty-sixth sitting).
		RecordedTogether:     true,
		RecordsOperationOnce: true,
		HeldUntilRecorded:    true,
	}
	fleetKind := &Kind{
		Name: KindFleetConfigure, Family: FamilyNodeConfig, TargetKinds: fanOutTargets, ChildKinds: []string{KindNodeConfigure},
		Prepare: func(ctx context.Context, d *Draft) error {
			var o FleetConfigureOperation
			if err := decodeConfigure(d.Operation, &o); err != nil {
				return err
			}
			var v errcode.Validation
			checkConfigure(&v, o.Format, o.Document, d.Operation)
			mc := 0
			if o.MaxConcurrency != nil {
				mc = *o.MaxConcurrency
			}
			checkFanOutTargets(&v, d.Targets, o.Selector, mc)
			if err := v.Err(); err != nil {
				return err
			}
			_, err := sealedPointers(d.Operation)
			return err
		},
		FanOut: func(ctx context.Context, tx Tx, op Operation) (Plan, error) {
			var o FleetConfigureOperation
			if err := DecodeOperation(op.Operation, &o); err != nil {
				return Plan{}, err
			}
			child, err := json.Marshal(ConfigureOperation{Format: o.Format, Document: o.Document, Force: o.Force})
			if err != nil {
				return Plan{}, err
			}
			if child, err = Canonical(child); err != nil {
				return Plan{}, err
			}
			mc := 0
			if o.MaxConcurrency != nil {
				mc = *o.MaxConcurrency
			}
			return fanOutPlan(ctx, tx, op.Targets, o.Selector, mc, KindNodeConfigure, child)
		},
	}
	return []*Kind{node, fleetKind}
}

// recordConfigure writes the node's desired configuration for op: its
// sealed handles replaced by the values the submission (or its fan-out
// parent) resolved, which never reach the ledger. An unchanged document
// already applied ends op succeeded at once; one the node reported failed
// (and not forced again) ends it failed at once with the node's message;
// one submitted before the configure that set the node's current revision
// (a fan-out child released late) ends failed superseded at once.
func recordConfigure(ctx context.Context, f *fleet.Service, sec *secrets.Service, tx Tx, op Operation) (any, error) {
	in, err := configureOf(ctx, sec, tx, op, nil)
	if err != nil {
		return nil, err
	}
	out, err := f.ConfigureTx(ctx, tx.Fleet(), in)
	if err != nil {
		return nil, err
	}
	after, changed, err := configuredAtRecord(ctx, tx, f.Now(), op, out)
	if err != nil || !changed {
		return out, err
	}
	return changedAtRecord{op: after, recorded: out}, nil
}

// recordConfigures is recordConfigure for the children of a fan-out's
// release (Kind.RecordMany): every node's configuration in a few
// statements (fleet.ConfigureManyTx), each parent read once.
func recordConfigures(ctx context.Context, f *fleet.Service, sec *secrets.Service, tx Tx, ops []Operation,
	admit func(ok []int) (map[int]error, error)) ([]error, error) {
	reads := &configureReads{cursors: map[string]int64{}}
	ins := make([]fleet.Configure, len(ops))
	for i, op := range ops {
		in, err := configureOf(ctx, sec, tx, op, reads)
		if err != nil {
			return nil, err
		}
		ins[i] = in
	}
	outs, refused, err := f.ConfigureManyTx(ctx, tx.Fleet(), ins, admit)
	if err != nil {
		return nil, err
	}
	now := f.Now()
	for i, op := range ops {
		if refused[i] != nil {
			continue
		}
		if ops[i], _, err = configuredAtRecord(ctx, tx, now, op, outs[i]); err != nil {
			return nil, err
		}
	}
	return refused, nil
}

// configureReads is what configureOf reads once for many operations:
// each fan-out parent's cursor, and the configure asked by the last
// operation read. A fan-out's children carry one operation, whose
// document (up to 256 KiB) is decoded and has its sealed values resolved
// once, not once a node (BENCHMARKS.md, thirty-ninth sitting).
type configureReads struct {
	cursors map[string]int64
	// source and operation are what last was read from: the operation
	// that resolved the sealed values (a child's parent) and the child's
	// operation.
	source    string
	operation json.RawMessage
	last      fleet.Configure
}

// configureOf is what op asks of its node's configuration: the document
// with its sealed values, ordered where op (or its fan-out parent) was
// submitted. reads, when given, keeps what serves the next operations.
func configureOf(ctx context.Context, sec *secrets.Service, tx Tx, op Operation, reads *configureReads) (fleet.Configure, error) {
	// A child's sealed values were resolved by its parent's submission.
	source := op.ID
	if op.ParentID != "" {
		source = op.ParentID
	}
	var in fleet.Configure
	if reads != nil && reads.operation != nil && reads.source == source && bytes.Equal(reads.operation, op.Operation) {
		in = reads.last
	} else {
		var err error
		if in, err = configureAsked(ctx, sec, tx, source, op.Operation); err != nil {
			return fleet.Configure{}, err
		}
		if reads != nil {
			reads.source, reads.operation, reads.last = source, op.Operation, in
		}
	}
	// Configures of a node take effect in the order they were submitted: a
	// fan-out child stands where its parent was submitted.
	in.SubmittedCursor = op.Cursor
	if op.ParentID != "" {
		c, ok := int64(0), false
		if reads != nil {
			c, ok = reads.cursors[op.ParentID]
		}
		if !ok {
			parent, err := tx.Operation(ctx, op.ParentID)
			if err != nil {
				return fleet.Configure{}, err
			}
			c = parent.Cursor
			if reads != nil {
				reads.cursors[op.ParentID] = c
			}
		}
		in.SubmittedCursor = c
	}
	in.NodeID, in.OperationID = op.TargetID, op.ID
	return in, nil
}

// configureAsked decodes a configure operation, its sealed values
// resolved as source's submission resolved them.
func configureAsked(ctx context.Context, sec *secrets.Service, tx Tx, source string, operation json.RawMessage) (fleet.Configure, error) {
	var o ConfigureOperation
	if err := DecodeOperation(operation, &o); err != nil {
		return fleet.Configure{}, err
	}
	ptrs, err := sealedPointers(operation)
	if err != nil {
		return fleet.Configure{}, err
	}
	if len(ptrs) > 0 {
		if sec == nil {
			return fleet.Configure{}, errcode.New(errcode.PermissionDenied, "sealed values are not served here")
		}
		full, err := sec.TxDeliver(ctx, tx.Secrets(), source, "", operation)
		if err != nil {
			return fleet.Configure{}, err
		}
		if err := json.Unmarshal(full, &o); err != nil {
			return fleet.Configure{}, err
		}
	}
	return fleet.Configure{Format: o.Format, Document: o.Document, SealedPointers: ptrs, Force: o.Force != nil && *o.Force}, nil
}

// configuredAtRecord ends op, or makes it running, when its configure's
// outcome decides it at once, answering it as it stands after and
// whether it changed.
func configuredAtRecord(ctx context.Context, tx Tx, now time.Time, op Operation, out fleet.ConfigureOutcome) (Operation, bool, error) {
	switch {
	case out.Superseded:
		ended, err := endOperationTx(ctx, tx, op, StateFailed, nil, &Error{Code: CodeSuperseded, Message: out.Message}, now)
		return ended, true, err
	case out.Applied:
		ended, err := endOperationTx(ctx, tx, op, StateSucceeded,
			mustJSON(ConfigureResult{Revision: out.Revision, Hash: out.Hash, State: api.ConfigApplied}), nil, now)
		return ended, true, err
	case out.Failed:
		msg := out.Message
		if msg == "" {
			msg = "the node could not apply this configuration (no reason given); submit it with force: true to ask again"
		}
		ended, err := endOperationTx(ctx, tx, op, StateFailed, nil, &Error{Code: CodeConfigFailed, Message: msg}, now)
		return ended, true, err
	case out.Delivered:
		// The node has this revision already (delivered, not yet
		// reported): accepted by its channel at once.
		op.State, op.AcceptedAt, op.UpdatedAt = StateRunning, &now, now
		if err := tx.UpdateOperation(ctx, op); err != nil {
			return op, false, err
		}
		if err := tx.AppendEvents(ctx, Event{OperationID: op.ID, Type: EventRunning, At: now,
			Data: mustJSON(map[string]any{"channel": ChannelLongPoll})}); err != nil {
			return op, false, err
		}
		return op, true, tx.Notify(ctx, op.ID)
	}
	return op, false, nil
}

// changedAtRecord is what a Record answers when it ended its operation at
// once, or made it running: the submitter is answered the operation as it
// now stands.
type changedAtRecord struct {
	op       Operation
	recorded any
}

// EndConfigures ends open configure operations (the fleet's store calls it
// inside the transaction of the report, or of the configuration, that
// decides them) as end says.
func EndConfigures(ctx context.Context, tx Tx, ops []Operation, end fleet.ConfigEnd) error {
	var e *Error
	if end.Code != "" {
		e = &Error{Code: end.Code, Message: end.Message, Retryable: end.Retryable}
	}
	for _, op := range ops {
		if _, err := endOperationTx(ctx, tx, op, State(end.State), end.Result, e, end.At); err != nil {
			return err
		}
	}
	return nil
}
