package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/nodeward/nodeward/errcode"
)

// Run does the ledger's background work until ctx ends: the dispatcher,
// the owner lease with restart recovery, and retention. It returns once
// every run it started has returned.
func (s *Service) Run(ctx context.Context) {
	s.TakeOver(ctx)
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); s.ownerLoop(ctx) }()
	go func() { defer wg.Done(); s.pruneLoop(ctx) }()
	go func() { defer wg.Done(); s.advanceLoop(ctx) }()
	finished := make(chan struct{})
	go func() { defer close(finished); s.finishLoop(context.WithoutCancel(ctx)) }()
	s.dispatch(ctx)
	// Every run has returned: record what they answered, then stop.
	close(s.ends)
	<-finished
	wg.Wait()
	// A clean stop hands what it ran to the next owner at once.
	if err := s.store.DropOwner(context.WithoutCancel(ctx), s.replica); err != nil {
		s.log.Warn("ledger: drop owner lease", "err", err)
	}
}

// TakeOver takes this replica's owner lease and recovers, at once, what
// stopped processes left running: an earlier process of this replica
// (Options.Predecessors), and on a single-process store every other owner.
// Run begins with it unless it was called already. The server calls it
// before it answers a request: after a crash, a fleet reconnecting all at
// once fills the write lanes with lease renewals and resuming polls, and
// recovery's transactions queued behind them for seconds (a restart under
// 10,000 agents left the fan-outs it interrupted unrecorded for up to
// 8.7 s), where alone it takes milliseconds.
func (s *Service) TakeOver(ctx context.Context) {
	s.tookOver.Do(func() {
		if err := s.store.RenewOwner(ctx, s.replica, s.clock().Add(s.settings.OwnerLease)); err != nil {
			s.log.Error("ledger: owner lease", "err", err)
		}
		if s.predecessors != "" {
			if err := s.store.DropOwners(ctx, s.predecessors, s.replica); err != nil {
				s.log.Error("ledger: drop the leases of this replica's earlier processes", "err", err)
			}
		}
		// On a single-process store every other owner is a dead process,
		// whose lease need not be waited out.
		s.recover(ctx, s.settings.SingleProcess)
	})
}

// dispatch claims pending local operations whenever a slot is free and
// something may be claimable: on a wake-up (a submit here or on another
// replica, a run ending) or on the fallback poll (recheck: a submit on
// another replica is announced after its commit, and may never be).
func (s *Service) dispatch(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	free := make(chan struct{}, s.settings.Workers)
	inFlight := 0
	for {
		// Collect slots freed by runs that ended.
		for drained := false; !drained; {
			select {
			case <-free:
				inFlight--
			default:
				drained = true
			}
		}
		if n := s.settings.Workers - inFlight; n > 0 {
			ops, err := s.claim(ctx, n)
			if err != nil && ctx.Err() == nil {
				// Nothing was claimed; look again soon rather than wait for
				// a wake-up that may never come.
				s.log.Error("ledger: claim", "err", err)
				s.kickAfter(s.settings.FallbackPoll)
			}
			s.metrics.LedgerClaims.Inc()
			for _, op := range ops {
				inFlight++
				s.metrics.DispatchLatency.Observe(s.clock().Sub(op.CreatedAt).Seconds())
				s.metrics.OperationsRunning.Inc()
				wg.Add(1)
				go func(op Operation) {
					defer wg.Done()
					then := s.execute(ctx, op)
					s.metrics.OperationsRunning.Dec()
					free <- struct{}{}
					s.kick()
					if then != nil {
						then() // holding no slot: a fan-out's recording
					}
				}(op)
			}
			if len(ops) == n {
				continue // there may be more
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
			s.metrics.LedgerWakeups.WithLabelValues("wake").Inc()
		case <-s.recheck():
			s.metrics.LedgerWakeups.WithLabelValues("poll").Inc()
		}
	}
}

// claim claims up to n pending local operations for this replica. Each
// claimed operation counts as unstarted until execute registers its run,
// so a cancel heard meanwhile is kept for it (Changed).
func (s *Service) claim(ctx context.Context, n int) ([]Operation, error) {
	s.mu.Lock()
	s.unstarted++
	s.mu.Unlock()
	ops, err := s.store.Claim(ctx, s.replica, s.clock(), n)
	s.mu.Lock()
	s.unstarted += len(ops) - 1
	s.forgetHeardLocked()
	s.mu.Unlock()
	return ops, err
}

// forgetHeardLocked empties heard once no claim or unstarted run could
// need it.
func (s *Service) forgetHeardLocked() {
	if s.unstarted == 0 {
		clear(s.heard)
		s.heardAll = false
	}
}

// maxHeard bounds the changes kept for unstarted runs.
const maxHeard = 4096

// kickAfter wakes the dispatcher once d has passed.
func (s *Service) kickAfter(d time.Duration) {
	time.AfterFunc(d, s.kick)
}

// execute carries one claimed operation out and records how it ended,
// or answers what is left of it to run without a slot (then: a fan-out's
// recording, executeFanOut).
func (s *Service) execute(ctx context.Context, op Operation) (then func()) {
	kind, ok := s.kinds.Kind(op.Kind)
	if !ok {
		s.mu.Lock()
		s.unstarted--
		s.forgetHeardLocked()
		s.mu.Unlock()
		// Recorded by a build that served it; this one cannot run it.
		s.finish(ctx, op, StateFailed, nil, &Error{Code: "kind_not_served", Message: "this control plane does not serve kind " + op.Kind})
		return nil
	}
	// The deadline is on the ledger's clock; the context counts it down on
	// the process's.
	runCtx, cancel := context.WithTimeout(ctx, op.Deadline.Sub(s.clock()))
	defer cancel()
	s.mu.Lock()
	s.running[op.ID] = cancel
	_, heard := s.heard[op.ID]
	heard = heard || s.heardAll
	delete(s.heard, op.ID)
	s.unstarted--
	s.forgetHeardLocked()
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.running, op.ID)
		s.mu.Unlock()
	}()
	if op.CancelRequestedAt != nil {
		cancel()
	} else if heard {
		// It changed between the claim and now: maybe a cancel.
		s.checkCancel(ctx, op.ID)
	}

	started := time.Now()
	defer func() { s.metrics.ExecutorRunTime.WithLabelValues(op.Kind).Observe(time.Since(started).Seconds()) }()
	switch {
	case kind.RunTx != nil:
		s.executeTx(ctx, runCtx, kind, op)
		return nil
	case kind.FanOut != nil:
		return s.executeFanOut(ctx, runCtx, kind, op)
	}
	result, err := kind.Run(runCtx, op)
	s.finishRun(ctx, runCtx, op, result, err)
	return nil
}

