package fleet

import (
	"context"
	"errors"
	"math"
	"regexp"
	"sort"
	"strconv"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
)

// Invite is an invitation request: the identity to reserve and its terms.
type Invite struct {
	NodeID            string
	RentalID          string
	Generation        int64
	ShadowPriceUSD    *float64
	RedeemableThrough *time.Time
	Purchase          *PurchaseTerms
}

// PurchaseTerms as asked for in an invitation.
type PurchaseTerms struct {
	BillingIntervalSeconds *int64
	EligibleClasses        []string
	AvailableUntil         *time.Time
}

var (
	idPattern    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)
	classPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
)

// ValidID reports whether s is an id as the fleet's records take them
// (a node id, a run or attempt id): what a cursor naming one must be.
func ValidID(s string) bool { return idPattern.MatchString(s) }

// maxPriceUSD bounds a shadow price: a typo of a million dollars an hour is
// refused rather than published.
const maxPriceUSD = 100000

func (s *Service) validateInvite(in Invite, now time.Time) (Node, time.Time, error) {
	var v errcode.Validation
	if in.NodeID != "" {
		v.Check(idPattern.MatchString(in.NodeID), "node_id", "1-128 characters of letters, digits, '.', '_', ':' or '-'")
	}
	v.Check(idPattern.MatchString(in.RentalID), "rental_id", "required: 1-128 characters of letters, digits, '.', '_', ':' or '-'")
	v.Check(in.Generation >= 1, "generation", "must be 1 or more")
	n := Node{ID: in.NodeID, RentalID: in.RentalID, Generation: in.Generation, State: StateEnrolling,
		CreatedAt: now, UpdatedAt: now, Disk: Disk{State: DiskNeverReported}}
	if p := in.ShadowPriceUSD; p != nil {
		ok := !math.IsNaN(*p) && !math.IsInf(*p, 0) && *p > 0 && *p <= maxPriceUSD
		v.Check(ok, "shadow_price_usd_per_hour", "must be more than 0 and at most %d", maxPriceUSD)
		if ok {
			micros := int64(math.Round(*p * 1e6))
			v.Check(micros > 0, "shadow_price_usd_per_hour", "must be at least 0.000001")
			n.PriceMicros = &micros
		}
	}
	through := now.Add(s.settings.DefaultRedeemable)
	if in.RedeemableThrough != nil {
		through = *in.RedeemableThrough
		v.Check(through.After(now), "redeemable_through", "must be in the future")
		v.Check(!through.After(now.Add(s.settings.MaxRedeemable)), "redeemable_through", "must be at most %s ahead", s.settings.MaxRedeemable)
	}
	if p := in.Purchase; p != nil {
		if p.BillingIntervalSeconds != nil {
			v.Check(*p.BillingIntervalSeconds > 0, "purchase/billing_interval_seconds", "must be more than 0 (leave it out for own hardware)")
		}
		seen := map[string]bool{}
		for i, c := range p.EligibleClasses {
			v.Check(classPattern.MatchString(c), "purchase/eligible_classes", "class %d: 1-64 characters of letters, digits, '.', '_' or '-'", i)
			v.Check(!seen[c], "purchase/eligible_classes", "class %q listed twice", c)
			seen[c] = true
		}
		v.Check(len(p.EligibleClasses) <= 64, "purchase/eligible_classes", "at most 64 classes")
		if p.AvailableUntil != nil {
			v.Check(p.AvailableUntil.After(now), "purchase/available_until", "must be in the future")
		}
		classes := append([]string(nil), p.EligibleClasses...)
		sort.Strings(classes)
		n.Purchase = Purchase{BillingIntervalSeconds: p.BillingIntervalSeconds, EligibleClasses: classes, AvailableUntil: p.AvailableUntil}
	}
	return n, through.UTC(), v.Err()
}

// Invite reserves a node identity before any machine exists and answers its
// bootstrap. Inviting a higher generation of a rental retires the lower
// ones in the same transaction. Errors: validation_failed,
// ErrIdentityExists, ErrGenerationStale.
func (s *Service) Invite(ctx context.Context, actor string, in Invite) (api.Bootstrap, error) {
	var out api.Bootstrap
	var retired []string
	err := s.store.Tx(ctx, func(tx Tx) error {
		var err error
		out, retired, err = s.inviteTx(ctx, tx, actor, in)
		return err
	})
	if err != nil {
		return api.Bootstrap{}, err
	}
	for _, id := range retired {
		s.afterRetire(id)
	}
	return out, nil
}

