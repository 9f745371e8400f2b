package models_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/testwait"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// The fleet store conformance suite: every dialect keeps the same promises.

var ctx = context.Background()

var t0 = time.Date(2026, 5, 1, 9, 30, 0, 123456000, time.UTC)

func tp(t time.Time) *time.Time { return &t }
func ip(i int64) *int64         { return &i }

func sampleNode(id, rental string, gen int64) fleet.Node {
	return fleet.Node{ID: id, RentalID: rental, Generation: gen, State: fleet.StateEnrolling, CreatedAt: t0, UpdatedAt: t0,
		Disk: fleet.Disk{State: fleet.DiskNeverReported}}
}

type recorder struct {
	mu    sync.Mutex
	notes []fleet.Notification
}

func (r *recorder) hook(n []fleet.Notification) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notes = append(r.notes, n...)
}

func (r *recorder) all() []fleet.Notification {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]fleet.Notification(nil), r.notes...)
}

func withStore(t *testing.T, fn func(t *testing.T, s *models.FleetStore, rec *recorder)) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		rec := &recorder{}
		fn(t, models.NewFleetStore(db, "r1", rec.hook), rec)
	})
}

func insert(t testing.TB, s *models.FleetStore, nodes ...fleet.Node) {
	t.Helper()
	require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
		for _, n := range nodes {
			if err := tx.InsertNode(ctx, n); err != nil {
				return err
			}
		}
		return nil
	}))
}

func TestFleetStoreNodes(t *testing.T) {
	withStore(t, func(t *testing.T, s *models.FleetStore, _ *recorder) {
		insert(t, s, sampleNode("n1", "rent", 1))
		err := s.Tx(ctx, func(tx fleet.Tx) error { return tx.InsertNode(ctx, sampleNode("n1", "other", 1)) })
		require.ErrorIs(t, err, fleet.ErrDuplicate, "same id")
		err = s.Tx(ctx, func(tx fleet.Tx) error { return tx.InsertNode(ctx, sampleNode("n2", "rent", 1)) })
		require.ErrorIs(t, err, fleet.ErrDuplicate, "same rental and generation")
		_, err = s.Node(ctx, "missing")
		require.ErrorIs(t, err, fleet.ErrNoRows)

		// Every field survives a round trip.
		n := sampleNode("n1", "rent", 1)
		n.State = fleet.StateReady
		n.FencingToken = 7
		n.EnrolledAt, n.LeaseExpiresAt, n.LastHeartbeatAt = tp(t0.Add(time.Second)), tp(t0.Add(time.Minute)), tp(t0.Add(2*time.Second))
		n.AgentVersion = "9.9"
		n.Facts = json.RawMessage(`{"hostname":"h"}`)
		n.FactsObservedAt, n.FactsReceivedAt = tp(t0), tp(t0.Add(time.Millisecond))
		n.Disk = fleet.Disk{State: fleet.DiskMeasured, FreeBytes: ip(0), ObservedAt: tp(t0)}
		n.PriceMicros = ip(1500000)
		n.Purchase = fleet.Purchase{BillingIntervalSeconds: ip(3600), EligibleClasses: []string{"a", "b"}, AvailableUntil: tp(t0.Add(time.Hour))}
		n.UpdatedAt = t0.Add(3 * time.Second)
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error { return tx.UpdateNode(ctx, n) }))
		got, err := s.Node(ctx, "n1")
		require.NoError(t, err)
		require.JSONEq(t, string(n.Facts), string(got.Facts))
		got.Facts = n.Facts
		require.Equal(t, n, got)

		// Clearing a field clears it.
		n.PriceMicros = nil
		n.Disk = fleet.Disk{State: fleet.DiskUnmeasurable, ObservedAt: tp(t0)}
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error { return tx.UpdateNode(ctx, n) }))
		got, err = s.Node(ctx, "n1")
		require.NoError(t, err)
		require.Nil(t, got.PriceMicros)
		require.Nil(t, got.Disk.FreeBytes)
	})
}

func TestFleetStoreInvitations(t *testing.T) {
	withStore(t, func(t *testing.T, s *models.FleetStore, _ *recorder) {
		insert(t, s, sampleNode("n1", "rent", 1))
		inv := fleet.Invitation{ID: "i1", NodeID: "n1", Generation: 1, TokenDigest: "d1", IssuedAt: t0, ExpiresAt: t0.Add(time.Hour), State: fleet.InvitationOutstanding}
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error { return tx.InsertInvitation(ctx, inv) }))
		var first, second bool
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
			var err error
			first, err = tx.SetInvitationState(ctx, "i1", fleet.InvitationOutstanding, fleet.InvitationRedeemed, t0)
			if err != nil {
				return err
			}
			second, err = tx.SetInvitationState(ctx, "i1", fleet.InvitationOutstanding, fleet.InvitationRedeemed, t0)
			return err
		}))
		require.True(t, first)
		require.False(t, second, "the state guard lets exactly one transition through")
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
			got, err := tx.Invitation(ctx, "i1")
			require.NoError(t, err)
			require.Equal(t, fleet.InvitationRedeemed, got.State)
			require.Equal(t, t0, *got.RedeemedAt)
			out, err := tx.OutstandingInvitations(ctx, "n1")
			require.NoError(t, err)
			require.Empty(t, out)
			return nil
		}))
	})
}

