package fleet_test

import (
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/testwait"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

func TestStateMachine(t *testing.T) {
	all := []fleet.State{fleet.StateEnrolling, fleet.StateReady, fleet.StateLost, fleet.StateRetired}
	allowed := map[[2]fleet.State]bool{
		{fleet.StateEnrolling, fleet.StateReady}:   true,
		{fleet.StateEnrolling, fleet.StateRetired}: true,
		{fleet.StateReady, fleet.StateReady}:       true, // re-enrollment
		{fleet.StateReady, fleet.StateLost}:        true,
		{fleet.StateReady, fleet.StateRetired}:     true,
		{fleet.StateLost, fleet.StateReady}:        true,
		{fleet.StateLost, fleet.StateRetired}:      true,
	}
	for _, from := range all {
		for _, to := range all {
			want := allowed[[2]fleet.State{from, to}]
			require.Equal(t, want, fleet.CanTransition(from, to), "%s -> %s", from, to)
		}
	}
}

func TestInvite(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		t.Run("MintsIDAndAnswersBootstrap", func(t *testing.T) {
			price := 0.25
			boot := b.invite(t, fleet.Invite{RentalID: "r-mint", Generation: 1, ShadowPriceUSD: &price})
			require.NotEmpty(t, boot.NodeID)
			require.NotEmpty(t, boot.EnrollmentToken)
			require.Equal(t, "https://cp.example", boot.ControlPlaneURL)
			require.Equal(t, "1.2.3", boot.AgentVersion)
			require.Equal(t, b.clock.Now().Add(30*time.Minute), boot.ExpiresAt)
			n, err := b.svc.Node(ctx, boot.NodeID)
			require.NoError(t, err)
			require.Equal(t, fleet.StateEnrolling, n.State)
			require.Equal(t, int64(250000), *n.PriceMicros)
			require.Equal(t, fleet.DiskNeverReported, n.Disk.State)
			// The token itself is never stored: only its digest.
			var stored models.Invitation
			require.NoError(t, b.db.Where("node_id = ?", boot.NodeID).Take(&stored).Error)
			require.NotContains(t, stored.TokenDigest, boot.EnrollmentToken)
			require.Len(t, stored.TokenDigest, 64)
		})
		t.Run("ExistingIDIsIdentityExists", func(t *testing.T) {
			b.invite(t, fleet.Invite{NodeID: "fixed-1", RentalID: "r-fixed"})
			_, err := b.svc.Invite(ctx, "a", fleet.Invite{NodeID: "fixed-1", RentalID: "r-other", Generation: 1})
			requireCode(t, err, fleet.ErrIdentityExists)
		})
		t.Run("SameRentalGenerationIsIdentityExists", func(t *testing.T) {
			b.invite(t, fleet.Invite{RentalID: "r-same", Generation: 2})
			_, err := b.svc.Invite(ctx, "a", fleet.Invite{RentalID: "r-same", Generation: 2})
			requireCode(t, err, fleet.ErrIdentityExists)
		})
		t.Run("HigherGenerationRetiresLower", func(t *testing.T) {
			g1 := b.invite(t, fleet.Invite{RentalID: "r-gen", Generation: 1})
			b.enroll(t, g1)
			g2 := b.invite(t, fleet.Invite{RentalID: "r-gen", Generation: 2})
			n1, err := b.svc.Node(ctx, g1.NodeID)
			require.NoError(t, err)
			require.Equal(t, fleet.StateRetired, n1.State)
			n2, err := b.svc.Node(ctx, g2.NodeID)
			require.NoError(t, err)
			require.Equal(t, fleet.StateEnrolling, n2.State)
			_, err = b.svc.Invite(ctx, "a", fleet.Invite{RentalID: "r-gen", Generation: 1})
			requireCode(t, err, fleet.ErrIdentityExists)
		})
		t.Run("LowerGenerationIsStale", func(t *testing.T) {
			b.invite(t, fleet.Invite{RentalID: "r-stale", Generation: 5})
			_, err := b.svc.Invite(ctx, "a", fleet.Invite{RentalID: "r-stale", Generation: 3})
			requireCode(t, err, fleet.ErrGenerationStale)
		})
	})
}