// InviteTx is Invite inside a transaction the caller owns (the ledger's),
// so the invitation commits with the operation that asked for it. It also
// answers the lower generations it retired.
func (s *Service) InviteTx(ctx context.Context, tx Tx, actor string, in Invite) (api.Bootstrap, []string, error) {
	return s.inviteTx(ctx, tx, actor, in)
}

// CheckInvite refuses, without writing anything, an invitation that Invite
// would refuse now: validation_failed, ErrIdentityExists,
// ErrGenerationStale.
func (s *Service) CheckInvite(ctx context.Context, in Invite) error {
	n, _, err := s.validateInvite(in, s.clock())
	if err != nil {
		return err
	}
	// One unlocked read for both checks (InviteTx checks again, locked):
	// the id taken first, then the rental's generations.
	found, err := s.store.InviteConflicts(ctx, n.ID, n.RentalID)
	if err != nil {
		return err
	}
	var siblings []Node
	for _, f := range found {
		if n.ID != "" && f.ID == n.ID {
			return ErrIdentityExists
		}
		if f.RentalID == n.RentalID {
			siblings = append(siblings, f)
		}
	}
	return siblingConflict(siblings, n)
}

// checkSiblings answers the rental's other generations, refusing a
// generation that exists or is older than the newest.
func checkSiblings(ctx context.Context, tx Tx, n Node) ([]Node, error) {
	siblings, err := tx.NodesOfRental(ctx, n.RentalID)
	if err != nil {
		return nil, err
	}
	if err := siblingConflict(siblings, n); err != nil {
		return nil, err
	}
	return siblings, nil
}

// siblingConflict refuses a generation of the rental that exists or is
// older than the newest (siblings lowest generation first).
func siblingConflict(siblings []Node, n Node) error {
	for _, sib := range siblings {
		switch {
		case sib.Generation == n.Generation:
			return ErrIdentityExists
		case sib.Generation > n.Generation:
			return ErrGenerationStale
		}
	}
	return nil
}

func (s *Service) inviteTx(ctx context.Context, tx Tx, actor string, in Invite) (api.Bootstrap, []string, error) {
	now := s.clock()
	n, through, err := s.validateInvite(in, now)
	if err != nil {
		return api.Bootstrap{}, nil, err
	}
	if n.ID == "" {
		n.ID = randomID()
	}
	inv := Invitation{ID: randomID(), NodeID: n.ID, Generation: n.Generation, IssuedAt: now.Truncate(time.Second),
		ExpiresAt: wholeSecondThrough(through), State: InvitationOutstanding}
	token, err := s.mintEnrollment(inv)
	if err != nil {
		return api.Bootstrap{}, nil, errNoKey
	}
	inv.TokenDigest = digest(token)
	if _, err := tx.LockNode(ctx, n.ID); err == nil {
		return api.Bootstrap{}, nil, ErrIdentityExists
	} else if !isNoRows(err) {
		return api.Bootstrap{}, nil, err
	}
	siblings, err := checkSiblings(ctx, tx, n)
	if err != nil {
		return api.Bootstrap{}, nil, err
	}
	var retired []string
	for _, sib := range siblings {
		if sib.State == StateRetired {
			continue
		}
		if _, err := s.retireTx(ctx, tx, sib, actor, now, "superseded by generation "+strconv.FormatInt(n.Generation, 10)); err != nil {
			return api.Bootstrap{}, nil, err
		}
		retired = append(retired, sib.ID)
	}
	if err := tx.InsertNode(ctx, n); err != nil {
		if errors.Is(err, ErrDuplicate) {
			return api.Bootstrap{}, nil, ErrIdentityExists
		}
		return api.Bootstrap{}, nil, err
	}
	if err := tx.InsertInvitation(ctx, inv); err != nil {
		return api.Bootstrap{}, nil, err
	}
	err = tx.AppendAudit(ctx, AuditEntry{At: now, Actor: actor, Action: "node.invite", NodeID: n.ID,
		Detail: map[string]any{"rental_id": n.RentalID, "generation": n.Generation, "invitation_id": inv.ID,
			"expires_at": inv.ExpiresAt, "retired_generations": retired}})
	return s.bootstrap(n, inv, token), retired, err
}