// TestFleetStoreRedeemInvitation: the enrollment's store door in one
// step. Only this node's outstanding invitation with this digest is
// redeemed, exactly once however many transactions race for it (several
// stores: separate transactions, as several replicas run them), and a
// transaction that fails after redeeming leaves it outstanding.
func TestFleetStoreRedeemInvitation(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := models.NewFleetStore(db, "r1", nil)
		insert(t, s, sampleNode("n1", "rent", 1), sampleNode("n2", "rent2", 1))
		inv := fleet.Invitation{ID: "i1", NodeID: "n1", Generation: 1, TokenDigest: "d1", IssuedAt: t0, ExpiresAt: t0.Add(time.Hour), State: fleet.InvitationOutstanding}
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error { return tx.InsertInvitation(ctx, inv) }))
		redeem := func(s *models.FleetStore, node, id, digest string) (fleet.Node, bool, error) {
			var n fleet.Node
			var ok bool
			err := s.Tx(ctx, func(tx fleet.Tx) error {
				var err error
				n, ok, err = tx.RedeemInvitation(ctx, node, id, digest, t0)
				return err
			})
			return n, ok, err
		}
		state := func() fleet.Invitation {
			var got fleet.Invitation
			require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
				var err error
				got, err = tx.Invitation(ctx, "i1")
				return err
			}))
			return got
		}

		n, ok, err := redeem(s, "n1", "i1", "other digest")
		require.NoError(t, err)
		require.False(t, ok, "another token's digest")
		require.Equal(t, "n1", n.ID, "the node is answered all the same")
		_, ok, err = redeem(s, "n2", "i1", "d1")
		require.NoError(t, err)
		require.False(t, ok, "another node's invitation")
		_, ok, err = redeem(s, "n1", "missing", "d1")
		require.NoError(t, err)
		require.False(t, ok, "no such invitation")
		_, _, err = redeem(s, "missing", "i1", "d1")
		require.ErrorIs(t, err, fleet.ErrNoRows, "no such node")

		refused := errors.New("refused after redeeming")
		err = s.Tx(ctx, func(tx fleet.Tx) error {
			_, ok, err := tx.RedeemInvitation(ctx, "n1", "i1", "d1", t0)
			require.NoError(t, err)
			require.True(t, ok)
			return refused
		})
		require.ErrorIs(t, err, refused)
		require.Equal(t, fleet.InvitationOutstanding, state().State, "undone with its transaction")

		stores := []*models.FleetStore{s, models.NewFleetStore(db, "r2", nil), models.NewFleetStore(db, "r3", nil)}
		const each = 4
		var wins atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		for _, st := range stores {
			for range each {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					n, ok, err := redeem(st, "n1", "i1", "d1")
					if !assert.NoError(t, err) {
						return
					}
					assert.Equal(t, "n1", n.ID)
					if ok {
						wins.Add(1)
					}
				}()
			}
		}
		close(start)
		wg.Wait()
		require.Equal(t, int64(1), wins.Load(), "exactly one redemption")
		got := state()
		require.Equal(t, fleet.InvitationRedeemed, got.State)
		require.Equal(t, t0, *got.RedeemedAt)
	})
}

// TestFleetStoreAbsenceAndConflict: what each method documented in
// fleet/store.go answers for a row that is not there, or already is.
func TestFleetStoreAbsenceAndConflict(t *testing.T) {
	withStore(t, func(t *testing.T, s *models.FleetStore, _ *recorder) {
		insert(t, s, sampleNode("n1", "rent", 1))
		inv := fleet.Invitation{ID: "i1", NodeID: "n1", Generation: 1, TokenDigest: "d1", IssuedAt: t0, ExpiresAt: t0.Add(time.Hour), State: fleet.InvitationOutstanding}
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error { return tx.InsertInvitation(ctx, inv) }))
		err := s.Tx(ctx, func(tx fleet.Tx) error { return tx.InsertInvitation(ctx, inv) })
		require.ErrorIs(t, err, fleet.ErrDuplicate, "same invitation id")

		_, err = s.Workload(ctx, "n1", "run", "attempt")
		require.ErrorIs(t, err, fleet.ErrNoRows, "a workload never reported")
		_, err = s.Command(ctx, "missing")
		require.ErrorIs(t, err, fleet.ErrNoRows)
		for _, list := range []func() (int, error){
			func() (int, error) { c, err := s.Commands(ctx, "missing", "", 0); return len(c), err },
			func() (int, error) { w, err := s.Workloads(ctx, "missing"); return len(w), err },
			func() (int, error) { a, err := s.Audit(ctx, "missing", 0, 0); return len(a), err },
			func() (int, error) { ids, err := s.AppliedOperationIDs(ctx, "missing"); return len(ids), err },
		} {
			n, err := list()
			require.NoError(t, err, "a listing of an unknown node is no error")
			require.Zero(t, n)
		}
		ids, err := s.AppliedOperationIDs(ctx, "missing")
		require.NoError(t, err)
		require.NotNil(t, ids, "an empty list, not nil")

		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
			_, err := tx.LockNode(ctx, "missing")
			require.ErrorIs(t, err, fleet.ErrNoRows)
			_, err = tx.LockCommand(ctx, "missing")
			require.ErrorIs(t, err, fleet.ErrNoRows)
			_, err = tx.Invitation(ctx, "missing")
			require.ErrorIs(t, err, fleet.ErrNoRows)
			ok, err := tx.SetInvitationState(ctx, "missing", fleet.InvitationOutstanding, fleet.InvitationRevoked, t0)
			require.NoError(t, err)
			require.False(t, ok, "no such invitation")
			rental, err := tx.NodesOfRental(ctx, "missing")
			require.NoError(t, err)
			require.Empty(t, rental)
			// Updates of rows that are not there write nothing and are no error.
			require.NoError(t, tx.UpdateNode(ctx, sampleNode("ghost", "ghost", 1)))
			require.NoError(t, tx.UpdateCommand(ctx, fleet.Command{OperationID: "ghost", NodeID: "n1", Kind: "stop_workload",
				Payload: json.RawMessage(`{}`), IssuedAt: t0, State: fleet.CommandPending}))
			work, claimed, err := tx.ClaimDue(ctx, fleet.Due{NodeID: "n1", Fencing: 1, RedeliverBefore: t0, Now: t0, Limit: 10})
			require.NoError(t, err)
			require.Empty(t, claimed, "nothing due")
			require.False(t, work.Commands)
			return nil
		}))
		_, err = s.Node(ctx, "ghost")
		require.ErrorIs(t, err, fleet.ErrNoRows, "an update creates nothing")
		_, err = s.Command(ctx, "ghost")
		require.ErrorIs(t, err, fleet.ErrNoRows, "an update creates nothing")

		changed, err := s.RenewLeases(ctx, []fleet.LeaseRenewal{{NodeID: "missing", Until: t0}})
		require.NoError(t, err)
		require.Zero(t, changed)
		found, err := s.TouchReplica(ctx, "nobody", t0)
		require.NoError(t, err)
		require.False(t, found)
	})
}