func TestInviteValidation(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		now := b.clock.Now()
		neg, zero, nan := -1.0, 0.0, 1e9
		interval0 := int64(0)
		past := now.Add(-time.Second)
		tooFar := now.Add(7*24*time.Hour + time.Second)
		cases := []struct {
			name  string
			in    fleet.Invite
			field string
		}{
			{"NoRental", fleet.Invite{Generation: 1}, "rental_id"},
			{"BadRental", fleet.Invite{RentalID: "has space", Generation: 1}, "rental_id"},
			{"ZeroGeneration", fleet.Invite{RentalID: "r", Generation: 0}, "generation"},
			{"BadNodeID", fleet.Invite{NodeID: "../x", RentalID: "r", Generation: 1}, "node_id"},
			{"NegativePrice", fleet.Invite{RentalID: "r", Generation: 1, ShadowPriceUSD: &neg}, "shadow_price_usd_per_hour"},
			{"ZeroPrice", fleet.Invite{RentalID: "r", Generation: 1, ShadowPriceUSD: &zero}, "shadow_price_usd_per_hour"},
			{"AbsurdPrice", fleet.Invite{RentalID: "r", Generation: 1, ShadowPriceUSD: &nan}, "shadow_price_usd_per_hour"},
			{"PastRedeemable", fleet.Invite{RentalID: "r", Generation: 1, RedeemableThrough: &past}, "redeemable_through"},
			{"TooFarRedeemable", fleet.Invite{RentalID: "r", Generation: 1, RedeemableThrough: &tooFar}, "redeemable_through"},
			{"ZeroInterval", fleet.Invite{RentalID: "r", Generation: 1, Purchase: &fleet.PurchaseTerms{BillingIntervalSeconds: &interval0}}, "purchase/billing_interval_seconds"},
			{"BadClass", fleet.Invite{RentalID: "r", Generation: 1, Purchase: &fleet.PurchaseTerms{EligibleClasses: []string{"ok", "not ok"}}}, "purchase/eligible_classes"},
			{"PastAvailable", fleet.Invite{RentalID: "r", Generation: 1, Purchase: &fleet.PurchaseTerms{AvailableUntil: &past}}, "purchase/available_until"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				before := dbtest.Count(t, b.db.DB, &models.Node{})
				_, err := b.svc.Invite(ctx, "a", tc.in)
				var e *errcode.Error
				require.True(t, errors.As(err, &e), "got %v", err)
				require.Equal(t, errcode.ValidationFailed, e.Code)
				require.Equal(t, tc.field, e.Fields[0].Field)
				require.Equal(t, before, dbtest.Count(t, b.db.DB, &models.Node{}), "a refusal writes nothing")
			})
		}
	})
}

func TestEnroll(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		t.Run("OpensLeaseAndBumpsFencing", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			resp := b.enroll(t, boot)
			require.Equal(t, int64(1), resp.FencingToken)
			require.Equal(t, int64(90), resp.LeaseSeconds)
			require.Equal(t, int64(30), resp.HeartbeatSeconds)
			require.Equal(t, b.clock.Now().Add(30*time.Minute), resp.SessionExpiresAt)
			require.Equal(t, int64(1800), resp.SessionTTLSeconds)
			n, err := b.svc.Node(ctx, boot.NodeID)
			require.NoError(t, err)
			require.Equal(t, fleet.StateReady, n.State)
			require.Equal(t, b.clock.Now().Add(90*time.Second), *n.LeaseExpiresAt)
			require.Equal(t, "1.2.3", n.AgentVersion)
			require.Equal(t, fleet.DiskMeasured, n.Disk.State)
			var f api.Facts
			require.NoError(t, json.Unmarshal(n.Facts, &f))
			require.Equal(t, "h1", f.Hostname)
		})
		t.Run("ReplayedTokenIsSpent", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			b.enroll(t, boot)
			_, err := b.svc.Enroll(ctx, enrollReq(boot, b.clock.Now()))
			requireCode(t, err, fleet.ErrEnrollmentSpent)
		})
		t.Run("ExpiryAtTheExactSecond", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			// Valid through expiry plus the 5 s JWT leeway, not a moment longer.
			b.clock.Set(boot.ExpiresAt.Add(5*time.Second - time.Nanosecond))
			defer b.clock.Set(newClock().Now())
			_, err := b.svc.Enroll(ctx, enrollReq(boot, b.clock.Now()))
			require.NoError(t, err)

			late := b.invite(t, fleet.Invite{})
			b.clock.Set(late.ExpiresAt.Add(5 * time.Second))
			_, err = b.svc.Enroll(ctx, enrollReq(late, b.clock.Now()))
			requireCode(t, err, fleet.ErrEnrollmentInvalid)
		})
		t.Run("TokenOfAnotherNodeIsInvalid", func(t *testing.T) {
			a := b.invite(t, fleet.Invite{})
			c := b.invite(t, fleet.Invite{})
			req := enrollReq(c, b.clock.Now())
			req.EnrollmentToken = a.EnrollmentToken
			_, err := b.svc.Enroll(ctx, req)
			requireCode(t, err, fleet.ErrEnrollmentInvalid)
		})
		t.Run("WrongGenerationIsInvalid", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			req := enrollReq(boot, b.clock.Now())
			req.Generation = 2
			_, err := b.svc.Enroll(ctx, req)
			requireCode(t, err, fleet.ErrEnrollmentInvalid)
		})
		t.Run("RetiredOutranksInvalid", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			_, err := b.svc.Retire(ctx, "a", boot.NodeID, "")
			require.NoError(t, err)
			req := enrollReq(boot, b.clock.Now())
			req.EnrollmentToken = "garbage"
			_, err = b.svc.Enroll(ctx, req)
			requireCode(t, err, fleet.ErrNodeRetired)
		})
		t.Run("RetiredOutranksOversizedFacts", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			_, err := b.svc.Retire(ctx, "a", boot.NodeID, "")
			require.NoError(t, err)
			req := enrollReq(boot, b.clock.Now())
			req.Facts.Labels = map[string]string{"big": strings.Repeat("x", fleet.MaxFactsBytes)}
			_, err = b.svc.Enroll(ctx, req)
			requireCode(t, err, fleet.ErrNodeRetired)
		})
		t.Run("RetiredWithItsOwnToken", func(t *testing.T) {
			// The signer door passes: the store door's locked node refuses.
			boot := b.invite(t, fleet.Invite{})
			_, err := b.svc.Retire(ctx, "a", boot.NodeID, "")
			require.NoError(t, err)
			_, err = b.svc.Enroll(ctx, enrollReq(boot, b.clock.Now()))
			requireCode(t, err, fleet.ErrNodeRetired)
		})
		t.Run("OversizedFactsOfALiveNodeAreValidationFailed", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			req := enrollReq(boot, b.clock.Now())
			req.Facts.Labels = map[string]string{"big": strings.Repeat("x", fleet.MaxFactsBytes)}
			_, err := b.svc.Enroll(ctx, req)
			var e *errcode.Error
			require.ErrorAs(t, err, &e)
			require.Equal(t, errcode.ValidationFailed, e.Code)
			b.enroll(t, boot) // nothing was redeemed
		})
		t.Run("UnknownNodeIsInvalid", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			req := enrollReq(boot, b.clock.Now())
			req.NodeID = "no-such-node"
			_, err := b.svc.Enroll(ctx, req)
			requireCode(t, err, fleet.ErrEnrollmentInvalid)
		})
		t.Run("SupersededByReinvite", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			through := b.clock.Now().Add(2 * time.Hour)
			fresh, err := b.svc.Reinvite(ctx, "a", boot.NodeID, &through)
			require.NoError(t, err)
			require.NotEqual(t, boot.EnrollmentToken, fresh.EnrollmentToken)
			_, err = b.svc.Enroll(ctx, enrollReq(boot, b.clock.Now()))
			requireCode(t, err, fleet.ErrEnrollmentSuperseded)
			b.enroll(t, fresh)
		})
		t.Run("InvalidFactsRefusedWritingNothing", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			req := enrollReq(boot, b.clock.Now())
			req.Facts.ObservedAt = time.Time{}
			_, err := b.svc.Enroll(ctx, req)
			var e *errcode.Error
			require.ErrorAs(t, err, &e)
			require.Equal(t, errcode.ValidationFailed, e.Code)
			n, err := b.svc.Node(ctx, boot.NodeID)
			require.NoError(t, err)
			require.Equal(t, fleet.StateEnrolling, n.State)
			b.enroll(t, boot) // the token is still good
		})
	})
}

