package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/fleet"
)

// Fan-out: an executor may end its own work by recording one child
// operation per target. The parent then waits on its children, holding no
// executor slot (it is running with Counts set); at most MaxConcurrency
// children are handed out at once, the others are held until a slot frees.
// The parent ends when every child has: succeeded only if all did, failed
// `children_failed` otherwise, cancelled when it was cancelled. Cancelling
// a parent cancels its children.

// Child is one operation a fan-out records.
type Child struct {
	Kind      string
	Targets   []Target
	Operation json.RawMessage
}

// Plan is what a fan-out executor decided: its children and how many may
// run at once (0: all).
type Plan struct {
	Children       []Child
	MaxConcurrency int
}

// CountCapabilityMissing is the key under which Tx.ChildCounts answers how
// many children failed capability_missing (not a state of its own).
const CountCapabilityMissing State = "failed:capability_missing"

// CodeChildrenFailed ends a parent some of whose children did not succeed.
const CodeChildrenFailed = "children_failed"

// executeFanOut records a fan-out in three steps, so that the one step
// spanning many nodes never holds every write lane back:
//
//  1. one transaction records the plan's children and their events (no
//     node is locked) and leaves the parent running, counted, still
//     owned by this replica: its recording is under way;
//  2. the children that fit the max_concurrency slots and are recorded
//     together (Kind.RecordedTogether: the node commands, node.configure)
//     are recorded for their nodes in transactions routed to their write
//     lane (Store.WriteLane), each locking only its own lane's nodes and
//     children, at most ReleasePerAdvance of them, so the lanes commit
//     them beside their other work (recordReleased);
//  3. one transaction lets go of the parent (no owner): its children now
//     move it on as they end (advance).
//
// A replica that stops between 1 and 3 leaves its parent owned: the
// parent is recovered like any orphan and claimed again, and the new
// owner records what is still unrecorded (Tx.Unrecorded) — each child's
// command is recorded once, since every recorder locks the child and
// looks for its command first (recordTx); a configure child left held is
// released and recorded by the parent's advance, in one transaction. A
// failed step 2 is resumed by the parent's next advance on this replica.
//
// Only step 1 runs in the dispatcher's slot. Steps 2 and 3 are answered
// as record, for the dispatcher to run once it has freed the slot: they
// wait in write lanes, beside whatever the fleet is writing, and a slot
// held meanwhile is one the next fan-out cannot use — after a restart,
// while 10,000 agents reconnected, the 16 slots held by recordings kept
// the other fan-outs pending for seconds (BENCHMARKS.md, eighteenth
// sitting; the lanes were slow then for another reason, the nineteenth's).
// Recordings in flight are bounded apart (Service.recordSlots): when they
// are all taken, step 1 keeps its slot until one frees, so a replica
// claims no more fan-outs than it can record.
func (s *Service) executeFanOut(ctx, runCtx context.Context, kind *Kind, op Operation) (record func()) {
	// While it runs, this replica's advances leave the recording to it.
	s.setRecording(op.ID, true)
	recorded := func() { s.setRecording(op.ID, false) }
	defer func() {
		if record == nil {
			recorded()
		}
	}()
	var released []Operation
	recording, resuming := false, false
	// Routed to the parent: it locks the parent and inserts new rows only.
	route := fleet.OnOperation
	if mayWriteMuch(op) {
		route = fleet.OnOperationBulk
	}
	err := s.store.Tx(route(ctx, op.ID), func(tx Tx) error {
		released, recording, resuming = nil, false, false
		cur, err := tx.LockOperation(ctx, op.ID)
		if err != nil {
			return err
		}
		if cur.State != StateRunning || cur.Owner != s.replica {
			return nil
		}
		if cur.Counts != nil {
			// Claimed again after its owner stopped mid-recording.
			recording, resuming = true, true
			released, err = tx.Unrecorded(ctx, cur.ID, s.recordedTogether())
			return err
		}
		plan, err := kind.FanOut(runCtx, tx, cur)
		if err != nil {
			return err
		}
		now := s.clock()
		max := plan.MaxConcurrency
		if max <= 0 || max > len(plan.Children) {
			max = len(plan.Children)
		}
		// The children that fit the slots are inserted not held, with their
		// released event beside their submitted one: inserting them held and
		// releasing them a moment later rewrote each row (held is in the
		// claimable index's predicate, so no HOT update: a new entry in
		// every index of operations). Only kinds recorded together
		// (RecordedTogether: the node commands, node.configure) are
		// released here, and of those node.configure's stay held until
		// their recording (HeldUntilRecorded); the others keep the one
		// path they have, held until the advance. A parent already asked
		// to cancel releases nothing, as advance would not.
		releaseNow := cur.CancelRequestedAt == nil
		children := make([]Operation, len(plan.Children))
		events := make([]Event, len(plan.Children), len(plan.Children)+max)
		// A plan's children mostly carry one operation (one document for
		// every node): its canonical form is made once and shared.
		var lastOp, canon json.RawMessage
		var digests requestDigester
		for i, c := range plan.Children {
			ck, ok := s.kinds.Kind(c.Kind)
			if !ok {
				return fmt.Errorf("fan-out child kind %q is not served", c.Kind)
			}
			if kind.ChildKinds != nil && !slices.Contains(kind.ChildKinds, c.Kind) {
				return fmt.Errorf("fan-out %s: child kind %s is not among its ChildKinds", kind.Name, c.Kind)
			}
			if canon == nil || !sameBytes(c.Operation, lastOp) {
				if canon, err = Canonical(c.Operation); err != nil {
					return err
				}
				lastOp = c.Operation
			}
			digest, err := digests.digest(c.Kind, c.Targets, canon)
			if err != nil {
				return err
			}
			ch := Operation{
				ID: NewID(), RequestID: cur.ID + ":" + itoa(i), Digest: digest,
				PrincipalKind: cur.PrincipalKind, PrincipalID: cur.PrincipalID, PrincipalName: cur.PrincipalName,
				PackageHostGeneration: cur.PackageHostGeneration,
				Family:                ck.Family, Kind: ck.Name, State: StatePending, Channel: ChannelLocal,
				Targets: c.Targets, ParentID: cur.ID, Held: true, Operation: canon,
				CreatedAt: now, Deadline: cur.Deadline, UpdatedAt: now,
			}
			if ck.Record != nil {
				ch.Channel = ChannelLongPoll
			}
			ch.TargetKind, ch.TargetID = indexTarget(ch.Targets)
			if !ck.IndexedAs(ch.TargetKind) {
				return fmt.Errorf("fan-out child kind %s: target kind %q is not among its TargetKinds", ck.Name, ch.TargetKind)
			}
			if releaseNow && ck.RecordedTogether && len(released) < max {
				ch.Held = ck.HeldUntilRecorded
				released = append(released, ch)
			}
			children[i] = ch
			events[i] = Event{OperationID: ch.ID, Type: EventSubmitted, At: now, Data: mustJSON(map[string]any{"parent_id": cur.ID})}
		}
		// Each child's events in the order a later release writes them:
		// every submitted event, then the released ones.
		for _, ch := range released {
			if !ch.Held {
				events = append(events, Event{OperationID: ch.ID, Type: EventReleased, At: now, Data: json.RawMessage(`{}`)})
			}
		}
		// One multi-row insert for the children and one for their events,
		// not a statement per child.
		if err := tx.InsertOperations(ctx, children, events); err != nil {
			return err
		}
		counts := countsOf(map[State]int{StatePending: len(children)})
		cur.Counts = &counts
		cur.UpdatedAt = now
		cur.Result = mustJSON(map[string]any{"max_concurrency": max})
		recording = len(released) > 0
		if !recording {
			cur.Owner = ""
		}
		if err := tx.UpdateOperation(ctx, cur); err != nil {
			return err
		}
		if err := tx.AppendEvents(ctx, Event{OperationID: cur.ID, Type: EventFannedOut, At: now,
			Data: mustJSON(map[string]any{"children": len(children), "max_concurrency": max})}); err != nil {
			return err
		}
		if err := tx.Notify(ctx, cur.ID); err != nil {
			return err
		}
		if recording {
			return nil // the parent moves on once its commands are recorded
		}
		// The parent's progress (releasing held children, ending) runs as
		// for any child's end.
		return tx.NotifyParent(ctx, cur.ID)
	})
	switch {
	case err != nil && resuming:
		// Its children exist: the parent must not end for this. It stays
		// owned here, and its next advance resumes the recording.
		if ctx.Err() == nil {
			s.log.Error("ledger: resume a fan-out's recording; its next advance does", "operation_id", op.ID, "err", err)
		}
	case err != nil:
		s.finishRun(ctx, runCtx, op, nil, err)
	case recording:
		select {
		case s.recordSlots <- struct{}{}:
		case <-ctx.Done():
			// Stopping: the parent stays owned, recovered like any orphan.
			return nil
		}
		return func() {
			defer func() { <-s.recordSlots }()
			defer recorded()
			s.recordReleased(ctx, op.ID, released)
		}
	}
	return nil
}