func TestFleetStoreEventsAndWorkloads(t *testing.T) {
	withStore(t, func(t *testing.T, s *models.FleetStore, _ *recorder) {
		var fresh1, fresh2 map[string]bool
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
			var err error
			fresh1, err = tx.RecordEventIDs(ctx, "n1", []string{"a", "b"}, t0)
			if err != nil {
				return err
			}
			fresh2, err = tx.RecordEventIDs(ctx, "n1", []string{"b", "c"}, t0)
			return err
		}))
		require.Equal(t, map[string]bool{"a": true, "b": true}, fresh1)
		require.Equal(t, map[string]bool{"c": true}, fresh2)
		var other map[string]bool
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
			var err error
			other, err = tx.RecordEventIDs(ctx, "n2", []string{"a"}, t0)
			return err
		}))
		require.True(t, other["a"], "ids are per node")

		code := 1
		up := func(state string, at time.Time) {
			require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
				w := fleet.Workload{NodeID: "n1", RunID: "r", AttemptID: "1", State: state, ObservedAt: at, ReceivedAt: t0}
				if state == "exited" {
					w.ExitCode = &code
				}
				return tx.UpsertWorkload(ctx, w)
			}))
		}
		up("running", t0.Add(time.Second))
		up("exited", t0.Add(2*time.Second))
		up("created", t0) // older: ignored
		up("running", t0.Add(2*time.Second))
		w, err := s.Workload(ctx, "n1", "r", "1")
		require.NoError(t, err)
		require.Equal(t, "exited", w.State, "same time: the later state wins")
		require.Equal(t, 1, *w.ExitCode)
		_, err = s.Workload(ctx, "n1", "r", "2")
		require.ErrorIs(t, err, fleet.ErrNoRows)
	})
}

func TestFleetStoreWorkloadOutput(t *testing.T) {
	withStore(t, func(t *testing.T, s *models.FleetStore, _ *recorder) {
		put := func(o fleet.WorkloadOutput) bool {
			var stored bool
			require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
				var err error
				stored, err = tx.InsertWorkloadOutput(ctx, o)
				return err
			}))
			return stored
		}
		// A full 64 KiB tail of multi-byte text, to prove the column
		// holds it on every dialect byte for byte.
		big := strings.Repeat("é", 32<<10)
		first := fleet.WorkloadOutput{NodeID: "n1", RunID: "r", AttemptID: "1", StdoutTail: big,
			StderrTail: "warn: ☃\n", Truncated: true, ReceivedAt: t0}
		require.True(t, put(first))
		require.False(t, put(fleet.WorkloadOutput{NodeID: "n1", RunID: "r", AttemptID: "1", StdoutTail: "other",
			ReceivedAt: t0.Add(time.Minute)}), "the same attempt again is not stored")
		require.True(t, put(fleet.WorkloadOutput{NodeID: "n2", RunID: "r", AttemptID: "1", ReceivedAt: t0}), "attempts are per node")

		got, err := s.WorkloadOutput(ctx, "n1", "r", "1")
		require.NoError(t, err)
		require.Equal(t, first, got, "the first report is kept")
		empty, err := s.WorkloadOutput(ctx, "n2", "r", "1")
		require.NoError(t, err)
		require.Equal(t, "", empty.StdoutTail)
		require.False(t, empty.Truncated)
		_, err = s.WorkloadOutput(ctx, "n1", "r", "2")
		require.ErrorIs(t, err, fleet.ErrNoRows)
	})
}