// TestEnrollConcurrent: N redemptions of one token at once, exactly one wins.
func TestEnrollConcurrent(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		boot := b.invite(t, fleet.Invite{})
		const n = 16
		var wg sync.WaitGroup
		errs := make([]error, n)
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, errs[i] = b.svc.Enroll(ctx, enrollReq(boot, b.clock.Now()))
			}()
		}
		close(start)
		wg.Wait()
		wins := 0
		for _, err := range errs {
			if err == nil {
				wins++
				continue
			}
			require.ErrorIs(t, err, fleet.ErrEnrollmentSpent)
		}
		require.Equal(t, 1, wins)
		node, err := b.svc.Node(ctx, boot.NodeID)
		require.NoError(t, err)
		require.Equal(t, int64(1), node.FencingToken, "exactly one fencing bump")
	})
}

// TestEnrollConcurrentAcrossReplicas: redemptions of one token through
// several replicas at once (separate stores, so separate transactions
// rather than one group commit's batch), exactly one wins.
func TestEnrollConcurrentAcrossReplicas(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		replicas := []*bundle{b, setup(t, b.db), setup(t, b.db)}
		boot := b.invite(t, fleet.Invite{})
		const per = 6
		var wg sync.WaitGroup
		errs := make([]error, len(replicas)*per)
		start := make(chan struct{})
		for i := range errs {
			r := replicas[i%len(replicas)]
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, errs[i] = r.svc.Enroll(ctx, enrollReq(boot, r.clock.Now()))
			}()
		}
		close(start)
		wg.Wait()
		wins := 0
		for _, err := range errs {
			if err == nil {
				wins++
				continue
			}
			require.ErrorIs(t, err, fleet.ErrEnrollmentSpent)
		}
		require.Equal(t, 1, wins)
		node, err := b.svc.Node(ctx, boot.NodeID)
		require.NoError(t, err)
		require.Equal(t, int64(1), node.FencingToken, "exactly one fencing bump")
	})
}

