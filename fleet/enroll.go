package fleet

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"regexp"
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
//
// An enrollment's answer can be lost after it committed (a timeout, a
// dropped connection). Its agent then retries with the same token and the
// nonce it sent before; within Settings.EnrollRetryWindow of the
// enrollment, while no later one superseded it, that retry is answered a
// fresh session at the same fencing token, with nothing refenced or
// redelivered. Anybody else — no nonce, another nonce, too late — is
// still refused enrollment_spent.
func (s *Service) Enroll(ctx context.Context, req api.EnrollRequest) (api.EnrollResponse, error) {
	now := s.clock()
	if err := validateEnroll(req); err != nil {
		return api.EnrollResponse{}, err
	}
	var facts json.RawMessage
	var disk Disk
	var values []string
	claims, err := s.signerDoor(req)
	if err == nil {
		facts, disk, err = encodeFacts(req.Facts, now)
	}
	if err == nil {
		values, err = s.failureValues(ctx, req.UnacknowledgedResults)
	}
	if err != nil {
		// node_retired outranks every other refusal. It is asked only
		// when there is a refusal to rank: on the way in, the store door
		// checks the node it locks, so an enrollment costs no read ahead
		// of its transaction.
		if rerr := s.refuseRetired(ctx, req.NodeID); rerr != nil {
			return api.EnrollResponse{}, rerr
		}
		return api.EnrollResponse{}, err
	}
	var n Node
	var settled []Command
	var again bool
	// The queue bound (Settings.EnrollQueueTimeout) is a deadline on the
	// write's context: the store does not run a request whose context
	// ended while it queued, and once running a request is not cut short.
	queued, cancel := context.WithTimeout(ctx, s.settings.EnrollQueueTimeout)
	defer cancel()
	err = s.store.Tx(OnNode(queued, req.NodeID), func(tx Tx) error {
		var err error
		n, settled, again, err = s.enrollTx(ctx, tx, req, claims, facts, disk, values, now)
		return err
	})
	if err != nil {
		// Statements run without the caller's context, so a deadline
		// here is the queue bound's alone.
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			s.metrics.EnrollmentsShed.Inc()
			return api.EnrollResponse{}, ErrEnrollmentShed
		}
		return api.EnrollResponse{}, err
	}
	if again {
		s.metrics.EnrollmentsAnsweredAgain.Inc()
	} else {
		s.leases.forget(n.ID)
	}
	for _, c := range settled {
		s.metrics.CommandsSettled.WithLabelValues(string(c.State)).Inc()
	}
	return s.enrollResponse(n)
}

// refuseRetired answers ErrNodeRetired for a retired node, the refusal
// that outranks every other. An unknown node passes here; the store door
// refuses it.
func (s *Service) refuseRetired(ctx context.Context, nodeID string) error {
	n, err := s.store.Node(ctx, nodeID)
	switch {
	case isNoRows(err):
		return nil
	case err != nil:
		return err
	case n.State == StateRetired:
		return ErrNodeRetired
	}
	return nil
}

// signerDoor is the first door: the token must verify and name this node,
// this generation and an invitation. It needs nothing durable.
func (s *Service) signerDoor(req api.EnrollRequest) (enrollClaims, error) {
	var c enrollClaims
	if err := s.enrollSigner.Verify(req.EnrollmentToken, &c); err != nil {
		return enrollClaims{}, ErrEnrollmentInvalid
	}
	if c.Subject != req.NodeID || c.Generation != req.Generation || c.ID == "" {
		return enrollClaims{}, ErrEnrollmentInvalid
	}
	return c, nil
}