func TestFleetStoreCommands(t *testing.T) {
	withStore(t, func(t *testing.T, s *models.FleetStore, rec *recorder) {
		insert(t, s, sampleNode("n1", "rent", 1))
		err := s.Tx(ctx, func(tx fleet.Tx) error {
			c := fleet.Command{OperationID: "a", NodeID: "n1", Kind: "stop_workload", Payload: json.RawMessage(`{}`), PayloadDigest: "d",
				FencingToken: 1, IssuedAt: t0, State: fleet.CommandPending}
			if err := tx.InsertCommand(ctx, c); err != nil {
				return err
			}
			return tx.InsertCommand(ctx, c)
		})
		require.ErrorIs(t, err, fleet.ErrDuplicate, "duplicate operation id")
		_, err = s.Command(ctx, "a")
		require.ErrorIs(t, err, fleet.ErrNoRows, "rolled back whole")
	})
	withStore(t, func(t *testing.T, s *models.FleetStore, rec *recorder) {
		insert(t, s, sampleNode("n1", "rent", 1))
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
			for i, op := range []string{"c", "a", "b"} {
				c := fleet.Command{OperationID: op, NodeID: "n1", Kind: "stop_workload", Payload: json.RawMessage(`{"k":1}`), PayloadDigest: "d",
					FencingToken: 1, IssuedAt: t0.Add(time.Duration(i) * time.Second), State: fleet.CommandPending}
				if err := tx.InsertCommand(ctx, c); err != nil {
					return err
				}
			}
			return tx.Notify(ctx, fleet.Notification{Kind: fleet.NotifyCommands, NodeID: "n1"})
		}))
		require.Equal(t, []fleet.Notification{{Kind: fleet.NotifyCommands, NodeID: "n1"}}, rec.all(), "delivered after commit")

		var work fleet.DueWork // what the last claim found
		claim := func(now time.Time, limit int) []string {
			var ids []string
			require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
				w, cs, err := tx.ClaimDue(ctx, fleet.Due{NodeID: "n1", Fencing: 2, Now: now, RedeliverBefore: now.Add(-time.Minute), Limit: limit})
				work = w
				for _, c := range cs {
					ids = append(ids, c.OperationID)
					require.Equal(t, int64(2), *c.DeliveredFencing)
					require.Equal(t, int64(2), c.FencingToken)
				}
				return err
			}))
			return ids
		}
		now := t0.Add(time.Hour)
		hasDue := func(now time.Time) bool {
			ok, err := s.HasDue(ctx, fleet.Due{NodeID: "n1", Fencing: 2, Now: now, RedeliverBefore: now.Add(-time.Minute)})
			require.NoError(t, err)
			return ok
		}
		require.True(t, hasDue(now))
		require.Equal(t, []string{"c", "a"}, claim(now, 2), "oldest first, bounded")
		require.Equal(t, fleet.DueWork{Commands: true, Config: fleet.ConfigNotDue}, work, "the claim answers the due read")
		require.Equal(t, []string{"b"}, claim(now, 10))
		require.False(t, hasDue(now.Add(59*time.Second)))
		require.Empty(t, claim(now.Add(59*time.Second), 10), "inside the visibility timeout")
		require.Equal(t, fleet.DueWork{Unsettled: true, Config: fleet.ConfigNotDue}, work,
			"nothing claimed: pending but delivered, as the due read says")
		require.True(t, hasDue(now.Add(time.Minute)))
		require.Equal(t, []string{"c", "a", "b"}, claim(now.Add(time.Minute), 10))
		c, err := s.Command(ctx, "a")
		require.NoError(t, err)
		require.Equal(t, 2, c.DeliveryCount)
		require.Equal(t, now, *c.FirstDeliveredAt)

		// A rolled-back transaction announces nothing.
		before := len(rec.all())
		boom := errors.New("boom")
		err = s.Tx(ctx, func(tx fleet.Tx) error {
			_ = tx.Notify(ctx, fleet.Notification{Kind: fleet.NotifyNode, NodeID: "n1"})
			return boom
		})
		require.ErrorIs(t, err, boom)
		require.Len(t, rec.all(), before)
		n, err := s.CountPendingCommands(ctx)
		require.NoError(t, err)
		require.Equal(t, int64(3), n)

		// A settlement says whether the node has another pending command.
		settle := func(ids ...string) bool {
			var left bool
			require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
				locked, err := tx.LockCommands(ctx, ids)
				require.NoError(t, err)
				var cs []fleet.Command
				for _, id := range ids {
					c := locked[id]
					c.State, c.SettledAt = fleet.CommandApplied, &now
					cs = append(cs, c)
				}
				left, err = tx.SettleCommands(ctx, cs)
				return err
			}))
			return left
		}
		require.True(t, settle("c"), "a and b still pending")
		require.False(t, settle("a", "b"), "nothing pending left")
		c, err = s.Command(ctx, "b")
		require.NoError(t, err)
		require.Equal(t, fleet.CommandApplied, c.State)
	})
}

func TestFleetStoreLeases(t *testing.T) {
	withStore(t, func(t *testing.T, s *models.FleetStore, _ *recorder) {
		ready := sampleNode("ready", "r1", 1)
		ready.State, ready.LeaseExpiresAt = fleet.StateReady, tp(t0)
		lost := sampleNode("lost", "r2", 1)
		lost.State, lost.LeaseExpiresAt = fleet.StateLost, tp(t0.Add(-time.Hour))
		retired := sampleNode("retired", "r3", 1)
		retired.State, retired.LeaseExpiresAt = fleet.StateRetired, tp(t0)
		enrolling := sampleNode("enrolling", "r4", 1)
		stale := sampleNode("stale", "r5", 1)
		stale.State, stale.LeaseExpiresAt = fleet.StateReady, tp(t0.Add(-time.Second))
		insert(t, s, ready, lost, retired, enrolling, stale)

		swept, ok, err := s.SweepLeases(ctx, t0)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, []string{"stale"}, swept, "only ready nodes whose lease ended")

		until := t0.Add(90 * time.Second)
		var batch []fleet.LeaseRenewal
		for _, id := range []string{"ready", "lost", "retired", "enrolling"} {
			batch = append(batch, fleet.LeaseRenewal{NodeID: id, Until: until, HeartbeatAt: tp(t0)})
		}
		_, err = s.RenewLeases(ctx, batch)
		require.NoError(t, err)
		state := func(id string) fleet.Node {
			n, err := s.Node(ctx, id)
			require.NoError(t, err)
			return n
		}
		require.Equal(t, until, *state("ready").LeaseExpiresAt)
		require.Equal(t, fleet.StateReady, state("lost").State, "a heartbeat brings a lost node back")
		require.Equal(t, t0, *state("retired").LeaseExpiresAt, "a retired node gets no lease")
		require.Nil(t, state("enrolling").LeaseExpiresAt)
		// A lease never shrinks.
		_, err = s.RenewLeases(ctx, []fleet.LeaseRenewal{{NodeID: "ready", Until: t0}})
		require.NoError(t, err)
		require.Equal(t, until, *state("ready").LeaseExpiresAt)
		// A node named twice in a batch keeps the later lease and
		// heartbeat; a renewal without a heartbeat keeps the last one.
		later := until.Add(time.Minute)
		_, err = s.RenewLeases(ctx, []fleet.LeaseRenewal{{NodeID: "ready", Until: later, HeartbeatAt: tp(t0.Add(time.Minute))},
			{NodeID: "ready", Until: until}, {NodeID: "lost", Until: later}})
		require.NoError(t, err)
		require.Equal(t, later, *state("ready").LeaseExpiresAt)
		require.Equal(t, t0.Add(time.Minute), *state("ready").LastHeartbeatAt)
		require.Equal(t, later, *state("lost").LeaseExpiresAt)
		require.Equal(t, t0, *state("lost").LastHeartbeatAt, "no heartbeat: the last one stays")

		counts, err := s.CountNodesByState(ctx)
		require.NoError(t, err)
		require.Equal(t, map[fleet.State]int64{fleet.StateReady: 2, fleet.StateLost: 1, fleet.StateRetired: 1, fleet.StateEnrolling: 1}, counts)
		recent, err := s.RecentAudit(ctx, 10)
		require.NoError(t, err)
		require.Len(t, recent, 1)
		require.Equal(t, "node.lost", recent[0].Action)
		require.Equal(t, "stale", recent[0].NodeID)
	})
}

