package fleet

import (
	"context"
	"encoding/json"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/internal/dbtime"
)

// Facts and payload limits (DECISIONS.md §24).
const (
	MaxFactsBytes   = 16 << 10
	MaxPayloadBytes = 256 << 10
	MaxEventBatch   = 500
	maxFailureBytes = 4 << 10
)

// Enroll redeems an enrollment token. Two independent doors: the signer
// (is this material this node's invitation, for this generation, inside its
// window? — enrollment_invalid) and the store (was this exact invitation
// redeemed already? — enrollment_spent, or replaced — enrollment_superseded).
// A retired node is refused before either (DECISIONS.md §6). Redemption, the
// fencing-token bump, the lease, the agent's account of unacknowledged
// results and the fate of unsettled commands are one transaction.
func (s *Service) Enroll(ctx context.Context, req api.EnrollRequest) (api.EnrollResponse, error) {
	now := s.clock()
	if err := validateEnroll(req); err != nil {
		return api.EnrollResponse{}, err
	}
	// node_retired outranks every other refusal.
	if n, err := s.store.Node(ctx, req.NodeID); err == nil && n.State == StateRetired {
		return api.EnrollResponse{}, ErrNodeRetired
	} else if err != nil && !isNoRows(err) {
		return api.EnrollResponse{}, err
	}
	// Door 1: the signer. Needs nothing durable.
	var c enrollClaims
	if err := s.enrollSigner.Verify(req.EnrollmentToken, &c); err != nil {
		return api.EnrollResponse{}, ErrEnrollmentInvalid
	}
	if c.Subject != req.NodeID || c.Generation != req.Generation || c.ID == "" {
		return api.EnrollResponse{}, ErrEnrollmentInvalid
	}
	facts, disk, err := encodeFacts(req.Facts, now)
	if err != nil {
		return api.EnrollResponse{}, err
	}

	var n Node
	var settled []Command
	err = s.store.Tx(ctx, func(tx Tx) error {
		var err error
		n, err = tx.LockNode(ctx, req.NodeID)
		if isNoRows(err) {
			return ErrEnrollmentInvalid
		}
		if err != nil {
			return err
		}
		if n.State == StateRetired {
			return ErrNodeRetired
		}
		// Door 2: the store.
		inv, err := tx.Invitation(ctx, c.ID)
		if isNoRows(err) || (err == nil && (inv.NodeID != n.ID || inv.TokenDigest != digest(req.EnrollmentToken))) {
			return ErrEnrollmentInvalid
		}
		if err != nil {
			return err
		}
		switch inv.State {
		case InvitationRedeemed:
			return ErrEnrollmentSpent
		case InvitationSuperseded:
			return ErrEnrollmentSuperseded
		case InvitationRevoked:
			return ErrNodeRetired
		}
		ok, err := tx.SetInvitationState(ctx, inv.ID, InvitationOutstanding, InvitationRedeemed, now)
		if err != nil {
			return err
		}
		if !ok {
			return ErrEnrollmentSpent
		}

		// The agent's own account first (DECISIONS.md §1) ...
		for _, r := range req.UnacknowledgedResults {
			c, _, err := s.settleTx(ctx, tx, n.ID, r, now)
			if err == nil && c.OperationID != "" {
				settled = append(settled, c)
			} else if err != nil && errcode.Of(err) == errcode.Internal {
				return err
			}
		}
		// ... then a new fencing token, which ends every older session ...
		n.FencingToken++
		n.State = StateReady
		n.EnrolledAt = &now
		lease := now.Add(s.settings.Lease)
		n.LeaseExpiresAt = &lease
		n.AgentVersion = req.AgentVersion
		n.Facts = facts
		observed := dbtime.Norm(req.Facts.ObservedAt)
		n.FactsObservedAt, n.FactsReceivedAt = &observed, &now
		n.Disk = disk
		n.UpdatedAt = now
		if err := tx.UpdateNode(ctx, n); err != nil {
			return err
		}
		// ... then every still-unsettled command is redelivered under it or,
		// if it may have left an effect under an older session, ends
		// outcome_unknown: never applied twice.
		pending, err := tx.Commands(ctx, n.ID, CommandPending, 0)
		if err != nil {
			return err
		}
		redelivered, unknown := 0, 0
		for _, cmd := range pending {
			if cmd.DeliveredFencing != nil && !leavesNoEffectOnFailure(cmd.Kind) {
				cmd.State = CommandRefused
				cmd.FailureCode = string(errcode.OutcomeUnknown)
				cmd.FailureMessage = "delivered to an earlier enrollment that never reported it; reconcile from the node's workload reports"
				cmd.SettledAt = &now
				unknown++
				settled = append(settled, cmd)
			} else {
				cmd.DeliveredFencing = nil
				cmd.LastDeliveredAt = nil
				cmd.FencingToken = n.FencingToken
				redelivered++
			}
			if err := tx.UpdateCommand(ctx, cmd); err != nil {
				return err
			}
		}
		if err := tx.AppendAudit(ctx, AuditEntry{At: now, Actor: "node:" + n.ID, Action: "node.enroll", NodeID: n.ID,
			Detail: map[string]any{"fencing_token": n.FencingToken, "agent_version": req.AgentVersion, "invitation_id": inv.ID,
				"results_settled": len(req.UnacknowledgedResults), "redelivered": redelivered, "outcome_unknown": unknown}}); err != nil {
			return err
		}
		if err := tx.Notify(ctx, Notification{Kind: NotifyNode, NodeID: n.ID}); err != nil {
			return err
		}
		if redelivered > 0 {
			return tx.Notify(ctx, Notification{Kind: NotifyCommands, NodeID: n.ID})
		}
		return nil
	})
	if err != nil {
		return api.EnrollResponse{}, err
	}
	s.leases.forget(n.ID)
	for _, c := range settled {
		s.metrics.CommandsSettled.WithLabelValues(string(c.State)).Inc()
	}
	sess, err := s.mintSession(n.ID, n.FencingToken)
	if err != nil {
		return api.EnrollResponse{}, errNoKey
	}
	return api.EnrollResponse{
		NodeID: n.ID, SessionToken: sess.SessionToken, SessionExpiresAt: sess.SessionExpiresAt,
		SessionTTLSeconds: sess.SessionTTLSeconds, FencingToken: n.FencingToken,
		LeaseSeconds: int64(s.settings.Lease / time.Second), HeartbeatSeconds: int64(s.settings.HeartbeatInterval / time.Second),
	}, nil
}