// TestEnrollRetriedByItsOwnAgent: an enrollment that committed but whose
// answer was lost is answered again to the agent that sent it (same token,
// same nonce), at the same fencing token; everyone else still finds the
// token spent.
func TestEnrollRetriedByItsOwnAgent(t *testing.T) {
	const nonce = "c2FtZS1hZ2VudC1zYW1lLW5vbmNlLTAx"
	withNonce := func(boot api.Bootstrap, at time.Time, nonce string) api.EnrollRequest {
		req := enrollReq(boot, at)
		req.EnrollmentNonce = nonce
		return req
	}
	each(t, func(t *testing.T, b *bundle) {
		t.Run("SameNonceIsAnsweredAtTheSameFencingToken", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			first, err := b.svc.Enroll(ctx, withNonce(boot, b.clock.Now(), nonce))
			require.NoError(t, err)
			before := testutil.ToFloat64(b.metrics.EnrollmentsAnsweredAgain)
			b.clock.Advance(40 * time.Second) // the agent's timeout and a backoff
			again, err := b.svc.Enroll(ctx, withNonce(boot, b.clock.Now(), nonce))
			require.NoError(t, err)
			require.Equal(t, first.FencingToken, again.FencingToken)
			require.Equal(t, b.clock.Now().Add(30*time.Minute), again.SessionExpiresAt, "a fresh session")
			for _, tok := range []string{first.SessionToken, again.SessionToken} {
				sess, err := b.svc.Authenticate(ctx, tok, fleet.DoorAsk)
				require.NoError(t, err, "neither session is fenced")
				require.Equal(t, first.FencingToken, sess.Fencing)
			}
			require.Equal(t, before+1, testutil.ToFloat64(b.metrics.EnrollmentsAnsweredAgain))
			n, err := b.svc.Node(ctx, boot.NodeID)
			require.NoError(t, err)
			require.Equal(t, int64(1), n.FencingToken, "no second bump")
			require.Equal(t, b.clock.Now().Add(-40*time.Second), *n.EnrolledAt, "the enrollment is the first one")
			audit, err := b.svc.Audit(ctx, boot.NodeID, 0, 0)
			require.NoError(t, err)
			require.Equal(t, "node.enroll_retry", audit[0].Action)
			require.Equal(t, "node.enroll", audit[1].Action)
		})
		t.Run("AnotherOrNoNonceIsSpent", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			_, err := b.svc.Enroll(ctx, withNonce(boot, b.clock.Now(), nonce))
			require.NoError(t, err)
			_, err = b.svc.Enroll(ctx, withNonce(boot, b.clock.Now(), "c2FtZS1hZ2VudC1zYW1lLW5vbmNlLTAy"))
			requireCode(t, err, fleet.ErrEnrollmentSpent)
			_, err = b.svc.Enroll(ctx, enrollReq(boot, b.clock.Now()))
			requireCode(t, err, fleet.ErrEnrollmentSpent)
		})
		t.Run("AnEnrollmentWithoutANonceIsNeverAnsweredAgain", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			b.enroll(t, boot)
			_, err := b.svc.Enroll(ctx, withNonce(boot, b.clock.Now(), nonce))
			requireCode(t, err, fleet.ErrEnrollmentSpent)
		})
		t.Run("PastTheWindowIsSpent", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			_, err := b.svc.Enroll(ctx, withNonce(boot, b.clock.Now(), nonce))
			require.NoError(t, err)
			b.clock.Advance(10*time.Minute + time.Second)
			_, err = b.svc.Enroll(ctx, withNonce(boot, b.clock.Now(), nonce))
			requireCode(t, err, fleet.ErrEnrollmentSpent)
		})
		t.Run("ALaterEnrollmentEndsIt", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			_, err := b.svc.Enroll(ctx, withNonce(boot, b.clock.Now(), nonce))
			require.NoError(t, err)
			through := b.clock.Now().Add(time.Hour)
			fresh, err := b.svc.Reinvite(ctx, "a", boot.NodeID, &through)
			require.NoError(t, err)
			second, err := b.svc.Enroll(ctx, withNonce(fresh, b.clock.Now(), "YW5vdGhlci1tYWNoaW5lLWFub3RoZXItbm9uY2U"))
			require.NoError(t, err)
			require.Equal(t, int64(2), second.FencingToken)
			_, err = b.svc.Enroll(ctx, withNonce(boot, b.clock.Now(), nonce))
			requireCode(t, err, fleet.ErrEnrollmentSpent)
		})
		t.Run("RetiredIsRetired", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			_, err := b.svc.Enroll(ctx, withNonce(boot, b.clock.Now(), nonce))
			require.NoError(t, err)
			_, err = b.svc.Retire(ctx, "a", boot.NodeID, "")
			require.NoError(t, err)
			_, err = b.svc.Enroll(ctx, withNonce(boot, b.clock.Now(), nonce))
			requireCode(t, err, fleet.ErrNodeRetired)
		})
		t.Run("MalformedNonceIsValidationFailed", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			for _, bad := range []string{"short", strings.Repeat("a", 129), "has spaces in it, twenty-two+"} {
				_, err := b.svc.Enroll(ctx, withNonce(boot, b.clock.Now(), bad))
				var e *errcode.Error
				require.ErrorAs(t, err, &e, bad)
				require.Equal(t, errcode.ValidationFailed, e.Code)
				require.Equal(t, "enrollment_nonce", e.Fields[0].Field)
			}
			b.enroll(t, boot) // nothing was redeemed
		})
		t.Run("ConcurrentAttemptsOfOneAgentAllAnswerOneFencingToken", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			const n = 8
			var wg sync.WaitGroup
			resps := make([]api.EnrollResponse, n)
			errs := make([]error, n)
			start := make(chan struct{})
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					resps[i], errs[i] = b.svc.Enroll(ctx, withNonce(boot, b.clock.Now(), nonce))
				}()
			}
			close(start)
			wg.Wait()
			for i := range n {
				require.NoError(t, errs[i])
				require.Equal(t, int64(1), resps[i].FencingToken)
			}
		})
	})
}