// enrollTx is the enrollment transaction, in its order: the store door, the
// agent's own account of its results (DECISIONS.md §1), a new fencing token
// (which ends every older session), the fate of unsettled commands, then
// the audit entry and notifications. It answers the enrolled node and every
// command it settled. For its own agent's retry (again) it takes the
// agent's account of its results again (settling is idempotent) and audits
// the retry, and changes nothing else.
func (s *Service) enrollTx(ctx context.Context, tx Tx, req api.EnrollRequest, c enrollClaims,
	facts json.RawMessage, disk Disk, values []string, now time.Time) (n Node, settled []Command, again bool, err error) {
	n, again, err = s.storeDoor(ctx, tx, req, c, now)
	if err != nil {
		return Node{}, nil, false, err
	}
	if settled, err = s.settleUnacknowledged(ctx, tx, n.ID, req.UnacknowledgedResults, values, now); err != nil {
		return Node{}, nil, false, err
	}
	if again {
		err = tx.AppendAudit(ctx, AuditEntry{At: now, Actor: "node:" + n.ID, Action: "node.enroll_retry", NodeID: n.ID,
			Detail: map[string]any{"fencing_token": n.FencingToken, "invitation_id": c.ID, "enrolled_at": n.EnrolledAt,
				"results_settled": len(settled)}})
		return n, settled, true, err
	}
	first := n.FencingToken == 0
	if n, err = s.refence(ctx, tx, n, req, facts, disk, now); err != nil {
		return Node{}, nil, false, err
	}
	var fate pendingFate
	// A node's first enrollment has no commands to decide: commands are
	// recorded only for a ready node, and only an enrollment makes a node
	// ready (the first one bumps fencing from 0). Nor could one have been
	// delivered: no session exists at fencing 0. The read is skipped.
	if !first {
		if fate, err = settlePendingUnderNewFence(ctx, tx, n, now); err != nil {
			return Node{}, nil, false, err
		}
	}
	settled = append(settled, fate.unknown...)
	if err := tx.AppendAudit(ctx, AuditEntry{At: now, Actor: "node:" + n.ID, Action: "node.enroll", NodeID: n.ID,
		Detail: map[string]any{"fencing_token": n.FencingToken, "agent_version": req.AgentVersion, "invitation_id": c.ID,
			"results_settled": len(req.UnacknowledgedResults), "redelivered": fate.redelivered, "outcome_unknown": len(fate.unknown)}}); err != nil {
		return Node{}, nil, false, err
	}
	if err := tx.Notify(ctx, Notification{Kind: NotifyNode, NodeID: n.ID}); err != nil {
		return Node{}, nil, false, err
	}
	if fate.redelivered > 0 {
		if err := tx.Notify(ctx, Notification{Kind: NotifyCommands, NodeID: n.ID}); err != nil {
			return Node{}, nil, false, err
		}
	}
	return n, settled, false, nil
}

// storeDoor is the second door: the node, locked, must not be retired, and
// the token must be this node's stored invitation, still outstanding. It
// redeems the invitation: of two concurrent redemptions only one passes.
// The redemption is tried first, in the statement that locks the node; the
// invitation is read only to name a refusal, and a refusal undoes the
// transaction (the redemption with it). A redeemed invitation presented
// again by the agent that redeemed it (answersAgain) passes with again set.
func (s *Service) storeDoor(ctx context.Context, tx Tx, req api.EnrollRequest, c enrollClaims, now time.Time) (n Node, again bool, err error) {
	d := digest(req.EnrollmentToken)
	n, redeemed, err := tx.RedeemInvitation(ctx, req.NodeID, c.ID, d, now)
	if isNoRows(err) {
		return Node{}, false, ErrEnrollmentInvalid
	}
	if err != nil {
		return Node{}, false, err
	}
	if n.State == StateRetired {
		return Node{}, false, ErrNodeRetired
	}
	if redeemed {
		return n, false, nil
	}
	inv, err := tx.Invitation(ctx, c.ID)
	if isNoRows(err) || (err == nil && (inv.NodeID != n.ID || inv.TokenDigest != d)) {
		return Node{}, false, ErrEnrollmentInvalid
	}
	if err != nil {
		return Node{}, false, err
	}
	switch inv.State {
	case InvitationSuperseded:
		return Node{}, false, ErrEnrollmentSuperseded
	case InvitationRevoked:
		return Node{}, false, ErrNodeRetired
	}
	// Redeemed, by an earlier enrollment or a concurrent one that won.
	if s.answersAgain(n, req.EnrollmentNonce, now) {
		return n, true, nil
	}
	return Node{}, false, ErrEnrollmentSpent
}

// answersAgain reports whether n's latest enrollment, recent enough, carried
// nonce. The nonce is the agent's own random value, sent only to the
// server over the enrollment's own connection and kept in the agent's
// state directory beside the session it is for, so whoever presents it
// again is that agent: answering it a session gives nobody standing they
// did not already have. A later enrollment replaces the digest, so only the
// current fencing token is ever answered again.
func (s *Service) answersAgain(n Node, nonce string, now time.Time) bool {
	if nonce == "" || n.EnrollNonceDigest == "" || n.EnrolledAt == nil || now.Sub(*n.EnrolledAt) > s.settings.EnrollRetryWindow {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(digest(nonce)), []byte(n.EnrollNonceDigest)) == 1
}