func validateEnroll(req api.EnrollRequest) error {
	var v errcode.Validation
	v.Check(idPattern.MatchString(req.NodeID), "node_id", "required: the node id from the bootstrap")
	v.Check(req.Generation >= 1, "generation", "must be 1 or more")
	v.Check(req.EnrollmentToken != "", "enrollment_token", "required")
	v.Check(len(req.EnrollmentToken) <= 4096, "enrollment_token", "too long")
	v.Check(len(req.AgentVersion) <= 128, "agent_version", "at most 128 characters")
	v.Check(len(req.UnacknowledgedResults) <= MaxEventBatch, "unacknowledged_results", "at most %d", MaxEventBatch)
	for _, r := range req.UnacknowledgedResults {
		if !idPattern.MatchString(r.OperationID) {
			v.Add("unacknowledged_results", "operation_id must be 1-128 characters of letters, digits, '.', '_', ':' or '-'")
			break
		}
	}
	validateFacts(&v, "facts", req.Facts)
	return v.Err()
}

func validateFacts(v *errcode.Validation, field string, f api.Facts) {
	v.Check(!f.ObservedAt.IsZero(), field+".observed_at", "required: when the node observed these facts")
	v.Check(f.CPUs >= 0, field+".cpus", "must not be negative")
	v.Check(f.MemoryBytes >= 0, field+".memory_bytes", "must not be negative")
	if f.DiskFreeBytes != nil {
		v.Check(*f.DiskFreeBytes >= 0, field+".disk_free_bytes", "must not be negative (leave it out when it could not be measured)")
	}
	v.Check(len(f.Labels) <= 64, field+".labels", "at most 64 labels")
}

// encodeFacts renders facts for storage with the disk's three answers.
func encodeFacts(f api.Facts, now time.Time) (json.RawMessage, Disk, error) {
	b, err := json.Marshal(f)
	if err != nil {
		return nil, Disk{}, err
	}
	if len(b) > MaxFactsBytes {
		return nil, Disk{}, &errcode.Error{Code: errcode.ValidationFailed, Message: "facts exceed 16 KiB",
			Fields: []errcode.FieldError{{Field: "facts", Message: "at most 16 KiB"}}}
	}
	observed := dbtime.Norm(f.ObservedAt)
	d := Disk{State: DiskUnmeasurable, ObservedAt: &observed}
	if f.DiskFreeBytes != nil {
		free := *f.DiskFreeBytes
		d = Disk{State: DiskMeasured, FreeBytes: &free, ObservedAt: &observed}
	}
	return b, d, nil
}