// TestEnrollShedPastTheQueueBound: an enrollment that waited for its
// turn to write longer than the bound is answered overloaded with
// nothing redeemed, so the agent's retry enrolls (any agent's, nonce or
// not: nothing was spent).
func TestEnrollShedPastTheQueueBound(t *testing.T) {
	const bound = 50 * time.Millisecond
	each(t, func(t *testing.T, b *bundle) {
		boot := b.invite(t, fleet.Invite{})
		// A batch on the node's lane that holds it until told.
		running, release := make(chan struct{}), make(chan struct{})
		busy := make(chan error, 1)
		go func() {
			busy <- b.store.Tx(fleet.OnNode(ctx, boot.NodeID), func(fleet.Tx) error {
				close(running)
				<-release
				return nil
			})
		}()
		<-running
		shed := make(chan error, 1)
		go func() {
			_, err := b.svc.Enroll(ctx, enrollReq(boot, b.clock.Now()))
			shed <- err
		}()
		testwait.For(t, "the enrollment queued behind the batch", time.Minute, func() bool { return b.store.GroupStats().Queued == 1 })
		queuedAt := time.Now()
		testwait.For(t, "the enrollment's bound passed while it queued", time.Minute, func() bool { return time.Since(queuedAt) > 2*bound })
		close(release)
		require.NoError(t, <-busy)
		err := <-shed
		requireCode(t, err, fleet.ErrEnrollmentShed)
		var e *errcode.Error
		require.ErrorAs(t, err, &e)
		require.Equal(t, errcode.Overloaded, e.Code)
		require.NotContains(t, err.Error(), boot.EnrollmentToken)
		require.EqualValues(t, 1, testutil.ToFloat64(b.metrics.EnrollmentsShed))

		n, err := b.svc.Node(ctx, boot.NodeID)
		require.NoError(t, err)
		require.Equal(t, fleet.StateEnrolling, n.State, "nothing was redeemed")
		require.Zero(t, n.FencingToken)
		// The agent's retry, on a replica with the default bound.
		resp, err := setup(t, b.db).svc.Enroll(ctx, enrollReq(boot, b.clock.Now()))
		require.NoError(t, err)
		require.Equal(t, int64(1), resp.FencingToken)
	}, func(s *fleet.Settings) { s.EnrollQueueTimeout = bound })
}

func TestReinvite(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		t.Run("OutstandingGoodThroughWaitIsHandedBackUnchanged", func(t *testing.T) {
			through := b.clock.Now().Add(time.Hour)
			boot := b.invite(t, fleet.Invite{RedeemableThrough: &through})
			wait := b.clock.Now().Add(30 * time.Minute)
			again, err := b.svc.Reinvite(ctx, "a", boot.NodeID, &wait)
			require.NoError(t, err)
			require.Equal(t, boot.EnrollmentToken, again.EnrollmentToken)
			require.Equal(t, boot.ExpiresAt, again.ExpiresAt)
			b.enroll(t, again)
		})
		t.Run("ClosingBeforeWaitMintsFresh", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			wait := b.clock.Now().Add(2 * time.Hour)
			fresh, err := b.svc.Reinvite(ctx, "a", boot.NodeID, &wait)
			require.NoError(t, err)
			require.NotEqual(t, boot.EnrollmentToken, fresh.EnrollmentToken)
			require.Equal(t, wait.Truncate(time.Second), fresh.ExpiresAt)
		})
		t.Run("RedeemedMintsFreshAndStateWaits", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			first := b.enroll(t, boot)
			fresh, err := b.svc.Reinvite(ctx, "a", boot.NodeID, nil)
			require.NoError(t, err)
			require.NotEqual(t, boot.EnrollmentToken, fresh.EnrollmentToken)
			n, err := b.svc.Node(ctx, boot.NodeID)
			require.NoError(t, err)
			require.Equal(t, fleet.StateReady, n.State, "state does not change until re-enrollment")
			second := b.enroll(t, fresh)
			require.Equal(t, first.FencingToken+1, second.FencingToken)
			_, err = b.svc.Authenticate(ctx, first.SessionToken, fleet.DoorAsk)
			requireCode(t, err, fleet.ErrFenced)
		})
		t.Run("ExpiredMintsFresh", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			b.clock.Advance(31 * time.Minute)
			fresh, err := b.svc.Reinvite(ctx, "a", boot.NodeID, nil)
			require.NoError(t, err)
			require.NotEqual(t, boot.EnrollmentToken, fresh.EnrollmentToken)
			b.enroll(t, fresh)
		})
		t.Run("RetiredRefused", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			_, err := b.svc.Retire(ctx, "a", boot.NodeID, "")
			require.NoError(t, err)
			_, err = b.svc.Reinvite(ctx, "a", boot.NodeID, nil)
			requireCode(t, err, fleet.ErrNodeRetired)
		})
		t.Run("UnknownNode", func(t *testing.T) {
			_, err := b.svc.Reinvite(ctx, "a", "nope", nil)
			requireCode(t, err, fleet.ErrNotFound)
		})
	})
}