// RemintEnrollmentToken is RemintBootstrap's token alone: one unlocked
// read of the invitation (its claims are immutable), no transaction and no
// read of the node — what an invite's submit reveals inline. Errors: as
// RemintBootstrap.
func (s *Service) RemintEnrollmentToken(ctx context.Context, invitationID string) (string, error) {
	inv, err := s.store.ReadInvitation(ctx, invitationID)
	if isNoRows(err) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", err
	}
	tok, err := s.mintEnrollment(inv)
	if err != nil {
		return "", errNoKey
	}
	if digest(tok) != inv.TokenDigest {
		return "", errcode.New(errcode.Unavailable, "the enrollment token can no longer be shown (the master key was rotated since); reinvite the node")
	}
	return tok, nil
}

// BootstrapOf is the bootstrap of an invitation already read (an invite's
// recorded result) with its token in hand (the value its submit just
// revealed): what RemintBootstrap would answer, without reading the
// invitation and the node again.
func (s *Service) BootstrapOf(nodeID, rentalID string, generation int64, invitationID string, expiresAt time.Time, token string) api.Bootstrap {
	return s.bootstrap(Node{ID: nodeID, RentalID: rentalID, Generation: generation},
		Invitation{ID: invitationID, ExpiresAt: expiresAt}, token)
}

func (s *Service) bootstrap(n Node, inv Invitation, token string) api.Bootstrap {
	return api.Bootstrap{NodeID: n.ID, RentalID: n.RentalID, Generation: n.Generation, EnrollmentToken: token, InvitationID: inv.ID,
		ExpiresAt: inv.ExpiresAt, ControlPlaneURL: s.settings.PublicURL, AgentVersion: s.settings.AgentVersion,
		CACertificatePEM: s.settings.CACertificatePEM}
}

// Reinvite answers a bootstrap for an existing node. An outstanding
// invitation still good through the caller's wait is handed back unchanged
// (provisioning asks on every attempt; replacing the token would strand a
// machine already booting with it). A fresh one is minted only when the old
// was redeemed, has expired, or closes before the wait ends; a still-valid
// token it replaces then answers enrollment_superseded. The node's state
// does not change until it re-enrolls. Reinvite answers as to an
// administrator (see ReinviteTx). Errors: ErrNotFound, ErrNodeRetired,
// validation_failed.
func (s *Service) Reinvite(ctx context.Context, actor, nodeID string, redeemableThrough *time.Time) (api.Bootstrap, error) {
	var out api.Bootstrap
	err := s.store.Tx(ctx, func(tx Tx) error {
		var err error
		out, err = s.ReinviteTx(ctx, tx, actor, nodeID, redeemableThrough, HandBackOutstanding)
		return err
	})
	return out, err
}

// CheckReinvite refuses, without writing anything, a reinvite that
// Reinvite would refuse now: validation_failed, ErrNotFound,
// ErrNodeRetired.
func (s *Service) CheckReinvite(ctx context.Context, nodeID string, redeemableThrough *time.Time) error {
	if _, err := s.reinviteThrough(redeemableThrough); err != nil {
		return err
	}
	n, err := s.Node(ctx, nodeID)
	if err == nil && n.State == StateRetired {
		return ErrNodeRetired
	}
	return err
}

func (s *Service) reinviteThrough(redeemableThrough *time.Time) (time.Time, error) {
	now := s.clock()
	through := now.Add(s.settings.DefaultRedeemable)
	if redeemableThrough != nil {
		through = redeemableThrough.UTC()
		var v errcode.Validation
		v.Check(through.After(now), "redeemable_through", "must be in the future")
		v.Check(!through.After(now.Add(s.settings.MaxRedeemable)), "redeemable_through", "must be at most %s ahead", s.settings.MaxRedeemable)
		if err := v.Err(); err != nil {
			return time.Time{}, err
		}
	}
	return through, nil
}