// executeTx runs a transactional kind: its effect and its end commit
// together, or neither does and the end is recorded on its own.
func (s *Service) executeTx(ctx, runCtx context.Context, kind *Kind, op Operation) {
	var runErr error
	err := s.store.Tx(nodeRoute(ctx, op), func(tx Tx) error {
		cur, err := tx.LockOperation(ctx, op.ID)
		if err != nil {
			return err
		}
		if cur.State != StateRunning || cur.Owner != s.replica {
			return nil // ended meanwhile (cancelled, recovered elsewhere)
		}
		if err := runCtx.Err(); err != nil {
			runErr = err
			return err
		}
		result, err := kind.RunTx(runCtx, tx, cur)
		if err != nil {
			runErr = err
			return err
		}
		_, err = s.endTx(ctx, tx, cur, StateSucceeded, result, nil, s.clock())
		return err
	})
	if err == nil {
		return
	}
	if runErr == nil {
		runErr = err
	}
	s.finishRun(ctx, runCtx, op, nil, runErr)
}

// finishRun records a run's answer: success, the executor's error, or why
// its context ended. Ends go to the finisher, which records many in one
// write; a cancellation, rare, is recorded on its own with its reason.
func (s *Service) finishRun(ctx, runCtx context.Context, op Operation, result json.RawMessage, err error) {
	end := End{OperationID: op.ID, At: s.clock()}
	switch {
	case err == nil:
		end.State, end.Result = StateSucceeded, result
	case ctx.Err() != nil:
		// This process is stopping: the operation stays running and is
		// recovered by the next owner.
		return
	case errors.Is(runCtx.Err(), context.DeadlineExceeded) && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)):
		end.State, end.Error = StateFailed, &Error{Code: CodeTimedOut, Message: "the operation passed its deadline", Retryable: true}
	case errors.Is(runCtx.Err(), context.Canceled) && errors.Is(err, context.Canceled):
		s.finish(ctx, op, StateCancelled, nil, nil)
		return
	default:
		end.State, end.Error = StateFailed, operationError(err)
	}
	if s.carriesSecrets(op) {
		// Its result and error are scrubbed of the values it used, which
		// the per-operation end does (the batch writes them as they are).
		s.finish(ctx, op, end.State, end.Result, end.Error)
		return
	}
	s.ends <- end
}

// maxFinishBatch bounds the ends one write records.
const maxFinishBatch = 256