// recordingsPerWorker sizes Service.recordSlots. A recording is mostly
// waiting for its lanes' commits, so several per worker keep the lanes'
// batches full; the bound keeps what they hold in memory (their released
// children) to a few times what the workers hold.
const recordingsPerWorker = 4

// recordingHere reports whether this replica is recording the fan-out's
// commands now.
func (s *Service) recordingHere(parentID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.recording[parentID]
	return ok
}

// recordedTogether answers the kinds recorded together (RecordedTogether)
// whose children are released before they are recorded: those a
// recording cut short leaves behind unheld (Tx.Unrecorded). A
// HeldUntilRecorded kind's are left held, for the advance.
func (s *Service) recordedTogether() []string {
	var out []string
	for _, k := range s.kinds.Kinds() {
		if k.RecordedTogether && !k.HeldUntilRecorded {
			out = append(out, k.Name)
		}
	}
	return out
}

// mayWriteMuch tells a fan-out whose first transaction may write much —
// over bulkChildren children, or bulkBytes of their operations — and so
// runs in bulk (fleet.TxRoute.Bulk), beside the write lanes rather than
// holding its parent's lane and, once the exclusive lane waits behind it,
// every lane. A selector's (the fleet target) may pick up to MaxFanOut.
// Smaller ones stay in the lane, sharing its batches' commits: in bulk,
// fan-outs of 100 at saturation doubled their children's
// issued_at→receipt p99 (BENCHMARKS.md, fortieth sitting).
func mayWriteMuch(op Operation) bool {
	children := len(op.Targets)
	if children == 1 && op.Targets[0].Kind == TargetFleet {
		children = MaxFanOut
	}
	return children > bulkChildren || children*len(op.Operation) > bulkBytes
}