// TestFleetStoreFactsAnnounce: a heartbeat's facts marked Announce (its
// capabilities may have changed) notify the node with the batch's commit,
// for every replica's node cache; unmarked facts and a renewal that writes
// nothing (an enrolling node) notify nothing.
func TestFleetStoreFactsAnnounce(t *testing.T) {
	withStore(t, func(t *testing.T, s *models.FleetStore, rec *recorder) {
		var nodes []fleet.Node
		for _, id := range []string{"changed", "same"} {
			n := sampleNode(id, "rental-"+id, 1)
			n.State, n.LeaseExpiresAt = fleet.StateReady, tp(t0)
			nodes = append(nodes, n)
		}
		insert(t, s, append(nodes, sampleNode("enrolling", "rental-enrolling", 1))...)
		before := len(rec.all())
		facts := func(announce bool) *fleet.FactsUpdate {
			return &fleet.FactsUpdate{JSON: []byte(`{"capabilities":["commands.v1"]}`), ObservedAt: t0, ReceivedAt: t0,
				Disk: fleet.Disk{State: fleet.DiskNeverReported}, Announce: announce}
		}
		until := t0.Add(time.Minute)
		_, err := s.RenewLeases(ctx, []fleet.LeaseRenewal{
			{NodeID: "changed", Until: until, HeartbeatAt: tp(t0), Facts: facts(true)},
			{NodeID: "same", Until: until, HeartbeatAt: tp(t0), Facts: facts(false)},
			{NodeID: "enrolling", Until: until, HeartbeatAt: tp(t0), Facts: facts(true)},
		})
		require.NoError(t, err)
		require.Equal(t, []fleet.Notification{{Kind: fleet.NotifyNode, NodeID: "changed"}}, rec.all()[before:])
	})
}

// TestFleetStoreStateChangesMirrorTheStateMachine: the two state changes
// written in SQL (the lease sweep and a heartbeat's renewal) make only the
// changes fleet.CanTransition allows, from every state.
func TestFleetStoreStateChangesMirrorTheStateMachine(t *testing.T) {
	cases := []struct {
		from, afterSweep, afterRenewal fleet.State
	}{
		{fleet.StateEnrolling, fleet.StateEnrolling, fleet.StateEnrolling},
		{fleet.StateReady, fleet.StateLost, fleet.StateReady},
		{fleet.StateLost, fleet.StateLost, fleet.StateReady},
		{fleet.StateRetired, fleet.StateRetired, fleet.StateRetired},
	}
	// A heartbeat's renewal and a held poll's (no heartbeat time, no
	// facts: a statement of its own) change the same.
	for _, heartbeat := range []bool{true, false} {
		t.Run(fmt.Sprintf("heartbeat=%v", heartbeat), func(t *testing.T) { stateChangesMirror(t, cases, heartbeat) })
	}
}

func stateChangesMirror(t *testing.T, cases []struct{ from, afterSweep, afterRenewal fleet.State }, heartbeat bool) {
	withStore(t, func(t *testing.T, s *models.FleetStore, _ *recorder) {
		for i, c := range cases {
			n := sampleNode(string(c.from), fmt.Sprintf("rental-%d", i), 1)
			// Every lease has lapsed, so the sweep may move any node it would.
			n.State, n.LeaseExpiresAt = c.from, tp(t0.Add(-time.Minute))
			insert(t, s, n)
		}
		state := func(id fleet.State) fleet.State {
			n, err := s.Node(ctx, string(id))
			require.NoError(t, err)
			return n.State
		}
		allowed := func(from, to fleet.State) bool { return from == to || fleet.CanTransition(from, to) }

		_, _, err := s.SweepLeases(ctx, t0)
		require.NoError(t, err)
		for _, c := range cases {
			got := state(c.from)
			require.Equal(t, c.afterSweep, got, "sweep of a %s node", c.from)
			require.True(t, allowed(c.from, got), "sweep moved %s to %s", c.from, got)
		}

		var batch []fleet.LeaseRenewal
		for _, c := range cases {
			r := fleet.LeaseRenewal{NodeID: string(c.from), Until: t0.Add(time.Hour)}
			if heartbeat {
				r.HeartbeatAt = tp(t0)
			}
			batch = append(batch, r)
		}
		changed, err := s.RenewLeases(ctx, batch)
		require.NoError(t, err)
		require.Equal(t, 3, changed, "every node but the enrolling one is written")
		for _, c := range cases {
			n, err := s.Node(ctx, string(c.from))
			require.NoError(t, err)
			if c.afterRenewal == fleet.StateReady {
				require.Equal(t, t0.Add(time.Hour), *n.LeaseExpiresAt, "lease of a %s node", c.from)
			} else {
				require.NotEqual(t, t0.Add(time.Hour), *n.LeaseExpiresAt, "a %s node gets no lease", c.from)
			}
			got := state(c.from)
			require.Equal(t, c.afterRenewal, got, "heartbeat to a %s node (%s after the sweep)", c.from, c.afterSweep)
			require.True(t, allowed(c.afterSweep, got), "heartbeat moved %s to %s", c.afterSweep, got)
		}
	})
}

func TestFleetStoreSessions(t *testing.T) {
	withStore(t, func(t *testing.T, s *models.FleetStore, _ *recorder) {
		sess := []fleet.LiveSession{{NodeID: "n1", Replica: "a", Since: t0, RemoteAddr: "127.0.0.1:1"}}
		require.NoError(t, s.PublishSessions(ctx, "a", t0, t0, sess))
		require.NoError(t, s.PublishSessions(ctx, "b", t0, t0.Add(-time.Minute), []fleet.LiveSession{{NodeID: "n2", Replica: "b", Since: t0}}))
		got, err := s.ListSessions(ctx, t0.Add(-15*time.Second))
		require.NoError(t, err)
		require.Equal(t, sess, got, "a replica that stopped publishing is not listed")
		found, err := s.TouchReplica(ctx, "b", t0)
		require.NoError(t, err)
		require.True(t, found)
		got, err = s.ListSessions(ctx, t0.Add(-15*time.Second))
		require.NoError(t, err)
		require.Len(t, got, 2, "a touched replica is fresh again, its sessions as last published")
		found, err = s.TouchReplica(ctx, "never-published", t0)
		require.NoError(t, err)
		require.False(t, found)
	})
}