// finishLoop records ended runs: whatever has queued up while the last
// write ran goes in the next one, so a busy dispatcher pays one write for
// many ends and an idle one no wait at all.
func (s *Service) finishLoop(ctx context.Context) {
	batch := make([]End, 0, maxFinishBatch)
	for e := range s.ends {
		batch = append(batch[:0], e)
	more:
		for len(batch) < maxFinishBatch {
			select {
			case e, ok := <-s.ends:
				if !ok {
					break more
				}
				batch = append(batch, e)
			default:
				break more
			}
		}
		var ended []Ended
		var err error
		for attempt := 0; attempt < 5; attempt++ {
			if ended, err = s.store.Finish(ctx, s.replica, batch); err == nil {
				break
			}
			s.log.Error("ledger: record ends", "operations", len(batch), "attempt", attempt+1, "err", err)
			time.Sleep(time.Duration(attempt+1) * 200 * time.Millisecond)
		}
		// Still failing: they stay running, owned here, and are recovered
		// (re-run or interrupted) once this replica's lease lapses.
		states := make(map[string]State, len(batch))
		for _, b := range batch {
			states[b.OperationID] = b.State
		}
		for _, e := range ended {
			s.metrics.OperationsEnded.WithLabelValues(e.Kind, string(states[e.OperationID])).Inc()
		}
	}
}

// operationError is how an executor's error is recorded: a domain code as
// it is, anything else an internal error whose text stays in the log.
func operationError(err error) *Error {
	var e *errcode.Error
	if errors.As(err, &e) {
		return &Error{Code: string(e.Code), Message: e.Message, Retryable: retryableCode(e.Code)}
	}
	return &Error{Code: CodeInternal, Message: "internal error", Retryable: true}
}

func retryableCode(c errcode.Code) bool {
	switch c {
	case errcode.Unavailable, errcode.Draining, errcode.Internal, errcode.QuotaExceeded, errcode.RateLimited:
		return true
	}
	return false
}

// finish ends a running operation this replica owns.
func (s *Service) finish(ctx context.Context, op Operation, to State, result json.RawMessage, opErr *Error) {
	ctx = context.WithoutCancel(ctx)
	err := s.store.Tx(ctx, func(tx Tx) error {
		cur, err := tx.LockOperation(ctx, op.ID)
		if err != nil {
			return err
		}
		if cur.State != StateRunning || cur.Owner != s.replica {
			return nil
		}
		if to == StateCancelled {
			opErr = &Error{Code: "cancelled", Message: cancelMessage(cur.CancelReason)}
		}
		_, err = s.endTx(ctx, tx, cur, to, result, opErr, s.clock())
		return err
	})
	if err != nil {
		s.log.Error("ledger: record end", "operation_id", op.ID, "err", err)
	}
}

// checkCancel cancels the local run of id when its cancel was asked for.
func (s *Service) checkCancel(ctx context.Context, id string) {
	op, err := s.store.Operation(ctx, id)
	if err != nil || op.CancelRequestedAt == nil {
		return
	}
	s.mu.Lock()
	cancel := s.running[id]
	s.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// ownerLoop keeps this replica's owner lease and recovers what replicas
// whose lease lapsed left running.
func (s *Service) ownerLoop(ctx context.Context) {
	t := time.NewTicker(s.settings.OwnerLease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := s.store.RenewOwner(ctx, s.replica, s.clock().Add(s.settings.OwnerLease)); err != nil && ctx.Err() == nil {
			s.log.Error("ledger: owner lease", "err", err)
		}
		s.recover(ctx, false)
		s.expire(ctx)
		s.sweepParents(ctx)
	}
}

// expire ends node operations still undelivered at their deadline: the
// command is withdrawn and the operation fails timed_out (retryable). One
// delivered meanwhile is left to the node's answer. A configure operation
// ends timed_out at its deadline whether or not its revision was delivered
// (running): it waits for a report, not for an answer to a command.
func (s *Service) expire(ctx context.Context) {
	now := s.clock()
	overdue, err := s.store.Overdue(ctx, now, 100)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error("ledger: find overdue", "err", err)
		}
		return
	}
	for _, o := range overdue {
		err := s.store.Tx(ctx, func(tx Tx) error {
			cur, err := tx.LockOperation(ctx, o.ID)
			if err != nil || !(cur.State == StatePending || (cur.State == StateRunning && cur.Kind == KindNodeConfigure)) {
				return err
			}
			withdrawn := cur.Held // nothing was handed out yet
			msg := "no node took it before its deadline"
			if cur.Kind == KindNodeConfigure {
				// A configuration is state, not a queued command: it stays
				// desired; the operation stops waiting for the node.
				withdrawn, msg = true, "the node did not report this configuration applied before the deadline"
			}
			if !withdrawn {
				if withdrawn, err = tx.Fleet().WithdrawCommand(ctx, cur.ID, now); err != nil || !withdrawn {
					return err
				}
			}
			_, err = s.endTx(ctx, tx, cur, StateFailed, nil, &Error{Code: CodeTimedOut,
				Message: msg, Retryable: true}, now)
			return err
		})
		if err != nil && ctx.Err() == nil {
			s.log.Error("ledger: expire", "operation_id", o.ID, "err", err)
		}
	}
}