func TestSessions(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		t.Run("ExpiresAtTheExactSecond", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			resp := b.enroll(t, boot)
			start := b.clock.Now()
			defer b.clock.Set(start)
			b.clock.Set(resp.SessionExpiresAt.Add(5*time.Second - time.Nanosecond))
			_, err := b.svc.Authenticate(ctx, resp.SessionToken, fleet.DoorAsk)
			require.NoError(t, err)
			b.clock.Set(resp.SessionExpiresAt.Add(5 * time.Second))
			_, err = b.svc.Authenticate(ctx, resp.SessionToken, fleet.DoorAsk)
			requireCode(t, err, fleet.ErrSessionInvalid)
		})
		t.Run("RenewWritesNothing", func(t *testing.T) {
			id, _, tok := b.readyNode(t)
			before, err := b.svc.Node(ctx, id)
			require.NoError(t, err)
			b.clock.Advance(10 * time.Minute)
			renewed, err := b.svc.Renew(ctx, tok)
			require.NoError(t, err)
			require.Equal(t, b.clock.Now().Add(30*time.Minute), renewed.SessionExpiresAt)
			after, err := b.svc.Node(ctx, id)
			require.NoError(t, err)
			require.Equal(t, before, after)
			sess, err := b.svc.Authenticate(ctx, renewed.SessionToken, fleet.DoorAsk)
			require.NoError(t, err)
			require.Equal(t, before.FencingToken, sess.Fencing)
		})
		t.Run("RetiredRenewsNothingButReports", func(t *testing.T) {
			id, _, tok := b.readyNode(t)
			_, err := b.svc.Retire(ctx, "a", id, "")
			require.NoError(t, err)
			_, err = b.svc.Renew(ctx, tok)
			requireCode(t, err, fleet.ErrNodeRetired)
			_, err = b.svc.Authenticate(ctx, tok, fleet.DoorReport)
			require.NoError(t, err)
		})
	})
}

func TestHeartbeatsAndLeases(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		t.Run("LeaseLapseMarksLostAndHeartbeatRevives", func(t *testing.T) {
			id, sess, _ := b.readyNode(t)
			// The service's own sweeper runs beside the test on the same
			// clock, so the node's state is the verdict, not which sweep
			// happened to mark it.
			b.clock.Advance(89 * time.Second)
			lost, err := b.svc.SweepLeases(ctx)
			require.NoError(t, err)
			require.NotContains(t, lost, id)
			n, _ := b.svc.Node(ctx, id)
			require.Equal(t, fleet.StateReady, n.State, "a second of lease left")
			b.clock.Advance(2 * time.Second)
			_, err = b.svc.SweepLeases(ctx)
			require.NoError(t, err)
			n, _ = b.svc.Node(ctx, id)
			require.Equal(t, fleet.StateLost, n.State)

			_, err = b.svc.RecordEvents(ctx, sess, []api.Event{{ID: "hb-1", Kind: api.EventHeartbeat, ObservedAt: b.clock.Now()}})
			require.NoError(t, err)
			n, _ = b.svc.Node(ctx, id)
			require.Equal(t, fleet.StateReady, n.State)
			require.Equal(t, b.clock.Now().Add(90*time.Second), *n.LeaseExpiresAt)
			require.Equal(t, b.clock.Now(), *n.LastHeartbeatAt)
		})
		t.Run("DiskThreeAnswers", func(t *testing.T) {
			id, sess, _ := b.readyNode(t)
			zero := int64(0)
			f := facts(b.clock.Now())
			f.DiskFreeBytes = &zero
			_, err := b.svc.RecordEvents(ctx, sess, []api.Event{{ID: "h", Kind: api.EventHeartbeat, ObservedAt: b.clock.Now(), Facts: &f}})
			require.NoError(t, err)
			n, _ := b.svc.Node(ctx, id)
			require.Equal(t, fleet.DiskMeasured, n.Disk.State)
			require.Equal(t, int64(0), *n.Disk.FreeBytes, "zero is a full disk, not unknown")

			f.DiskFreeBytes = nil
			f.ObservedAt = b.clock.Now().Add(time.Second)
			_, err = b.svc.RecordEvents(ctx, sess, []api.Event{{ID: "h", Kind: api.EventHeartbeat, ObservedAt: f.ObservedAt, Facts: &f}})
			require.NoError(t, err)
			n, _ = b.svc.Node(ctx, id)
			require.Equal(t, fleet.DiskUnmeasurable, n.Disk.State)
			require.Nil(t, n.Disk.FreeBytes)
			require.Equal(t, f.ObservedAt, *n.FactsObservedAt)
		})
		t.Run("RetiredReportsButGetsNoLease", func(t *testing.T) {
			id, sess, _ := b.readyNode(t)
			before, _ := b.svc.Node(ctx, id)
			_, err := b.svc.Retire(ctx, "a", id, "")
			require.NoError(t, err)
			b.clock.Advance(time.Minute)
			code := 0
			res, err := b.svc.RecordEvents(ctx, sess, []api.Event{
				{ID: "h", Kind: api.EventHeartbeat, ObservedAt: b.clock.Now()},
				{ID: "w1", Kind: api.EventWorkload, ObservedAt: b.clock.Now(), Workload: &api.WorkloadObservation{RunID: "r", AttemptID: "a", State: "exited", ExitCode: &code, ObservedAt: b.clock.Now()}},
			})
			require.NoError(t, err)
			require.Equal(t, 2, res.Recorded)
			n, _ := b.svc.Node(ctx, id)
			require.Equal(t, fleet.StateRetired, n.State)
			require.Equal(t, *before.LeaseExpiresAt, *n.LeaseExpiresAt)
			wl, err := b.svc.Workload(ctx, id, "r", "a")
			require.NoError(t, err)
			require.Equal(t, "exited", wl.State)
		})
	})
}