// On a shared database one replica sweeps at a time: while another holds the
// sweep lock, a sweep answers that it did not run. The lock is the
// schema's: another schema's sweep (another deployment, another test
// package) holding its own lock does not stop this one.
func TestFleetStoreSweepIsASingleton(t *testing.T) {
	db := dbtest.Open(t, models.Postgres)
	s := models.NewFleetStore(db, "r1", nil)
	lapsed := func(id string) {
		t.Helper()
		n := sampleNode(id, "rent-"+id, 1)
		n.State, n.LeaseExpiresAt = fleet.StateReady, tp(t0.Add(-time.Second))
		insert(t, s, n)
	}
	// hold takes the sweep lock of db's schema in a transaction of its own.
	hold := func(db *models.DB) (release func()) {
		t.Helper()
		holder := db.Begin()
		require.NoError(t, holder.Error)
		var got bool
		require.NoError(t, holder.Raw("SELECT pg_try_advisory_xact_lock("+models.SweepLock+")").Scan(&got).Error)
		require.True(t, got)
		return func() { require.NoError(t, holder.Rollback().Error) }
	}

	lapsed("stale-1")
	release := hold(dbtest.Open(t, models.Postgres))
	lost, swept, err := s.SweepLeases(ctx, t0)
	require.NoError(t, err)
	require.True(t, swept, "another schema's sweep lock held this one back")
	require.Equal(t, []string{"stale-1"}, lost)
	release()

	lapsed("stale-2")
	release = hold(db)
	_, swept, err = s.SweepLeases(ctx, t0)
	require.NoError(t, err)
	require.False(t, swept)
	release()
	lost, swept, err = s.SweepLeases(ctx, t0)
	require.NoError(t, err)
	require.True(t, swept)
	require.Equal(t, []string{"stale-2"}, lost)
}

// A sweep that finds no lapsed lease runs no write batch: it does not hold
// the replica's write lanes back (the exclusive lane) for nothing.
func TestFleetStoreSweepOfNothingWritesNothing(t *testing.T) {
	withStore(t, func(t *testing.T, s *models.FleetStore, _ *recorder) {
		live := sampleNode("live", "r1", 1)
		live.State, live.LeaseExpiresAt = fleet.StateReady, tp(t0.Add(time.Minute))
		insert(t, s, live)
		before := s.GroupStats().Batches
		lost, swept, err := s.SweepLeases(ctx, t0)
		require.NoError(t, err)
		require.True(t, swept)
		require.Empty(t, lost)
		require.Equal(t, before, s.GroupStats().Batches, "no batch ran")

		lost, _, err = s.SweepLeases(ctx, t0.Add(2*time.Minute))
		require.NoError(t, err)
		require.Equal(t, []string{"live"}, lost, "once lapsed, swept")
		require.Equal(t, before+1, s.GroupStats().Batches)
	})
}

// Concurrent transactions (grouped into shared commits on SQLite) keep their
// own outcomes: a failing one undoes only itself and announces nothing.
func TestFleetStoreConcurrentTransactionsKeepTheirOutcomes(t *testing.T) {
	withStore(t, func(t *testing.T, s *models.FleetStore, rec *recorder) {
		insert(t, s, sampleNode("taken", "rent-taken", 1))
		const n = 40
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		boom := errors.New("boom")
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				id := fmt.Sprintf("n%02d", i)
				errs[i] = s.Tx(ctx, func(tx fleet.Tx) error {
					node := sampleNode(id, "rent-"+id, 1)
					if i%4 == 3 {
						node.ID = "taken" // a duplicate key mid-batch
					}
					if err := tx.InsertNode(ctx, node); err != nil {
						return err
					}
					if err := tx.Notify(ctx, fleet.Notification{Kind: fleet.NotifyNode, NodeID: id}); err != nil {
						return err
					}
					if i%4 == 1 {
						return boom
					}
					return nil
				})
			}()
		}
		close(start)
		wg.Wait()
		announced := map[string]bool{}
		for _, note := range rec.all() {
			announced[note.NodeID] = true
		}
		for i := range n {
			id := fmt.Sprintf("n%02d", i)
			_, err := s.Node(ctx, id)
			switch i % 4 {
			case 1:
				require.ErrorIs(t, errs[i], boom)
				require.ErrorIs(t, err, fleet.ErrNoRows, "%s rolled back", id)
				require.False(t, announced[id])
			case 3:
				require.ErrorIs(t, errs[i], fleet.ErrDuplicate)
				require.ErrorIs(t, err, fleet.ErrNoRows)
				require.False(t, announced[id])
			default:
				require.NoError(t, errs[i])
				require.NoError(t, err, "%s committed", id)
				require.True(t, announced[id])
			}
		}
	})
}

// BenchmarkRenewLeases reports what one lease renewal in a batch of 100
// allocates: a held poll's (its own statement) and a heartbeat's (the
// column map and the model's update machinery, which a poll's renewal also
// went through before).
func BenchmarkRenewLeases(b *testing.B) {
	for _, kind := range []string{"poll", "heartbeat"} {
		b.Run(kind, func(b *testing.B) {
			for _, d := range dbtest.Dialects(b) {
				b.Run(d, func(b *testing.B) {
					db := dbtest.Open(b, d)
					s := models.NewFleetStore(db, "r1", nil)
					batch := make([]fleet.LeaseRenewal, 100)
					for i := range batch {
						n := sampleNode(fmt.Sprintf("n%03d", i), fmt.Sprintf("rental-%d", i), 1)
						n.State = fleet.StateReady
						require.NoError(b, s.Tx(ctx, func(tx fleet.Tx) error { return tx.InsertNode(ctx, n) }))
						batch[i] = fleet.LeaseRenewal{NodeID: n.ID}
						if kind == "heartbeat" {
							batch[i].HeartbeatAt = tp(t0)
						}
					}
					var m0, m1 runtime.MemStats
					runtime.ReadMemStats(&m0)
					for i := 0; i < b.N; i++ {
						for j := range batch {
							batch[j].Until = t0.Add(time.Duration(i+1) * time.Second)
						}
						_, err := s.RenewLeases(ctx, batch)
						require.NoError(b, err)
					}
					runtime.ReadMemStats(&m1)
					n := float64(b.N * len(batch))
					b.ReportMetric(float64(m1.TotalAlloc-m0.TotalAlloc)/n, "B/renewal")
					b.ReportMetric(float64(m1.Mallocs-m0.Mallocs)/n, "allocs/renewal")
				})
			}
		})
	}
}