// recover takes over operations left running by replicas that are gone
// (DECISIONS.md: restart recovery). A kind safe to repeat — level-triggered,
// or whose effect commits with its end — goes back to pending and runs
// again; anything else ends failed `interrupted`, retryable.
func (s *Service) recover(ctx context.Context, everyOtherOwner bool) {
	now := s.clock()
	started := time.Now()
	leaseAt := now
	if everyOtherOwner {
		leaseAt = now.Add(100 * 365 * 24 * time.Hour) // no lease is current then
	}
	taken := 0
	defer func() {
		if taken > 0 {
			s.log.Info("ledger: recovered what stopped processes left running", "operations", taken, "took", time.Since(started).String())
		}
	}()
	for {
		orphans, err := s.store.Orphans(ctx, s.replica, leaseAt, 100)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Error("ledger: find orphans", "err", err)
			}
			return
		}
		for _, o := range orphans {
			took, err := s.recoverOne(ctx, o, now)
			if err != nil && ctx.Err() == nil {
				s.log.Error("ledger: recover", "operation_id", o.ID, "err", err)
				return
			}
			if took && err == nil {
				taken++
			}
		}
		if len(orphans) < 100 {
			return
		}
	}
}

// recoverOne answers whether it was this call that recovered o (another
// replica may have got there first).
func (s *Service) recoverOne(ctx context.Context, o Operation, now time.Time) (took bool, err error) {
	err = s.store.Tx(ctx, func(tx Tx) error {
		took = false
		cur, err := tx.LockOperation(ctx, o.ID)
		if err != nil {
			return err
		}
		if cur.State != StateRunning || cur.Owner != o.Owner {
			return nil // someone else got there first
		}
		took = true
		kind, ok := s.kinds.Kind(cur.Kind)
		if ok && kind.RerunOnRecovery() && cur.CancelRequestedAt == nil {
			if !CanTransition(cur.State, StatePending) {
				took = false
				return nil
			}
			from := cur.Owner
			cur.State, cur.Owner, cur.UpdatedAt = StatePending, "", now
			if err := tx.UpdateOperation(ctx, cur); err != nil {
				return err
			}
			if err := tx.AppendEvents(ctx, Event{OperationID: cur.ID, Type: EventRecovered, At: now,
				Data: mustJSON(map[string]any{"previous_owner": from, "action": "rerun"})}); err != nil {
				return err
			}
			s.metrics.OperationsRecovered.WithLabelValues("rerun").Inc()
			return tx.NotifyDispatch(ctx, cur.ID)
		}
		s.metrics.OperationsRecovered.WithLabelValues("interrupted").Inc()
		if cur.CancelRequestedAt != nil {
			_, err = s.endTx(ctx, tx, cur, StateCancelled, nil, &Error{Code: "cancelled", Message: cancelMessage(cur.CancelReason)}, now)
			return err
		}
		_, err = s.endTx(ctx, tx, cur, StateFailed, nil, &Error{Code: CodeInterrupted,
			Message: "the control plane running it stopped before it ended; retry with a new request_id", Retryable: true}, now)
		return err
	})
	return took, err
}

// pruneLoop deletes ended operations and old events past retention, in
// bounded batches, on one replica at a time.
func (s *Service) pruneLoop(ctx context.Context) {
	t := time.NewTicker(s.settings.PruneInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, _, err := s.Prune(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("ledger: prune", "err", err)
		}
	}
}

// Prune removes what retention no longer keeps and answers how many
// operations and events went.
func (s *Service) Prune(ctx context.Context) (ops, events int, err error) {
	now := s.clock()
	for {
		o, e, pruned, err := s.store.Prune(ctx, now.Add(-s.settings.OperationsKeptFor), now.Add(-s.settings.EventsKeptFor), s.settings.PruneBatch)
		ops, events = ops+o, events+e
		if err != nil || !pruned || (o < s.settings.PruneBatch && e < s.settings.PruneBatch) {
			return ops, events, err
		}
	}
}