// settleUnacknowledged takes the agent's own account of results it never
// had acknowledged, before any fencing changes. A result that cannot be
// taken (unknown operation, another node's) is skipped; only a store
// failure ends the enrollment. It answers the commands it settled.
func (s *Service) settleUnacknowledged(ctx context.Context, tx Tx, nodeID string, results []api.Result, values []string, now time.Time) ([]Command, error) {
	if len(results) == 0 {
		return nil, nil
	}
	ids := make([]string, len(results))
	for i, r := range results {
		ids[i] = r.OperationID
	}
	locked, err := tx.LockCommands(ctx, ids)
	if err != nil {
		return nil, err
	}
	var settled, fresh []Command
	for _, r := range results {
		c, isNew, err := s.settleOne(locked, nodeID, r, values, now)
		if err == nil && c.OperationID != "" {
			settled = append(settled, c)
			if isNew {
				fresh = append(fresh, c)
			}
		} else if err != nil && errcode.Of(err) == errcode.Internal {
			return nil, err
		}
	}
	_, err = tx.SettleCommands(ctx, fresh)
	return settled, err
}

// refence gives n a new fencing token, which ends every older session, and
// makes it ready with a fresh lease and the facts it enrolled with.
func (s *Service) refence(ctx context.Context, tx Tx, n Node, req api.EnrollRequest, facts json.RawMessage, disk Disk, now time.Time) (Node, error) {
	if err := n.moveTo(StateReady); err != nil {
		return Node{}, err
	}
	n.FencingToken++
	n.EnrolledAt = &now
	lease := now.Add(s.settings.Lease)
	n.LeaseExpiresAt = &lease
	n.AgentVersion = req.AgentVersion
	n.Facts = facts
	observed := dbtime.Norm(req.Facts.ObservedAt)
	n.FactsObservedAt, n.FactsReceivedAt = &observed, &now
	n.Disk = disk
	n.EnrollNonceDigest = ""
	if req.EnrollmentNonce != "" {
		n.EnrollNonceDigest = digest(req.EnrollmentNonce)
	}
	n.UpdatedAt = now
	return n, tx.UpdateNode(ctx, n)
}

// pendingFate is what a re-enrollment did with the node's unsettled
// commands.
type pendingFate struct {
	redelivered int
	unknown     []Command // ended outcome_unknown
}

// settlePendingUnderNewFence decides each still-unsettled command of n:
// redelivered under the new fencing token or, if it may have left an effect
// under an older session, ended outcome_unknown — never applied twice.
func settlePendingUnderNewFence(ctx context.Context, tx Tx, n Node, now time.Time) (pendingFate, error) {
	pending, err := tx.Commands(ctx, n.ID, CommandPending, 0)
	if err != nil {
		return pendingFate{}, err
	}
	var fate pendingFate
	for _, cmd := range pending {
		if cmd.DeliveredFencing != nil && !LeavesNoEffectOnFailure(cmd.Kind) {
			cmd.State = CommandRefused
			cmd.FailureCode = string(errcode.OutcomeUnknown)
			cmd.FailureMessage = "delivered to an earlier enrollment that never reported it; reconcile from the node's workload reports"
			cmd.SettledAt = &now
			fate.unknown = append(fate.unknown, cmd)
		} else {
			cmd.DeliveredFencing = nil
			cmd.LastDeliveredAt = nil
			cmd.FencingToken = n.FencingToken
			fate.redelivered++
		}
		if err := tx.UpdateCommand(ctx, cmd); err != nil {
			return pendingFate{}, err
		}
	}
	return fate, nil
}

// enrollResponse mints the session of n's new fencing token.
func (s *Service) enrollResponse(n Node) (api.EnrollResponse, error) {
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
	v.Check(req.EnrollmentNonce == "" || noncePattern.MatchString(req.EnrollmentNonce), "enrollment_nonce",
		"22-128 characters of letters, digits, '-' or '_' (at least 128 random bits, base64url)")
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
	v.Check(!f.ObservedAt.IsZero(), field+"/observed_at", "required: when the node observed these facts")
	v.Check(f.CPUs >= 0, field+"/cpus", "must not be negative")
	v.Check(f.MemoryBytes >= 0, field+"/memory_bytes", "must not be negative")
	if f.DiskFreeBytes != nil {
		v.Check(*f.DiskFreeBytes >= 0, field+"/disk_free_bytes", "must not be negative (leave it out when it could not be measured)")
	}
	v.Check(len(f.Labels) <= 64, field+"/labels", "at most 64 labels")
	v.Check(len(f.Capabilities) <= 64, field+"/capabilities", "at most 64 capabilities")
	for _, c := range f.Capabilities {
		if !capabilityPattern.MatchString(c) {
			v.Add(field+"/capabilities", "each a name.vN string, like commands.v1")
			break
		}
	}
}

var noncePattern = regexp.MustCompile(`^[A-Za-z0-9_-]{22,128}$`)

var capabilityPattern = regexp.MustCompile(`^[a-z][a-z0-9_]*\.v[0-9]+$`)

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
