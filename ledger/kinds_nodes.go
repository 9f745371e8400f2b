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
)

// Node kinds (family nodes) run on the control plane, inside the
// transaction that ends them: an invitation, reinvitation or retirement
// commits with its operation's end, or not at all.
const (
	KindNodeInvite   = "node.invite"
	KindNodeReinvite = "node.reinvite"
	KindNodeRetire   = "node.retire"
)

// InviteOperation is node.invite's operation: the invitation body of
// POST /api/v1/nodes/invitations.
type InviteOperation struct {
	NodeID            string             `json:"node_id,omitempty"`
	RentalID          string             `json:"rental_id"`
	Generation        int64              `json:"generation"`
	ShadowPriceUSD    *float64           `json:"shadow_price_usd_per_hour,omitempty"`
	RedeemableThrough *time.Time         `json:"redeemable_through,omitempty"`
	Purchase          *PurchaseOperation `json:"purchase,omitempty"`
}

// PurchaseOperation is an invitation's purchase terms.
type PurchaseOperation struct {
	BillingIntervalSeconds *int64     `json:"billing_interval_seconds,omitempty"`
	EligibleClasses        []string   `json:"eligible_classes,omitempty"`
	AvailableUntil         *time.Time `json:"available_until,omitempty"`
}

// Invite is the fleet's form of the operation.
func (o InviteOperation) Invite() fleet.Invite {
	in := fleet.Invite{NodeID: o.NodeID, RentalID: o.RentalID, Generation: o.Generation,
		ShadowPriceUSD: o.ShadowPriceUSD, RedeemableThrough: o.RedeemableThrough}
	if p := o.Purchase; p != nil {
		in.Purchase = &fleet.PurchaseTerms{BillingIntervalSeconds: p.BillingIntervalSeconds,
			EligibleClasses: p.EligibleClasses, AvailableUntil: p.AvailableUntil}
	}
	return in
}

// ReinviteOperation is node.reinvite's operation.
type ReinviteOperation struct {
	RedeemableThrough *time.Time `json:"redeemable_through,omitempty"`
}

// RetireOperation is node.retire's operation.
type RetireOperation struct {
	Reason string `json:"reason,omitempty"`
}

// BootstrapResult is what node.invite and node.reinvite record: the
// bootstrap without its enrollment token (a secret never enters the
// ledger; DECISIONS.md §16).
type BootstrapResult struct {
	NodeID          string    `json:"node_id"`
	RentalID        string    `json:"rental_id"`
	Generation      int64     `json:"generation"`
	ExpiresAt       time.Time `json:"expires_at"`
	ControlPlaneURL string    `json:"control_plane_url"`
	AgentVersion    string    `json:"agent_version"`
	// InvitationID lets an administrator's replay mint the identical
	// token again from the invitation's stored claims.
	InvitationID string `json:"invitation_id"`
}

func bootstrapResult(b api.Bootstrap) json.RawMessage {
	return mustJSON(BootstrapResult{NodeID: b.NodeID, RentalID: b.RentalID, Generation: b.Generation,
		ExpiresAt: b.ExpiresAt, ControlPlaneURL: b.ControlPlaneURL, AgentVersion: b.AgentVersion, InvitationID: b.InvitationID})
}

// FieldEnrollmentToken names the secret node.invite and node.reinvite
// generate (their reveal handle's field).
const FieldEnrollmentToken = "enrollment_token"

// revealEnrollment mints the recorded invitation's enrollment token again:
// the identical token (DECISIONS.md §5), never stored.
func revealEnrollment(f *fleet.Service) func(ctx context.Context, op Operation, field string) (string, error) {
	return func(ctx context.Context, op Operation, field string) (string, error) {
		var r BootstrapResult
		if err := json.Unmarshal(op.Result, &r); err != nil {
			return "", err
		}
		return f.RemintEnrollmentToken(ctx, r.InvitationID)
	}
}

// RetireResult is what node.retire records.
type RetireResult struct {
	NodeID    string     `json:"node_id"`
	State     string     `json:"state"`
	RetiredAt *time.Time `json:"retired_at,omitempty"`
	// AlreadyRetired is true when the node was retired before.
	AlreadyRetired bool `json:"already_retired"`
}

