package fleet

import (
	"context"
	"time"
)

// Retire ends a node for good: one transaction sets it retired, revokes its
// outstanding invitations and refuses its undelivered commands. The record
// is written before any session is ended, so an agent that redials at once
// is refused. Idempotent. Errors: ErrNotFound.
func (s *Service) Retire(ctx context.Context, actor, nodeID, reason string) (Node, error) {
	var n Node
	changed := false
	err := s.store.Tx(ctx, func(tx Tx) error {
		var err error
		n, changed, err = s.RetireTx(ctx, tx, actor, nodeID, reason)
		return err
	})
	if err != nil {
		return Node{}, err
	}
	if changed {
		s.afterRetire(nodeID)
	}
	return n, nil
}

// RetireTx is Retire inside a transaction the caller owns; changed is
// false when the node was already retired.
func (s *Service) RetireTx(ctx context.Context, tx Tx, actor, nodeID, reason string) (n Node, changed bool, err error) {
	n, err = tx.LockNode(ctx, nodeID)
	if isNoRows(err) {
		return Node{}, false, ErrNotFound
	}
	if err != nil || n.State == StateRetired {
		return n, false, err
	}
	n, err = s.retireTx(ctx, tx, n, actor, s.clock(), reason)
	return n, err == nil, err
}

// retireTx retires n inside tx (DECISIONS.md §3).
func (s *Service) retireTx(ctx context.Context, tx Tx, n Node, actor string, now time.Time, reason string) (Node, error) {
	if err := n.moveTo(StateRetired); err != nil {
		return n, err
	}
	n.RetiredAt = &now
	n.UpdatedAt = now
	if err := tx.UpdateNode(ctx, n); err != nil {
		return n, err
	}
	outstanding, err := tx.OutstandingInvitations(ctx, n.ID)
	if err != nil {
		return n, err
	}
	for _, inv := range outstanding {
		if _, err := tx.SetInvitationState(ctx, inv.ID, InvitationOutstanding, InvitationRevoked, now); err != nil {
			return n, err
		}
	}
	pending, err := tx.Commands(ctx, n.ID, CommandPending, 0)
	if err != nil {
		return n, err
	}
	refused := 0
	for _, c := range pending {
		if c.DeliveredFencing != nil {
			// Delivered: its result is still taken while the session lasts.
			continue
		}
		c.State = CommandRefused
		c.FailureCode = "node_retired"
		c.FailureMessage = "node was retired before the command was delivered"
		c.SettledAt = &now
		if err := tx.UpdateCommand(ctx, c); err != nil {
			return n, err
		}
		refused++
	}
	detail := map[string]any{"invitations_revoked": len(outstanding), "commands_refused": refused}
	if reason != "" {
		detail["reason"] = reason
	}
	if err := tx.AppendAudit(ctx, AuditEntry{At: now, Actor: actor, Action: "node.retire", NodeID: n.ID, Detail: detail}); err != nil {
		return n, err
	}
	return n, tx.Notify(ctx, Notification{Kind: NotifyNode, NodeID: n.ID})
}

// afterRetire runs once the retirement committed: nothing is cached and the
// lease memory is dropped. (Held long-polls were told by the notification.)
func (s *Service) afterRetire(nodeID string) {
	s.cache.forget(nodeID)
	s.leases.forget(nodeID)
}

// Node answers one node. Errors: ErrNotFound.
func (s *Service) Node(ctx context.Context, id string) (Node, error) {
	n, err := s.store.Node(ctx, id)
	if isNoRows(err) {
		return Node{}, ErrNotFound
	}
	return n, err
}

// Nodes lists nodes newest first (keyset pagination).
func (s *Service) Nodes(ctx context.Context, f NodeFilter) ([]Node, error) {
	return s.store.ListNodes(ctx, f)
}

// RecentAudit answers the latest changes across the fleet, newest first.
func (s *Service) RecentAudit(ctx context.Context, limit int) ([]AuditEntry, error) {
	return s.store.RecentAudit(ctx, limit)
}

// CountByState answers how many nodes are in each state.
func (s *Service) CountByState(ctx context.Context) (map[State]int64, error) {
	return s.store.CountNodesByState(ctx)
}

// Summary is the fleet overview's counts.
type Summary struct {
	// ByState counts nodes in each state; a state with none is absent.
	ByState map[State]int64
	// Lapsing counts ready nodes whose lease ends within LapseWindow:
	// the ones about to be marked lost unless they are heard from.
	Lapsing int64
	// LapseBefore is the end of that window (the nodes listing's filter).
	LapseBefore time.Time
	// PendingCommands counts commands not yet settled.
	PendingCommands int64
	// RefusedCommands counts commands refused since RefusedSince.
	RefusedCommands int64
	RefusedSince    time.Time
}

// LapseWindow is how close to its end a ready node's lease counts as
// lapsing: one heartbeat interval, and at least 30 s.
func (s *Service) LapseWindow() time.Duration {
	return max(s.settings.HeartbeatInterval, 30*time.Second)
}

// Summarize answers the overview's counts: nodes by state, lapsing leases
// (LapseWindow), pending commands and commands refused within refusedWithin.
func (s *Service) Summarize(ctx context.Context, refusedWithin time.Duration) (Summary, error) {
	now := s.clock()
	w := SummaryWindow{LapseBefore: now.Add(s.LapseWindow()), RefusedSince: now.Add(-refusedWithin)}
	sum, err := s.store.Summarize(ctx, w)
	sum.LapseBefore, sum.RefusedSince = w.LapseBefore, w.RefusedSince
	return sum, err
}