const (
	bulkChildren = 1000
	bulkBytes    = 8 << 20
)

// recordReleased is step 2 and 3 of executeFanOut: the released
// children's commands, the write lanes at once, each lane's children in
// transactions of at most ReleasePerAdvance, one after another; then the
// parent let go. A lane that failed leaves the parent owned by this
// replica, for its next advance here to resume (advance).
//
// A lane's children are not recorded in one transaction: a
// fleet.configure of 10,000 nodes with a 4 KiB document wrote a lane's
// 2,500 in one of 5–7 s, and every delivery and report of the lane
// waited behind it — the first node was handed its configuration only
// once the last was recorded (BENCHMARKS.md, thirty-seventh sitting).
func (s *Service) recordReleased(ctx context.Context, parentID string, released []Operation) {
	byLane := map[int][]Operation{}
	var lanes []int
	for _, ch := range released {
		l := s.store.WriteLane(ch.TargetID)
		if byLane[l] == nil {
			lanes = append(lanes, l)
		}
		byLane[l] = append(byLane[l], ch)
	}
	once := false
	if len(released) > 0 {
		kind, ok := s.kinds.Kind(released[0].Kind)
		once = ok && kind.RecordsOperationOnce
	}
	errs := make([]error, len(lanes))
	var wg sync.WaitGroup
	for i, l := range lanes {
		chs := byLane[l]
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Routed by any node of the lane: every node it locks is of it.
			lctx := fleet.OnNode(ctx, chs[0].TargetID)
			perTx := s.settings.ReleasePerAdvance
			if once {
				perTx = min(perTx, recordSharedChildren)
			}
			for _, chunk := range recordChunks(chs, perTx, recordBytes, once) {
				if errs[i] = s.store.Tx(lctx, func(tx Tx) error { return s.recordTx(ctx, tx, chunk) }); errs[i] != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		if ctx.Err() == nil {
			s.log.Error("ledger: record a fan-out's commands; its next advance resumes", "operation_id", parentID, "err", err)
		}
		return
	}
	err := s.store.Tx(fleet.OnOperation(ctx, parentID), func(tx Tx) error {
		cur, err := tx.LockOperation(ctx, parentID)
		if err != nil {
			return err
		}
		if cur.Terminal() || cur.Counts == nil || cur.Owner != s.replica {
			return nil
		}
		cur.Owner, cur.UpdatedAt = "", s.clock()
		if err := tx.UpdateOperation(ctx, cur); err != nil {
			return err
		}
		return tx.NotifyParent(ctx, cur.ID)
	})
	if err != nil && ctx.Err() == nil {
		s.log.Error("ledger: let go of a recorded fan-out; its next advance does", "operation_id", parentID, "err", err)
	}
}

// recordBytes bounds the operations one recording transaction carries
// (one child alone may pass it), for kinds that write a copy a child:
// 500 children of a fleet.configure with a 250 KB document, each then
// sealed for its node, held the server's memory at gigabytes
// (BENCHMARKS.md, thirty-ninth sitting) — a node.configure's children
// now share one read, one decoding and one sealed copy of a run's
// document, and a fleet.command's one stored payload, which count once
// (Kind.RecordsOperationOnce). It also
// bounds how long the transaction holds its lane's batch, and every
// write queued behind it: at 8 MiB (33 such children) the lanes' batches
// ran about a second through the wave and a command submitted meanwhile
// waited 1.3 s at the median; at 1 MiB, 0.15 s, for a wave about a tenth
// longer (more commits; BENCHMARKS.md, fortieth sitting).
const recordBytes = 1 << 20

// recordSharedChildren bounds the children of a recording transaction
// whose kind records their one operation once, so bytes no longer bound
// them: 500 such a transaction (a fleet.configure of 10,000 nodes
// recorded in about 3 s) held their lanes' batches 300–370 ms each, and a
// command submitted in those seconds waited up to 0.7–1 s; at 128, 0.4 s,
// for a wave about a fifteenth longer (BENCHMARKS.md, forty-second
// sitting).
const recordSharedChildren = 128

// recordChunks splits chs into the ids of runs of at most maxChildren
// children and, past a run's first child, at most maxBytes of operations;
// once (Kind.RecordsOperationOnce) counts a child carrying the operation
// of the child before it in its run as nothing.
func recordChunks(chs []Operation, maxChildren, maxBytes int, once bool) [][]string {
	var out [][]string
	var cur []string
	size := 0
	for i, ch := range chs {
		n := len(ch.Operation)
		if once && len(cur) > 0 && sameBytes(chs[i-1].Operation, ch.Operation) {
			n = 0
		}
		if len(cur) > 0 && (len(cur) == maxChildren || size+n > maxBytes) {
			out = append(out, cur)
			cur, size, n = nil, 0, len(ch.Operation)
		}
		cur = append(cur, ch.ID)
		size += n
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// recordTx records the children named (ids) that are still due a record:
// it locks them, skips those that ended, run already or already have
// their command (another recorder got there first: a recovered parent's),
// ends cancelled those whose cancel was asked before they were recorded
// (nothing to withdraw then), releases the held ones — a
// HeldUntilRecorded kind's, or any a rolling advance picked for a slot
// (advance) — and records the rest for their nodes (releaseAll). Every
// caller names only children that fit a slot. A child of a
// HeldUntilRecorded kind found unheld was recorded when it was released;
// recorded again, its record writes nothing.
func (s *Service) recordTx(ctx context.Context, tx Tx, ids []string) error {
	slices.Sort(ids)
	chs, err := tx.LockOperations(ctx, ids)
	if err != nil {
		return err
	}
	// Looked up after the lock: a recorder that held it has committed.
	have, err := tx.Fleet().LockCommands(ctx, ids)
	if err != nil {
		return err
	}
	now := s.clock()
	var due []Operation
	var releasing []string
	for _, ch := range chs {
		_, recorded := have[ch.ID]
		switch {
		case ch.Terminal() || recorded || ch.State != StatePending:
		case ch.CancelRequestedAt != nil:
			if _, err := s.endTx(ctx, tx, ch, StateCancelled, nil, &Error{Code: "cancelled", Message: cancelMessage(ch.CancelReason)}, now); err != nil {
				return err
			}
		case ch.Held:
			releasing = append(releasing, ch.ID)
		default:
			due = append(due, ch)
		}
	}
	if len(releasing) > 0 {
		freed, err := tx.ReleaseChildren(ctx, releasing, now)
		if err != nil {
			return err
		}
		if err := appendReleased(ctx, tx, freed, now); err != nil {
			return err
		}
		due = append(due, freed...)
	}
	_, err = s.releaseAll(ctx, tx, due, now)
	return err
}

// appendReleased writes the released event of each child just released,
// in one statement.
func appendReleased(ctx context.Context, tx Tx, chs []Operation, now time.Time) error {
	events := make([]Event, len(chs))
	for i, ch := range chs {
		events[i] = Event{OperationID: ch.ID, Type: EventReleased, At: now, Data: json.RawMessage(`{}`)}
	}
	return tx.AppendEvents(ctx, events...)
}

// maxConcurrencyOf reads back the limit a parent recorded.
func maxConcurrencyOf(parent Operation) int {
	var r struct {
		MaxConcurrency int `json:"max_concurrency"`
	}
	_ = json.Unmarshal(parent.Result, &r)
	return r.MaxConcurrency
}

// advance moves a fan-out parent on: it releases held children into free
// slots, refreshes the counts, and ends the parent once every child has.
// Safe to run any number of times, on any replica. It answers what it
// found, for the coalescer to judge how soon the next one is worth it.
// Children of kinds recorded together (releasedByLane) it only picks,
// owning the parent; their write lanes release and record them once it
// has committed, and the parent is let go after (executeFanOut's steps 2
// and 3); other kinds' it releases itself, in the exclusive lane.
//
// The children are counted once (one GROUP BY over the parent's children):
// what releasing changes — a held child leaves the held ones, or ends
// failed at once — is known here and folded into those counts rather than
// counted again. A child that ended meanwhile elsewhere asked for another
// advance, which counts it.
func (s *Service) advance(ctx context.Context, parentID string, releasing bool) (advanceHint, error) {
	var hint advanceHint
	// Routed to the parent: counting its children and ending it lock the
	// parent's row alone. Releasing held children (or resuming a
	// recording) locks theirs, of every lane: the store runs such an
	// advance again on its own (a stray). One expected to release
	// (releasing) goes there at once, rather than first queueing in the
	// parent's lane for an attempt that strays.
	route := fleet.OnOperation(ctx, parentID)
	if releasing {
		route = ctx
	}
	var handOff []Operation
	marked := false
	defer func() {
		if marked {
			s.setRecording(parentID, false)
		}
	}()
	err := s.store.Tx(route, func(tx Tx) error {
		hint, handOff = advanceHint{}, nil
		if marked {
			// An attempt rolled back: nothing of it is recording.
			s.setRecording(parentID, false)
			marked = false
		}
		parent, err := tx.LockParent(ctx, parentID)
		if err != nil {
			return err
		}
		if parent.Terminal() || parent.Counts == nil {
			hint.ended = parent.Terminal()
			return nil
		}
		now := s.clock()
		letGo := false
		if parent.Owner == s.replica && !s.recordingHere(parentID) {
			// This replica's recording of its commands stopped part-way
			// (executeFanOut): resume it here, under the parent's lock.
			left, err := tx.Unrecorded(ctx, parentID, s.recordedTogether())
			if err != nil {
				return err
			}
			ids := make([]string, len(left))
			for i, ch := range left {
				ids[i] = ch.ID
			}
			if err := s.recordTx(ctx, tx, ids); err != nil {
				return err
			}
			parent.Owner, letGo = "", true
		}
		byState, held, err := tx.ChildCounts(ctx, parentID)
		if err != nil {
			return err
		}
		maxConcurrency := maxConcurrencyOf(parent)
		inFlight := byState[StatePending] + byState[StateRunning] - held
		more := false
		// A parent still owned is being recorded (executeFanOut): its
		// recording releases the children that fit, lane by lane, and the
		// advance that follows it releases more.
		if free := maxConcurrency - inFlight; free > 0 && held > 0 && parent.CancelRequestedAt == nil && parent.Owner == "" {
			// At most advanceBatch of them: the rest in the next
			// advance, at once (more).
			batch := min(free, s.advanceBatch(parent))
			more = batch < free && held > batch
			if s.releasedByLane(parent.Kind) {
				// Picked here and released by their write lanes once this
				// commits (recordReleased), each lane's in transactions
				// beside its nodes' other writes. Releasing them here
				// locked children of every lane, so it ran in the
				// exclusive lane and held every node's writes back: a
				// rolling wave of 10,000 at max_concurrency 50 spent 11
				// of its 15 s there (BENCHMARKS.md, forty-fifth sitting).
				// The parent is owned meanwhile, as while a fan-out's
				// first children are recorded, so no advance here or on
				// another replica releases past max_concurrency; a
				// replica that stops before letting go leaves it to be
				// recovered like any orphan, the picked children still
				// held.
				if handOff, err = tx.HeldChildren(ctx, parentID, batch); err != nil {
					return err
				}
				if len(handOff) > 0 {
					parent.Owner = s.replica
					s.setRecording(parentID, true)
					marked = true
				}
			} else {
				// The held children leave the held ones in one statement
				// and their released events in one more; then each goes
				// to its channel.
				waiting, err := tx.ReleaseHeld(ctx, parentID, batch, now)
				if err != nil {
					return err
				}
				if err := appendReleased(ctx, tx, waiting, now); err != nil {
					return err
				}
				after, err := s.releaseAll(ctx, tx, waiting, now)
				if err != nil {
					return err
				}
				held -= foldReleased(byState, after)
			}
		}
		counts := countsOf(byState)
		hint = advanceHint{known: true, open: counts.Pending, held: held, maxConcurrency: maxConcurrency, more: more,
			byLane: s.releasedByLane(parent.Kind)}
		switch {
		case len(handOff) > 0:
			// Those left held wait for a slot.
			hint.held = held - len(handOff)
		case parent.Owner != "":
			// Held for its recording, not for a slot: no advance releases
			// them, so none needs to run in the exclusive lane for them.
			hint.held = 0
		}
		changed := *parent.Counts != counts || letGo || len(handOff) > 0
		parent.Counts = &counts
		if counts.Pending > 0 {
			if !changed {
				return nil
			}
			parent.UpdatedAt = now
			if err := tx.UpdateOperation(ctx, parent); err != nil {
				return err
			}
			return tx.Notify(ctx, parent.ID)
		}
		hint.ended = true
		final := map[string]any{"max_concurrency": maxConcurrency, "counts": counts}
		if k, ok := s.kinds.Kind(parent.Kind); ok && k.Summarize != nil {
			sum := k.Summarize()
			if err := eachChild(ctx, tx, parent.ID, sum.Add); err != nil {
				return err
			}
			final["summary"] = sum.Summary()
		}
		result := mustJSON(final)
		switch {
		case parent.CancelRequestedAt != nil:
			_, err = s.endTx(ctx, tx, parent, StateCancelled, result, &Error{Code: "cancelled", Message: cancelMessage(parent.CancelReason)}, now)
		case counts.Succeeded == counts.Total:
			_, err = s.endTx(ctx, tx, parent, StateSucceeded, result, nil, now)
		default:
			_, err = s.endTx(ctx, tx, parent, StateFailed, result, &Error{Code: CodeChildrenFailed,
				Message: fmt.Sprintf("%d of %d children did not succeed", counts.Total-counts.Succeeded, counts.Total)}, now)
		}
		return err
	})
	if err == nil && len(handOff) > 0 {
		s.recordReleased(ctx, parentID, handOff)
	}
	return hint, err
}

// setRecording marks (or unmarks) a fan-out whose children this replica
// is recording now, for its advances to leave the recording to it.
func (s *Service) setRecording(parentID string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if on {
		s.recording[parentID] = struct{}{}
	} else {
		delete(s.recording, parentID)
	}
}

// releasedByLane reports whether a fan-out kind's held children are
// released by their write lanes (advance): the store runs several, and
// every kind its children may be (ChildKinds) is recorded together
// (RecordedTogether), so its recording in a node's lane can release it
// too (recordTx). With one writer (SQLite) every transaction holds all
// writes back alike, and the lanes' way only added two commits a release:
// a rolling wave of 10,000 took 9.9 s against 8.1 (BENCHMARKS.md,
// forty-fifth sitting).
func (s *Service) releasedByLane(parentKind string) bool {
	return s.store.WriteLanes() > 1 && s.everyChildKind(parentKind, func(k *Kind) bool { return k.RecordedTogether })
}

// everyChildKind reports whether a fan-out kind names the kinds its
// children may be (ChildKinds) and each is served and satisfies is.
func (s *Service) everyChildKind(parentKind string, is func(*Kind) bool) bool {
	k, ok := s.kinds.Kind(parentKind)
	if !ok || len(k.ChildKinds) == 0 {
		return false
	}
	for _, name := range k.ChildKinds {
		if ck, ok := s.kinds.Kind(name); !ok || !is(ck) {
			return false
		}
	}
	return true
}

// advanceBatch bounds the held children one advance of parent releases:
// ReleasePerAdvance, and the bytes of a recording (recordBytes) — its
// children carry the parent's operation, so large ones go fewer at a time.
// Children whose kinds all record their operation once (ChildKinds,
// RecordsOperationOnce) write it once a release, whatever their number:
// they are bounded as a recording of them is (recordSharedChildren), never
// to fewer. Bounded by bytes, a rolling fleet.command of a 200 KB payload
// released five children an advance, and each advance locked and read the
// parent again: 10,000 nodes at max_concurrency 50 took 126–130 s against
// 25–28 s for a small payload (BENCHMARKS.md, forty-fifth sitting).
func (s *Service) advanceBatch(parent Operation) int {
	byBytes := max(1, recordBytes/max(1, len(parent.Operation)))
	if s.everyChildKind(parent.Kind, func(k *Kind) bool { return k.RecordsOperationOnce }) {
		byBytes = max(byBytes, recordSharedChildren)
	}
	return min(s.settings.ReleasePerAdvance, byBytes)
}

// foldReleased folds children just released (releaseAll's answer) into
// a count of the parent's children by state in which they were pending:
// those that ended at release (refused) move to their end state. It
// answers how many were released.
func foldReleased(byState map[State]int, after []Operation) int {
	for _, ended := range after {
		if ended.Terminal() {
			byState[StatePending]--
			byState[ended.State]++
			if ended.Error != nil && ended.Error.Code == string(errcode.CapabilityMissing) {
				byState[CountCapabilityMissing]++
			}
		}
	}
	return len(after)
}

// countsOf is a parent's Counts from its children by state.
func countsOf(byState map[State]int) Counts {
	c := Counts{Succeeded: byState[StateSucceeded], Failed: byState[StateFailed], Cancelled: byState[StateCancelled],
		Pending: byState[StatePending] + byState[StateRunning], CapabilityMissing: byState[CountCapabilityMissing]}
	c.Total = c.Succeeded + c.Failed + c.Cancelled + c.Pending
	return c
}

// eachChild hands every child of a parent to fn, newest first, a page at
// a time.
func eachChild(ctx context.Context, tx Tx, parentID string, fn func(Operation)) error {
	f := Filter{ParentID: parentID, Limit: 500}
	for {
		page, err := tx.List(ctx, f)
		if err != nil {
			return err
		}
		for _, ch := range page {
			fn(ch)
		}
		if len(page) < f.Limit {
			return nil
		}
		f.Before = page[len(page)-1].Cursor
	}
}

// releaseAll hands children just released to their channels, answering
// each as it stands after, in order. Children of a kind with RecordMany
// (the node commands, node.configure) are recorded together: one
// statement locking their nodes in id order (as the lease batch does,
// models/group.go) — the capability is checked on those locked rows, not
// from the node cache (a read per node on a miss) as release does — one
// counting the nodes' open operations for the quota, and a few more
// writing what the kind records, whatever the number of children. A
// refused child — node absent, retired, not ready, lacking the
// capability, over its quota — has nothing written and ends failed with
// its code, as release would end it. Other kinds, and a second child of
// one kind for the same node (RecordMany takes distinct targets), go one
// by one, each in a savepoint.
func (s *Service) releaseAll(ctx context.Context, tx Tx, chs []Operation, now time.Time) ([]Operation, error) {
	out := make([]Operation, len(chs))
	byKind := map[*Kind][]int{}
	var kinds []*Kind
	var single []int
	targeted := map[*Kind]map[string]bool{}
	for i, ch := range chs {
		out[i] = ch
		kind, ok := s.kinds.Kind(ch.Kind)
		if !ok || kind.RecordMany == nil || targeted[kind][ch.TargetID] {
			single = append(single, i)
			continue
		}
		if byKind[kind] == nil {
			kinds = append(kinds, kind)
			targeted[kind] = map[string]bool{}
		}
		byKind[kind] = append(byKind[kind], i)
		targeted[kind][ch.TargetID] = true
	}
	for _, kind := range kinds {
		idx := byKind[kind]
		ops := make([]Operation, len(idx))
		for j, i := range idx {
			ops[j] = chs[i]
		}
		admit := func(ok []int) (map[int]error, error) {
			var nodes []string
			for _, j := range ok {
				if nodeQuotaApplies(kind, ops[j]) {
					nodes = append(nodes, ops[j].TargetID)
				}
			}
			if len(nodes) == 0 {
				return nil, nil
			}
			open, err := tx.CountOpenForNodes(ctx, nodes, s.kinds.QuotaExempt())
			if err != nil {
				return nil, err
			}
			refused := map[int]error{}
			for _, j := range ok {
				// The child is open, so counted already: the others are
				// one fewer.
				if nodeQuotaApplies(kind, ops[j]) {
					if err := s.overNodeQuota(ops[j].TargetID, open[ops[j].TargetID]-1); err != nil {
						refused[j] = err
					}
				}
			}
			return refused, nil
		}
		refusals, err := kind.RecordMany(ctx, tx, ops, admit)
		if err != nil {
			return nil, err
		}
		for j, refusal := range refusals {
			if refusal == nil {
				out[idx[j]] = ops[j] // as its record left it
				continue
			}
			var coded *errcode.Error
			if !errors.As(refusal, &coded) {
				return nil, refusal
			}
			if out[idx[j]], err = s.endTx(ctx, tx, ops[j], StateFailed, nil, operationError(refusal), now); err != nil {
				return nil, err
			}
		}
	}
	for _, i := range single {
		ended, err := s.release(ctx, tx, chs[i], now)
		if err != nil {
			return nil, err
		}
		out[i] = ended
	}
	return out, nil
}

// release hands a child just released (Tx.ReleaseHeld, its released
// event appended) to its channel: a node kind records its command now (a
// refusal — the node retired, not ready, over its quota — ends the child
// failed with that code), a local kind becomes claimable. It answers the
// child as it stands after.
func (s *Service) release(ctx context.Context, tx Tx, ch Operation, now time.Time) (Operation, error) {
	kind, ok := s.kinds.Kind(ch.Kind)
	if ok {
		if err := s.checkCapability(ctx, kind, ch.Targets); errcode.Of(err) == errcode.CapabilityMissing {
			return s.endTx(ctx, tx, ch, StateFailed, nil, operationError(err), now)
		} else if err != nil {
			return ch, err
		}
	}
	if !ok || kind.Record == nil {
		return ch, tx.NotifyDispatch(ctx, ch.ID)
	}
	after := ch
	err := tx.Savepoint(ctx, func() error {
		recorded, err := kind.Record(ctx, tx, ch)
		if err != nil {
			return err
		}
		after, _ = asRecorded(ch, recorded) // ended or running at once, or as it was
		return s.checkNodeQuota(ctx, tx, kind, ch, true)
	})
	var coded *errcode.Error
	if errors.As(err, &coded) {
		return s.endTx(ctx, tx, ch, StateFailed, nil, operationError(err), now)
	}
	return after, err
}

// cancelChildren cancels a parent's open children: held and undelivered
// ones end at once, delivered ones end with their node's answer.
func (s *Service) cancelChildren(ctx context.Context, tx Tx, parent Operation, reason string) error {
	open, err := tx.OpenChildren(ctx, parent.ID)
	if err != nil {
		return err
	}
	for _, ch := range open {
		if _, err := s.cancelTx(ctx, tx, ch, strings.TrimSpace("parent cancelled "+reason), s.clock()); err != nil {
			return err
		}
	}
	return tx.NotifyParent(ctx, parent.ID)
}

// sweepParents advances every running fan-out parent.
func (s *Service) sweepParents(ctx context.Context) {
	ids, err := s.store.FanningOut(ctx, 1000)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error("ledger: find fan-outs", "err", err)
		}
		return
	}
	for _, id := range ids {
		s.metrics.FanOutAdvances.WithLabelValues("sweep").Inc()
		hint, err := s.advance(ctx, id, false)
		if err != nil && ctx.Err() == nil {
			s.log.Error("ledger: advance fan-out", "operation_id", id, "err", err)
		}
		if hint.more {
			s.advanceAgain(id) // the rest of its held children, off the sweep
		}
	}
}