// DecodeOperation decodes an operation body strictly: unknown fields and
// trailing data are invalid_json, a JSON null where a value is required
// is validation_failed naming the field.
func DecodeOperation(raw json.RawMessage, out any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		return errcode.Errorf(errcode.InvalidJSON, "operation: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	return nil
}

// actorOf names a principal in the fleet's node audit.
func actorOf(op Operation) string {
	if op.PrincipalKind == PrincipalAdmin {
		return "admin:" + op.PrincipalName
	}
	return "package_host:" + op.PrincipalName
}

// oneNodeTarget requires exactly one node target and answers its id.
func oneNodeTarget(d *Draft) (string, error) {
	if len(d.Targets) != 1 || d.Targets[0].Kind != TargetNode || d.Targets[0].ID == "" {
		return "", validation("targets", "exactly one target {kind: node, id}")
	}
	return d.Targets[0].ID, nil
}

func validation(field, msg string) error {
	var v errcode.Validation
	v.Add(field, "%s", msg)
	return v.Err()
}

// NodeKinds are the kinds of family nodes, carried out by f.
func NodeKinds(f *fleet.Service) []*Kind {
	return []*Kind{
		{
			Name: KindNodeInvite, Family: FamilyNodes, TargetKinds: nodeTarget,
			Prepare: func(ctx context.Context, d *Draft) error {
				var o InviteOperation
				if err := DecodeOperation(d.Operation, &o); err != nil {
					return err
				}
				// "" is not "absent" (which mints an id): it is refused.
				var given struct {
					NodeID *string `json:"node_id"`
				}
				if json.Unmarshal(d.Operation, &given) == nil && given.NodeID != nil && *given.NodeID == "" {
					return validation("operation/node_id", "1-128 characters of letters, digits, '.', '_', ':' or '-' (leave it out to have one minted)")
				}
				// The identity is fixed before anything is recorded, so a
				// re-run after a crash reserves the same node.
				switch {
				case len(d.Targets) == 0:
					if o.NodeID == "" {
						o.NodeID = fleet.NewNodeID()
					}
					d.Targets = []Target{{Kind: TargetNode, ID: o.NodeID}}
				case len(d.Targets) == 1 && d.Targets[0].Kind == TargetNode && (o.NodeID == "" || o.NodeID == d.Targets[0].ID):
					o.NodeID = d.Targets[0].ID
				default:
					return validation("targets", "none, or one {kind: node, id} naming operation.node_id")
				}
				return f.CheckInvite(ctx, o.Invite())
			},
			RunTx: func(ctx context.Context, tx Tx, op Operation) (json.RawMessage, error) {
				var o InviteOperation
				if err := DecodeOperation(op.Operation, &o); err != nil {
					return nil, err
				}
				o.NodeID = op.TargetID
				b, retired, err := f.InviteTx(ctx, tx.Fleet(), actorOf(op), o.Invite())
				if err != nil {
					return nil, err
				}
				for _, id := range retired {
					if err := endRetiredNodeOperations(ctx, tx, id, f.Now()); err != nil {
						return nil, err
					}
				}
				return bootstrapResult(b), nil
			},
			Reveals: []string{FieldEnrollmentToken}, Reveal: revealEnrollment(f),
		},
		{
			Name: KindNodeReinvite, Family: FamilyNodes, TargetKinds: nodeTarget,
			Prepare: func(ctx context.Context, d *Draft) error {
				var o ReinviteOperation
				if err := DecodeOperation(d.Operation, &o); err != nil {
					return err
				}
				id, err := oneNodeTarget(d)
				if err != nil {
					return err
				}
				return f.CheckReinvite(ctx, id, o.RedeemableThrough)
			},
			RunTx: func(ctx context.Context, tx Tx, op Operation) (json.RawMessage, error) {
				var o ReinviteOperation
				if err := DecodeOperation(op.Operation, &o); err != nil {
					return nil, err
				}
				handBack := fleet.SupersedeOutstanding
				if op.PrincipalKind == PrincipalAdmin {
					handBack = fleet.HandBackOutstanding
				}
				b, err := f.ReinviteTx(ctx, tx.Fleet(), actorOf(op), op.TargetID, o.RedeemableThrough, handBack)
				if err != nil {
					return nil, err
				}
				return bootstrapResult(b), nil
			},
			Reveals: []string{FieldEnrollmentToken}, Reveal: revealEnrollment(f),
		},
		{
			Name: KindNodeRetire, Family: FamilyNodes, TargetKinds: nodeTarget, QuotaExempt: true,
			Prepare: func(ctx context.Context, d *Draft) error {
				var o RetireOperation
				if err := DecodeOperation(d.Operation, &o); err != nil {
					return err
				}
				if len(o.Reason) > 512 {
					return validation("operation/reason", "at most 512 characters")
				}
				id, err := oneNodeTarget(d)
				if err != nil {
					return err
				}
				_, err = f.Node(ctx, id)
				return err
			},
			RunTx: func(ctx context.Context, tx Tx, op Operation) (json.RawMessage, error) {
				var o RetireOperation
				if err := DecodeOperation(op.Operation, &o); err != nil {
					return nil, err
				}
				n, changed, err := f.RetireTx(ctx, tx.Fleet(), actorOf(op), op.TargetID, o.Reason)
				if err != nil {
					return nil, err
				}
				if changed {
					if err := endRetiredNodeOperations(ctx, tx, n.ID, f.Now()); err != nil {
						return nil, err
					}
				}
				return mustJSON(RetireResult{NodeID: n.ID, State: string(n.State), RetiredAt: n.RetiredAt, AlreadyRetired: !changed}), nil
			},
		},
	}
}

// endRetiredNodeOperations ends what a retired node will never do
// (DECISIONS.md §38): a command delivered but not answered fails
// outcome_unknown (its node may or may not have applied it; a late answer
// still settles the command, not the operation), a held fan-out child is
// cancelled node_retired. Undelivered commands were already withdrawn by
// the retirement itself (cancelled node_retired).
func endRetiredNodeOperations(ctx context.Context, tx Tx, nodeID string, now time.Time) error {
	open, err := tx.OpenNodeOperations(ctx, nodeID)
	if err != nil {
		return err
	}
	for _, op := range open {
		if op.Channel != ChannelLongPoll {
			continue
		}
		var e *Error
		to := StateFailed
		switch {
		case op.Held:
			to, e = StateCancelled, &Error{Code: "node_retired", Message: "the node was retired before this was handed to it"}
		case op.Kind == KindNodeConfigure:
			e = &Error{Code: "node_retired", Message: "the node was retired before it applied this configuration"}
		case op.State == StateRunning:
			e = &Error{Code: "outcome_unknown", Message: "the node was retired after this was delivered and before it answered; reconcile from its workload reports"}
		default:
			continue
		}
		if _, err := endOperationTx(ctx, tx, op, to, nil, e, now); err != nil {
			return err
		}
	}
	return nil
}