// Audit answers a node's changes, newest first: those with an id below
// before (0: from the newest), at most limit.
func (s *Service) Audit(ctx context.Context, nodeID string, before int64, limit int) ([]AuditEntry, error) {
	return s.store.Audit(ctx, nodeID, before, limit)
}

// Reconciliation is what a restarted control plane needs to know not to
// launch anything twice.
type Reconciliation struct {
	AppliedOperationIDs []string
	PendingOperationIDs []string
	Workloads           []Workload
}

// Reconcile answers what the node applied, what is still pending and which
// workloads it reported. Errors: ErrNotFound.
func (s *Service) Reconcile(ctx context.Context, nodeID string) (Reconciliation, error) {
	if _, err := s.Node(ctx, nodeID); err != nil {
		return Reconciliation{}, err
	}
	applied, err := s.store.AppliedOperationIDs(ctx, nodeID)
	if err != nil {
		return Reconciliation{}, err
	}
	pending, err := s.store.Commands(ctx, nodeID, CommandPending, 0)
	if err != nil {
		return Reconciliation{}, err
	}
	ws, err := s.store.Workloads(ctx, nodeID)
	if err != nil {
		return Reconciliation{}, err
	}
	r := Reconciliation{AppliedOperationIDs: applied, PendingOperationIDs: []string{}, Workloads: ws}
	for _, c := range pending {
		r.PendingOperationIDs = append(r.PendingOperationIDs, c.OperationID)
	}
	return r, nil
}

// Workloads answers the latest observation of each of the node's workload
// attempts, by run and attempt id. It is Reconcile's workloads without its
// lists of every applied and pending command, which grow with the node's
// history: the console's node page reads this. Errors: ErrNotFound.
func (s *Service) Workloads(ctx context.Context, nodeID string) ([]Workload, error) {
	if _, err := s.Node(ctx, nodeID); err != nil {
		return nil, err
	}
	return s.store.Workloads(ctx, nodeID)
}

// Workload answers the latest observation of a workload attempt; one never
// reported is absent (which is not an exit). Errors: ErrNotFound (node).
func (s *Service) Workload(ctx context.Context, nodeID, runID, attemptID string) (Workload, error) {
	if _, err := s.Node(ctx, nodeID); err != nil {
		return Workload{}, err
	}
	w, err := s.store.Workload(ctx, nodeID, runID, attemptID)
	if isNoRows(err) {
		return Workload{NodeID: nodeID, RunID: runID, AttemptID: attemptID, State: "absent"}, nil
	}
	return w, err
}

// OfferFilter narrows offers the way a placement would.
type OfferFilter struct {
	// Class keeps nodes eligible for it (or held for anybody).
	Class string
	// MinFreeDiskBytes keeps nodes that measured at least this much free
	// disk; an unmeasurable or never-reported disk never qualifies.
	MinFreeDiskBytes *int64
	// Until keeps nodes available at least until then.
	Until *time.Time
}

// Offer is a ready, priced node published as reusable capacity.
type Offer struct {
	Node Node
	// CommittedUntil is the end of the billing block the node is in now
	// (blocks anchored at enrollment); nil for a node bought in no blocks.
	CommittedUntil *time.Time
}

// Offers answers ready, priced, non-retired nodes matching f. A node with
// no price is never published (never treated as free).
func (s *Service) Offers(ctx context.Context, f OfferFilter) ([]Offer, error) {
	nodes, err := s.store.ReadyPricedNodes(ctx)
	if err != nil {
		return nil, err
	}
	now := s.clock()
	out := []Offer{}
	for _, n := range nodes {
		if !offerMatches(n, f) {
			continue
		}
		out = append(out, Offer{Node: n, CommittedUntil: CommittedUntil(n, now)})
	}
	return out, nil
}

func offerMatches(n Node, f OfferFilter) bool {
	if f.Class != "" && len(n.Purchase.EligibleClasses) > 0 {
		found := false
		for _, c := range n.Purchase.EligibleClasses {
			if c == f.Class {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	if f.MinFreeDiskBytes != nil {
		if n.Disk.State != DiskMeasured || n.Disk.FreeBytes == nil || *n.Disk.FreeBytes < *f.MinFreeDiskBytes {
			return false
		}
	}
	if f.Until != nil && n.Purchase.AvailableUntil != nil && n.Purchase.AvailableUntil.Before(*f.Until) {
		return false
	}
	return true
}

// CommittedUntil answers the end of the billing block n is inside at now:
// blocks of the billing interval, anchored at enrollment. A node bought in
// no blocks (own hardware) or not enrolled has none.
func CommittedUntil(n Node, now time.Time) *time.Time {
	if n.Purchase.BillingIntervalSeconds == nil || n.EnrolledAt == nil {
		return nil
	}
	interval := time.Duration(*n.Purchase.BillingIntervalSeconds) * time.Second
	elapsed := now.Sub(*n.EnrolledAt)
	if elapsed < 0 {
		elapsed = 0
	}
	blocks := elapsed/interval + 1
	end := n.EnrolledAt.Add(blocks * interval).UTC()
	return &end
}