func TestWorkloadEvents(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		id, sess, _ := b.readyNode(t)
		wl, err := b.svc.Workload(ctx, id, "run", "1")
		require.NoError(t, err)
		require.Equal(t, "absent", wl.State, "never reported is absent, not exited")

		t0 := b.clock.Now()
		code := 3
		batch := []api.Event{
			{ID: "e1", Kind: api.EventWorkload, ObservedAt: t0, Workload: &api.WorkloadObservation{RunID: "run", AttemptID: "1", State: "created", ObservedAt: t0}},
			{ID: "e2", Kind: api.EventWorkload, ObservedAt: t0, Workload: &api.WorkloadObservation{RunID: "run", AttemptID: "1", State: "running", ObservedAt: t0.Add(time.Second)}},
			{ID: "e3", Kind: api.EventWorkload, ObservedAt: t0, Workload: &api.WorkloadObservation{RunID: "run", AttemptID: "1", State: "exited", ExitCode: &code, ObservedAt: t0.Add(2 * time.Second)}},
		}
		res, err := b.svc.RecordEvents(ctx, sess, batch)
		require.NoError(t, err)
		require.Equal(t, fleet.EventsResult{Recorded: 3}, res)
		// A spool replayed after a reconnection changes nothing.
		res, err = b.svc.RecordEvents(ctx, sess, batch)
		require.NoError(t, err)
		require.Equal(t, fleet.EventsResult{Duplicates: 3}, res)
		// An older observation arriving late does not win.
		late := []api.Event{{ID: "e0", Kind: api.EventWorkload, ObservedAt: t0, Workload: &api.WorkloadObservation{RunID: "run", AttemptID: "1", State: "running", ObservedAt: t0}}}
		_, err = b.svc.RecordEvents(ctx, sess, late)
		require.NoError(t, err)
		wl, err = b.svc.Workload(ctx, id, "run", "1")
		require.NoError(t, err)
		require.Equal(t, "exited", wl.State)
		require.Equal(t, 3, *wl.ExitCode)
		rec, err := b.svc.Reconcile(ctx, id)
		require.NoError(t, err)
		require.Len(t, rec.Workloads, 1)
		ws, err := b.svc.Workloads(ctx, id)
		require.NoError(t, err)
		require.Equal(t, rec.Workloads, ws, "the node page's read is reconciliation's")
		_, err = b.svc.Workloads(ctx, "missing")
		requireCode(t, err, fleet.ErrNotFound)

		_, err = b.svc.RecordEvents(ctx, sess, []api.Event{{ID: "x", Kind: "workload", ObservedAt: t0, Workload: &api.WorkloadObservation{RunID: "r", AttemptID: "a", State: "exited", ObservedAt: t0}}})
		var e *errcode.Error
		require.ErrorAs(t, err, &e)
		require.Equal(t, errcode.ValidationFailed, e.Code, "exited needs an exit code")
	})
}

func TestRetire(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		boot := b.invite(t, fleet.Invite{})
		n1, err := b.svc.Retire(ctx, "a", boot.NodeID, "decommissioned")
		require.NoError(t, err)
		require.Equal(t, fleet.StateRetired, n1.State)
		n2, err := b.svc.Retire(ctx, "a", boot.NodeID, "")
		require.NoError(t, err, "idempotent")
		require.Equal(t, n1.RetiredAt, n2.RetiredAt)
		_, err = b.svc.Enroll(ctx, enrollReq(boot, b.clock.Now()))
		requireCode(t, err, fleet.ErrNodeRetired)
		_, err = b.svc.Retire(ctx, "a", "missing", "")
		requireCode(t, err, fleet.ErrNotFound)
		audit, err := b.svc.Audit(ctx, boot.NodeID, 0, 10)
		require.NoError(t, err)
		require.Equal(t, "node.retire", audit[0].Action)
		require.Equal(t, "node.invite", audit[1].Action)
	})
}