// Outstanding says what a reinvite does with an outstanding invitation
// still good through the caller's wait.
type Outstanding bool

const (
	// HandBackOutstanding answers it unchanged, its identical token minted
	// again: the one exception to "shown once", for administrators only
	// (DECISIONS.md §5).
	HandBackOutstanding Outstanding = true
	// SupersedeOutstanding mints a fresh token that supersedes it: a
	// package host never sees the same enrollment token twice.
	SupersedeOutstanding Outstanding = false
)

// ReinviteTx is Reinvite inside a transaction the caller owns; outstanding
// says whether a still-good invitation may be handed back.
func (s *Service) ReinviteTx(ctx context.Context, tx Tx, actor, nodeID string, redeemableThrough *time.Time, outstanding Outstanding) (api.Bootstrap, error) {
	now := s.clock()
	through, err := s.reinviteThrough(redeemableThrough)
	if err != nil {
		return api.Bootstrap{}, err
	}
	var out api.Bootstrap
	err = func() error {
		n, err := tx.LockNode(ctx, nodeID)
		if isNoRows(err) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		if n.State == StateRetired {
			return ErrNodeRetired
		}
		open, err := tx.OutstandingInvitations(ctx, nodeID)
		if err != nil {
			return err
		}
		for _, inv := range open {
			if outstanding == HandBackOutstanding && !inv.ExpiresAt.Before(through) {
				tok, err := s.mintEnrollment(inv)
				if err != nil {
					return errNoKey
				}
				// After a key rotation the re-mint differs; then the old
				// token can't be handed back and a fresh one is minted.
				if digest(tok) == inv.TokenDigest {
					out = s.bootstrap(n, inv, tok)
					return nil
				}
			}
		}
		for _, old := range open {
			if _, err := tx.SetInvitationState(ctx, old.ID, InvitationOutstanding, InvitationSuperseded, now); err != nil {
				return err
			}
		}
		inv := Invitation{ID: randomID(), NodeID: n.ID, Generation: n.Generation, IssuedAt: now.Truncate(time.Second),
			ExpiresAt: wholeSecondThrough(through), State: InvitationOutstanding}
		tok, err := s.mintEnrollment(inv)
		if err != nil {
			return errNoKey
		}
		inv.TokenDigest = digest(tok)
		if err := tx.InsertInvitation(ctx, inv); err != nil {
			return err
		}
		out = s.bootstrap(n, inv, tok)
		return tx.AppendAudit(ctx, AuditEntry{At: now, Actor: actor, Action: "node.reinvite", NodeID: n.ID,
			Detail: map[string]any{"invitation_id": inv.ID, "expires_at": inv.ExpiresAt, "superseded": len(open)}})
	}()
	return out, err
}

// RemintBootstrap answers an invitation's bootstrap with its enrollment
// token minted again from the stored claims: an HMAC-signed token is
// deterministic, so it is the identical token, shown again to an
// administrator replaying the request that created it (DECISIONS.md §35).
// Errors: ErrNotFound; unavailable when the master key rotated since (the
// re-mint no longer matches the stored digest).
func (s *Service) RemintBootstrap(ctx context.Context, invitationID string) (api.Bootstrap, error) {
	var out api.Bootstrap
	err := s.store.Tx(ctx, func(tx Tx) error {
		inv, err := tx.Invitation(ctx, invitationID)
		if isNoRows(err) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		n, err := tx.Node(ctx, inv.NodeID)
		if err != nil {
			return err
		}
		tok, err := s.mintEnrollment(inv)
		if err != nil {
			return errNoKey
		}
		if digest(tok) != inv.TokenDigest {
			return errcode.New(errcode.Unavailable, "the enrollment token can no longer be shown (the master key was rotated since); reinvite the node")
		}
		out = s.bootstrap(n, inv, tok)
		return nil
	})
	return out, err
}

// wholeSecondThrough answers the expiry a token carries for a window that
// must stay open through t: JWT times are whole seconds, and rounding down
// would close it before the caller's wait ends (and a reinvite asking for
// the same t would never find it good through).
func wholeSecondThrough(t time.Time) time.Time {
	if w := t.Truncate(time.Second); w.Before(t) {
		return w.Add(time.Second)
	}
	return t
}