// TestFleetStoreIssueToNode: the node is locked and the command recorded
// at the node's fencing token only when the node is ready, and only then
// is the node notified, here and (Postgres) on the other replicas; an
// absent node is ErrNoRows and a taken operation id ErrDuplicate, both
// dialects.
func TestFleetStoreIssueToNode(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		rec := &recorder{}
		s := models.NewFleetStore(db, "r1", rec.hook)
		var other *listenSink
		if db.Dialect == models.Postgres {
			other = newListenSink()
			runListener(t, &models.Listener{URL: db.URL, Channel: models.NotifyChannel(db), Replica: "r2", Sink: other,
				Log: slog.New(slog.NewTextHandler(&syncBuffer{}, nil)), ProbeInterval: time.Second,
				ProbeTimeout: time.Second, ConnectTimeout: 2 * time.Second})
			testwait.For(t, "the listener to connect", testwait.Patience, func() bool { return other.state().ok })
		}
		ready := sampleNode("ready", "r1", 1)
		ready.State, ready.FencingToken = fleet.StateReady, 7
		lost := sampleNode("lost", "r2", 1)
		lost.State, lost.FencingToken = fleet.StateLost, 3
		insert(t, s, ready, lost, sampleNode("enrolling", "r3", 1))
		issue := func(op, node string) (fleet.Node, bool, error) {
			var n fleet.Node
			var inserted bool
			err := s.Tx(ctx, func(tx fleet.Tx) error {
				var err error
				n, inserted, err = tx.IssueToNode(ctx, fleet.Command{OperationID: op, NodeID: node, Kind: "stop_workload",
					Payload: json.RawMessage(`{"run_id":"r"}`), PayloadDigest: "d", FencingToken: 99, IssuedAt: t0, State: fleet.CommandPending})
				return err
			})
			return n, inserted, err
		}

		n, inserted, err := issue("a", "ready")
		require.NoError(t, err)
		require.True(t, inserted)
		require.Equal(t, "ready", n.ID)
		require.Equal(t, int64(7), n.FencingToken)
		require.Equal(t, fleet.StateReady, n.State)
		c, err := s.Command(ctx, "a")
		require.NoError(t, err)
		require.Equal(t, int64(7), c.FencingToken, "the node's token under the lock, not the caller's")
		require.Equal(t, fleet.CommandPending, c.State)
		require.Equal(t, "ready", c.NodeID)
		require.Equal(t, "d", c.PayloadDigest)
		require.JSONEq(t, `{"run_id":"r"}`, string(c.Payload))
		require.Equal(t, t0, c.IssuedAt)
		require.Zero(t, c.DeliveryCount)
		require.Nil(t, c.FirstDeliveredAt)

		for _, node := range []string{"lost", "enrolling"} {
			n, inserted, err = issue("b-"+node, node)
			require.NoError(t, err, node)
			require.False(t, inserted, node)
			require.Equal(t, node, n.ID)
			_, err = s.Command(ctx, "b-"+node)
			require.ErrorIs(t, err, fleet.ErrNoRows, "nothing recorded for a %s node", node)
		}

		_, _, err = issue("c", "ghost")
		require.ErrorIs(t, err, fleet.ErrNoRows)
		_, _, err = issue("a", "ready")
		require.ErrorIs(t, err, fleet.ErrDuplicate)
		n2, err := s.CountPendingCommands(ctx)
		require.NoError(t, err)
		require.Equal(t, int64(1), n2)
		require.Equal(t, []fleet.Notification{{Kind: fleet.NotifyIssued, NodeID: "ready"}}, rec.all(),
			"the ready node's long-poll, once (this replica claims at once); nothing for a refused or failed issue")
		if other != nil {
			// Notifications arrive in commit order: once the last is heard,
			// none of the refused ones were sent.
			n, inserted, err = issue("d", "ready")
			require.NoError(t, err)
			require.True(t, inserted)
			testwait.For(t, "the other replica to hear both", testwait.Patience, func() bool { return other.state().twice == 1 })
			require.Equal(t, sinkState{ok: true, ups: 1, resyncs: 1, heard: 1, twice: 1}, other.state(), "the ready node's only")
			require.Equal(t, 2, other.kind(fleet.NotifyIssued), "other replicas hear NotifyIssued too: their polls claim at once")
		}
	})
}