func TestCommittedUntil(t *testing.T) {
	enrolled := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	hour := int64(3600)
	n := fleet.Node{EnrolledAt: &enrolled, Purchase: fleet.Purchase{BillingIntervalSeconds: &hour}}
	cases := []struct {
		at   time.Time
		want time.Time
	}{
		{enrolled, enrolled.Add(time.Hour)},
		{enrolled.Add(59*time.Minute + 59*time.Second), enrolled.Add(time.Hour)},
		{enrolled.Add(time.Hour), enrolled.Add(2 * time.Hour)},
		{enrolled.Add(5*time.Hour + time.Minute), enrolled.Add(6 * time.Hour)},
	}
	for _, tc := range cases {
		require.Equal(t, tc.want, *fleet.CommittedUntil(n, tc.at), "at %s", tc.at)
	}
	own := fleet.Node{EnrolledAt: &enrolled}
	require.Nil(t, fleet.CommittedUntil(own, enrolled.Add(time.Hour)), "own hardware is bought in no blocks")
}

func TestOffers(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		price := 1.5
		hour := int64(3600)
		until := b.clock.Now().Add(48 * time.Hour)
		gpu := b.invite(t, fleet.Invite{RentalID: "o-gpu", ShadowPriceUSD: &price,
			Purchase: &fleet.PurchaseTerms{BillingIntervalSeconds: &hour, EligibleClasses: []string{"gpu"}, AvailableUntil: &until}})
		anyone := b.invite(t, fleet.Invite{RentalID: "o-any", ShadowPriceUSD: &price})
		unpriced := b.invite(t, fleet.Invite{RentalID: "o-free"})
		unenrolled := b.invite(t, fleet.Invite{RentalID: "o-wait", ShadowPriceUSD: &price})
		b.enroll(t, gpu)
		b.enroll(t, unpriced)
		resp := b.enroll(t, anyone)
		_ = unenrolled
		// anyone's disk becomes unmeasurable.
		sess, err := b.svc.Authenticate(ctx, resp.SessionToken, fleet.DoorReport)
		require.NoError(t, err)
		f := facts(b.clock.Now().Add(time.Second))
		f.DiskFreeBytes = nil
		_, err = b.svc.RecordEvents(ctx, sess, []api.Event{{ID: "h", Kind: "heartbeat", ObservedAt: f.ObservedAt, Facts: &f}})
		require.NoError(t, err)

		ids := func(f fleet.OfferFilter) []string {
			offers, err := b.svc.Offers(ctx, f)
			require.NoError(t, err)
			var out []string
			for _, o := range offers {
				out = append(out, o.Node.ID)
			}
			return out
		}
		require.ElementsMatch(t, []string{gpu.NodeID, anyone.NodeID}, ids(fleet.OfferFilter{}))
		require.ElementsMatch(t, []string{gpu.NodeID, anyone.NodeID}, ids(fleet.OfferFilter{Class: "gpu"}))
		require.ElementsMatch(t, []string{anyone.NodeID}, ids(fleet.OfferFilter{Class: "cpu"}))
		floor := int64(1 << 30)
		require.ElementsMatch(t, []string{gpu.NodeID}, ids(fleet.OfferFilter{MinFreeDiskBytes: &floor}), "unmeasurable never qualifies")
		later := until.Add(time.Hour)
		require.ElementsMatch(t, []string{anyone.NodeID}, ids(fleet.OfferFilter{Until: &later}))

		offers, err := b.svc.Offers(ctx, fleet.OfferFilter{Class: "gpu", MinFreeDiskBytes: &floor})
		require.NoError(t, err)
		require.Equal(t, b.clock.Now().Add(time.Hour), *offers[0].CommittedUntil)

		_, err = b.svc.Retire(ctx, "a", gpu.NodeID, "")
		require.NoError(t, err)
		require.ElementsMatch(t, []string{anyone.NodeID}, ids(fleet.OfferFilter{}))
	})
}

func TestListNodesKeyset(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		var ids []string
		for i := range 5 {
			boot := b.invite(t, fleet.Invite{RentalID: "list-" + itoa(i)})
			ids = append(ids, boot.NodeID)
			b.clock.Advance(time.Millisecond)
		}
		page1, err := b.svc.Nodes(ctx, fleet.NodeFilter{Limit: 3})
		require.NoError(t, err)
		require.Len(t, page1, 3)
		require.Equal(t, ids[4], page1[0].ID, "newest first")
		last := page1[2]
		page2, err := b.svc.Nodes(ctx, fleet.NodeFilter{Limit: 3, BeforeCreated: &last.CreatedAt, BeforeID: last.ID})
		require.NoError(t, err)
		require.Len(t, page2, 2)
		require.Equal(t, ids[0], page2[1].ID)
		ready, err := b.svc.Nodes(ctx, fleet.NodeFilter{State: fleet.StateReady})
		require.NoError(t, err)
		require.Empty(t, ready)
	})
}