// BenchmarkRenewLeasesFleet measures what held polls' lease renewals cost
// Postgres at fleet size: 20,000 ready nodes with realistic facts, renewed
// in batches of 100 spread over the fleet (as coalesced renewals are). It
// reports WAL bytes per renewal and the share of renewals Postgres could
// write as heap-only tuples (no index entries): the mechanism behind the
// figure, read from pg_stat_user_tables, not a timing. Postgres only.
func BenchmarkRenewLeasesFleet(b *testing.B) {
	db := dbtest.Open(b, models.Postgres)
	const fleetSize, batchSize = 20_000, 100
	facts := `{"hostname":"host-0000","os":"linux","arch":"amd64","cpus":8,"memory_bytes":34359738368,"disk_free_bytes":107374182400,` +
		`"agent_version":"1.4.2","runtimes":["process","oci"],"labels":{"zone":"eu-west-1a","pool":"general"},` +
		`"capabilities":["commands.v1","config.v1","output.v1","diag.v1"],"observed_at":"2026-12-01T10:00:00Z"}`
	require.NoError(b, db.Exec(`INSERT INTO nodes (id, rental_id, generation, state, fencing_token, created_at, updated_at,
		enrolled_at, lease_expires_at, agent_version, facts, disk_state, eligible_classes)
		SELECT 'n' || i, 'rental-' || i, 1, 'ready', 1, ?, ?, ?, ?, '1.4.2', ?, 'measured', '[]'
		FROM generate_series(1, ?) AS i`, t0, t0, t0, t0.Add(90*time.Second), facts, fleetSize).Error)
	require.NoError(b, db.Exec(`VACUUM ANALYZE nodes`).Error)
	s := models.NewFleetStore(db, "r1", nil)
	stats := func() (wal, upd, hot int64) {
		require.NoError(b, db.Raw(`SELECT pg_current_wal_lsn() - '0/0', n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
			WHERE relid = 'nodes'::regclass`).Row().Scan(&wal, &upd, &hot))
		return
	}
	batch := make([]fleet.LeaseRenewal, batchSize)
	next := 0
	b.ResetTimer()
	wal0, upd0, hot0 := stats()
	for i := 0; i < b.N; i++ {
		for j := range batch {
			next = (next + 7919) % fleetSize // a prime stride: every node, in no page order
			batch[j] = fleet.LeaseRenewal{NodeID: "n" + strconv.Itoa(next+1), Until: t0.Add(time.Duration(i+2) * 90 * time.Second)}
		}
		_, err := s.RenewLeases(ctx, batch)
		require.NoError(b, err)
	}
	b.StopTimer()
	// The statistics collector reports a backend's counts at its
	// transaction's end, within a second.
	var wal1, upd1, hot1 int64
	deadline := time.Now().Add(10 * time.Second)
	for {
		wal1, upd1, hot1 = stats()
		if upd1-upd0 >= int64(b.N*batchSize) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	n := float64(b.N * batchSize)
	b.ReportMetric(float64(wal1-wal0)/n, "WAL-B/renewal")
	b.ReportMetric(float64(hot1-hot0)/math.Max(float64(upd1-upd0), 1), "HOT-share")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n/1e3, "µs/renewal")
}

// A command's submit locks its node FOR KEY SHARE: another replica's
// lease renewal of that node does not wait for it (nor it for the
// renewal), while a transaction that changes the node's state or fencing
// token (LockNode: enrollment, retirement) still waits for the submit to
// end, and then sees its command.
func TestPostgresSubmitAndRenewalDoNotWaitForEachOther(t *testing.T) {
	db := dbtest.Open(t, models.Postgres)
	issuer, renewer := models.NewFleetStore(db, "r1", nil), models.NewFleetStore(db, "r2", nil)
	n := sampleNode("busy", "rent-busy", 1)
	n.State, n.LeaseExpiresAt = fleet.StateReady, tp(t0.Add(time.Minute))
	insert(t, issuer, n)

	held, release, submitted := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		submitted <- issuer.Tx(ctx, func(tx fleet.Tx) error {
			_, inserted, err := tx.IssueToNode(ctx, fleet.Command{OperationID: "busy-1", NodeID: "busy", Kind: "prepare_image",
				Payload: json.RawMessage(`{}`), PayloadDigest: "d", IssuedAt: t0, State: fleet.CommandPending})
			if err == nil && !inserted {
				err = errors.New("not inserted")
			}
			close(held)
			<-release
			return err
		})
	}()
	<-held
	var once sync.Once
	letGo := func() { once.Do(func() { close(release) }) }
	defer letGo() // a failure below lets the submit end
	type renewal struct {
		n   int
		err error
	}
	renewedc := make(chan renewal, 1)
	go func() {
		n, err := renewer.RenewLeases(ctx, []fleet.LeaseRenewal{{NodeID: "busy", Until: t0.Add(2 * time.Minute)}})
		renewedc <- renewal{n, err}
	}()
	select {
	case r := <-renewedc:
		require.NoError(t, r.err)
		require.Equal(t, 1, r.n)
	case <-time.After(testwait.Patience):
		t.Fatal("the renewal waited for the open submit")
	}

	// The two doors that change a node's standing: retirement's lock and
	// enrollment's redemption (from other stores: transactions of their
	// own, as other replicas run them).
	inv := fleet.Invitation{ID: "busy-inv", NodeID: "busy", Generation: 1, TokenDigest: "d", IssuedAt: t0,
		ExpiresAt: t0.Add(time.Hour), State: fleet.InvitationOutstanding}
	require.NoError(t, renewer.Tx(ctx, func(tx fleet.Tx) error { return tx.InsertInvitation(ctx, inv) }))
	doors := map[string]func(tx fleet.Tx) error{
		"retirement's LockNode": func(tx fleet.Tx) error { _, err := tx.LockNode(ctx, "busy"); return err },
		"enrollment's RedeemInvitation": func(tx fleet.Tx) error {
			_, ok, err := tx.RedeemInvitation(ctx, "busy", "busy-inv", "d", t0)
			if err == nil && !ok {
				err = errors.New("not redeemed")
			}
			return err
		},
	}
	type door struct {
		passed  atomic.Bool
		pending int
		done    chan error
	}
	waiting := map[string]*door{}
	for name, lock := range doors {
		d := &door{done: make(chan error, 1)}
		waiting[name] = d
		go func() {
			d.done <- models.NewFleetStore(db, "r-"+name, nil).Tx(ctx, func(tx fleet.Tx) error {
				if err := lock(tx); err != nil {
					return err
				}
				d.passed.Store(true)
				cmds, err := tx.Commands(ctx, "busy", fleet.CommandPending, 0)
				if err != nil {
					return err
				}
				d.pending = len(cmds)
				return errors.New("rolled back") // leave the node as it was for the other door
			})
		}()
	}
	require.Never(t, func() bool {
		return waiting["retirement's LockNode"].passed.Load() || waiting["enrollment's RedeemInvitation"].passed.Load()
	},
		300*time.Millisecond, 10*time.Millisecond, "a change of the node's standing did not wait for the submit")
	letGo()
	require.NoError(t, <-submitted)
	for name, d := range waiting {
		require.EqualError(t, <-d.done, "rolled back", name)
		require.Equal(t, 1, d.pending, "%s saw the command", name)
	}
}
