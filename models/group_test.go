package models_test

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/testwait"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// Two replicas' group commits lock the same nodes in opposite orders while
// the lease renewals write them too: batches that meet in a deadlock do not
// fail their callers (the refused request runs again alone), and every
// transaction's write lands exactly once.
func TestGroupCommitOverlappingBatchesNeverFailOrRepeat(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		a := models.NewFleetStore(db, "ra", nil)
		b := models.NewFleetStore(db, "rb", nil)
		const nodes = 6
		ids := make([]string, nodes)
		for i := range ids {
			ids[i] = fmt.Sprintf("ov%d", i)
			n := sampleNode(ids[i], "rent-"+ids[i], 1)
			n.State = fleet.StateReady
			insert(t, a, n)
		}
		const per = 24 // transactions per replica
		var wg sync.WaitGroup
		errs := make(chan error, 2*per+64)
		start := make(chan struct{})
		run := func(s *models.FleetStore, name string, order []string) {
			for i := range per {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					errs <- s.Tx(ctx, func(tx fleet.Tx) error {
						for _, id := range order {
							if _, err := tx.LockNode(ctx, id); err != nil {
								return err
							}
						}
						return tx.AppendAudit(ctx, fleet.AuditEntry{At: t0, Actor: "test", Action: "overlap." + name,
							NodeID: ids[0], Detail: map[string]any{"i": i}})
					})
				}()
			}
		}
		reversed := make([]string, nodes)
		for i, id := range ids {
			reversed[nodes-1-i] = id
		}
		run(a, "a", ids)
		run(b, "b", reversed)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range 8 {
				batch := make([]fleet.LeaseRenewal, nodes)
				for i, id := range reversed {
					batch[i] = fleet.LeaseRenewal{NodeID: id, Until: time.Now().Add(time.Minute)}
				}
				_, err := a.RenewLeases(ctx, batch)
				errs <- err
			}
		}()
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		entries, err := a.Audit(ctx, ids[0], 0, 0)
		require.NoError(t, err)
		seen := map[string]int{}
		for _, e := range entries {
			if e.Actor == "test" {
				seen[fmt.Sprintf("%s/%v", e.Action, e.Detail["i"])]++
			}
		}
		require.Len(t, seen, 2*per, "every transaction committed")
		for k, n := range seen {
			require.Equal(t, 1, n, "%s committed once", k)
		}
	})
}

// Audit rows are written with the batch: a request that fails leaves none,
// each that commits leaves its own, once and in its order, and a request
// with more rows than one statement takes still writes them all.
func TestGroupCommitAuditRowsFollowTheirRequest(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := models.NewFleetStore(db, "r1", nil)
		const reqs = 48
		var wg sync.WaitGroup
		start := make(chan struct{})
		refused := fmt.Errorf("refused")
		for i := range reqs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				err := s.Tx(ctx, func(tx fleet.Tx) error {
					for step := range 2 {
						if err := tx.AppendAudit(ctx, fleet.AuditEntry{At: t0, Actor: "test", Action: "audit.step",
							NodeID: "aud", Detail: map[string]any{"i": i, "step": step}}); err != nil {
							return err
						}
					}
					if i%3 == 0 {
						return refused
					}
					return nil
				})
				if i%3 == 0 {
					assert.ErrorIs(t, err, refused)
				} else {
					assert.NoError(t, err)
				}
			}()
		}
		close(start)
		wg.Wait()
		entries, err := s.Audit(ctx, "aud", 0, 0)
		require.NoError(t, err)
		next := map[float64]float64{} // request → its next step, oldest entry first
		for k := len(entries) - 1; k >= 0; k-- {
			i, step := entries[k].Detail["i"].(float64), entries[k].Detail["step"].(float64)
			require.NotZero(t, int(i)%3, "request %v failed: none of its rows", i)
			require.Equal(t, next[i], step, "request %v: its rows once, in order", i)
			next[i]++
		}
		require.Len(t, next, reqs-reqs/3)

		const many = 2500
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
			for i := range many {
				if err := tx.AppendAudit(ctx, fleet.AuditEntry{At: t0, Actor: "test", Action: "audit.many", NodeID: "many",
					Detail: map[string]any{"i": i}}); err != nil {
					return err
				}
			}
			return nil
		}))
		entries, err = s.Audit(ctx, "many", 0, 0)
		require.NoError(t, err)
		require.Len(t, entries, many)
	})
}

// nodesInLanes answers, for n lanes, one node id of each lane (the first
// of "<prefix>0", "<prefix>1", … that falls in it).
func nodesInLanes(prefix string, n int) []string {
	out := make([]string, n)
	found := 0
	for i := 0; found < n; i++ {
		id := fmt.Sprintf("%s%d", prefix, i)
		if l := models.LaneOf(id, n); out[l] == "" {
			out[l] = id
			found++
		}
	}
	return out
}

// The exclusive lane's time and the lanes' wait behind it are counted
// (the metrics nodeward_write_exclusive_seconds_total and
// nodeward_write_lane_gate_wait_seconds_total): an exclusive transaction
// held open counts at least the time it was held, and a lane batch that
// waited behind it at least the time it was seen waiting. SQLite has no
// lanes: every batch is exclusive.
func TestGroupCommitCountsExclusiveTime(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := models.NewFleetStore(db, "r1", nil)
		ids := nodesInLanes("ex", 1)
		insert(t, s, sampleNode(ids[0], "rent-ex", 1))
		before := s.GroupStats()
		held, release := make(chan struct{}), make(chan struct{})
		var heldFor time.Duration
		exclusiveDone := make(chan error, 1)
		go func() {
			exclusiveDone <- s.Tx(ctx, func(fleet.Tx) error {
				start := time.Now()
				close(held)
				<-release
				heldFor = time.Since(start)
				return nil
			})
		}()
		<-held
		var waited time.Duration
		laneDone := make(chan error, 1)
		if db.Dialect == models.Postgres {
			go func() {
				laneDone <- s.Tx(fleet.OnNode(ctx, ids[0]), func(tx fleet.Tx) error {
					_, err := tx.LockNode(ctx, ids[0])
					return err
				})
			}()
			testwait.For(t, "the lane batch to wait at the gate", testwait.Patience, func() bool { return models.GateWaiting(s) == 1 })
			seen := time.Now()
			select {
			case err := <-laneDone:
				t.Fatalf("the lane batch ran while the exclusive one held the gate (%v)", err)
			default:
			}
			// A lower bound, taken before the release: it waits until then
			// at least (taken after, a descheduled test could outlast it).
			waited = time.Since(seen)
			close(release)
		} else {
			close(release)
			laneDone <- nil
		}
		require.NoError(t, <-exclusiveDone)
		require.NoError(t, <-laneDone)
		after := s.GroupStats()
		require.GreaterOrEqual(t, after.Exclusive-before.Exclusive, heldFor, "the exclusive batch's time")
		if db.Dialect == models.Postgres {
			require.GreaterOrEqual(t, after.LaneGateWait-before.LaneGateWait, waited, "the lane's wait")
			require.Positive(t, waited)
		} else {
			require.Zero(t, after.LaneGateWait, "SQLite: no lanes")
		}
	})
}

// Every write batch is observed once (the metric
// nodeward_write_batch_seconds), with at least the time its request's
// work took inside it: as many observations as batches ran, both
// dialects.
func TestGroupCommitObservesEveryBatch(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := models.NewFleetStore(db, "r1", nil)
		var mu sync.Mutex
		var seen []time.Duration
		s.SetOnBatch(func(d time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, d)
		})
		before := s.GroupStats().Batches
		insert(t, s, sampleNode("observed", "rent-observed", 1))
		var inside time.Duration
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
			start := time.Now()
			_, err := tx.LockNode(ctx, "observed")
			inside = time.Since(start)
			return err
		}))
		batches := s.GroupStats().Batches - before
		mu.Lock()
		defer mu.Unlock()
		require.Positive(t, batches)
		require.Len(t, seen, int(batches), "one observation a batch")
		require.GreaterOrEqual(t, seen[len(seen)-1], inside, "at least the batch's own work")
	})
}

// Two transactions routed to nodes of different lanes run at once: each
// waits, inside its transaction, for the other to have started, which
// only happens if their batches run side by side (one batch at a time
// would stop at the first, which gives up and fails after a generous
// bound). SQLite keeps its one writer: no lanes.
func TestGroupCommitLanesRunBatchesAtOnce(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := models.NewFleetStore(db, "r1", nil)
		if db.Dialect != models.Postgres {
			require.Zero(t, s.GroupStats().Lanes, "SQLite: one writer")
			return
		}
		require.Equal(t, 4, s.GroupStats().Lanes, "default for a pool of 32")
		ids := nodesInLanes("at", 4)
		for _, id := range ids {
			insert(t, s, sampleNode(id, "rent-"+id, 1))
		}
		started := make([]chan struct{}, 2)
		for i := range started {
			started[i] = make(chan struct{})
		}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = s.Tx(fleet.OnNode(ctx, ids[i]), func(tx fleet.Tx) error {
					if _, err := tx.LockNode(ctx, ids[i]); err != nil {
						return err
					}
					close(started[i])
					select {
					case <-started[1-i]:
						return nil
					case <-time.After(20 * time.Second):
						return fmt.Errorf("lane of %s never saw the other lane's batch start", ids[i])
					}
				})
			}()
		}
		wg.Wait()
		require.NoError(t, errs[0])
		require.NoError(t, errs[1])
		st := s.GroupStats()
		require.GreaterOrEqual(t, st.MaxRunning, int64(2), "two batches at once")
		require.Zero(t, st.Strays)

		// A transaction with no route runs alone: the exclusive lane.
		before := s.GroupStats().Batches
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
			_, err := tx.LockNodes(ctx, ids)
			return err
		}))
		require.Equal(t, before+1, s.GroupStats().Batches)
	})
}

// Many goroutines on two replicas issue, claim and settle commands of
// overlapping nodes through every lane, while lease batches, fan-out-like
// releases (one transaction locking every node, in reverse order) and
// transactions that stray from their route (routed to one node, locking
// one of another lane) write the same nodes: no request fails, every
// command is issued once, settled once and ends applied.
func TestGroupCommitLanesNeverFailOrRepeat(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		a := models.NewFleetStore(db, "ra", nil)
		b := models.NewFleetStore(db, "rb", nil)
		stores := []*models.FleetStore{a, b}
		const nodes = 12
		ids := make([]string, nodes)
		for i := range ids {
			ids[i] = fmt.Sprintf("ln%02d", i)
			n := sampleNode(ids[i], "rent-"+ids[i], 1)
			n.State = fleet.StateReady
			insert(t, a, n)
		}
		reversed := slices.Clone(ids)
		slices.Reverse(reversed)
		const perNode = 4 // commands each replica issues to each node
		const releases = 3
		var mu sync.Mutex
		var failures []error
		fail := func(err error) {
			if err != nil {
				mu.Lock()
				failures = append(failures, err)
				mu.Unlock()
			}
		}
		command := func(op, node string) fleet.Command {
			return fleet.Command{OperationID: op, NodeID: node, Kind: "stop_workload", Payload: json.RawMessage(`{}`),
				PayloadDigest: "d", FencingToken: 1, IssuedAt: t0, State: fleet.CommandPending}
		}
		// Replica b settles as results are (FleetStore.Settle): its lanes'
		// batches share one statement among their settlements.
		settledShared := map[string]int{}
		settle := func(s *models.FleetStore, node string, cs []fleet.Command) error {
			ops := make([]string, len(cs))
			for i, c := range cs {
				ops[i] = c.OperationID
			}
			if s == b {
				ss := make([]fleet.Settlement, len(cs))
				for i, c := range cs {
					ss[i] = fleet.Settlement{OperationID: c.OperationID, State: fleet.CommandApplied}
				}
				found, _, err := s.Settle(fleet.OnNode(ctx, node), node, time.Now(), ss)
				mu.Lock()
				for _, f := range found {
					if f.Settled {
						settledShared[f.OperationID]++
					}
				}
				mu.Unlock()
				return err
			}
			return s.Tx(fleet.OnNode(ctx, node), func(tx fleet.Tx) error {
				locked, err := tx.LockCommands(ctx, ops)
				if err != nil {
					return err
				}
				var newly []fleet.Command
				for _, op := range ops {
					c := locked[op]
					if c.State != fleet.CommandPending {
						continue // settled already: answered, not applied again
					}
					c.State, c.SettledAt = fleet.CommandApplied, tp(time.Now())
					newly = append(newly, c)
				}
				if _, err := tx.SettleCommands(ctx, newly); err != nil {
					return err
				}
				for _, c := range newly {
					if err := tx.AppendAudit(ctx, fleet.AuditEntry{At: t0, Actor: "test", Action: "settle", NodeID: node,
						Detail: map[string]any{"op": c.OperationID}}); err != nil {
						return err
					}
				}
				return nil
			})
		}

		var issuing, wg sync.WaitGroup
		start := make(chan struct{})
		for si, s := range stores {
			for _, node := range ids {
				issuing.Add(1)
				go func() { // issue, routed to the node
					defer issuing.Done()
					<-start
					for k := range perNode {
						op := fmt.Sprintf("%s-%d-%d", node, si, k)
						fail(s.Tx(fleet.OnNode(ctx, node), func(tx fleet.Tx) error {
							if _, err := tx.LockNode(ctx, node); err != nil {
								return err
							}
							return tx.InsertCommand(ctx, command(op, node))
						}))
					}
				}()
			}
			issuing.Add(1)
			go func() { // fan-out-like releases: every node, no route
				defer issuing.Done()
				<-start
				for k := range releases {
					fail(s.Tx(ctx, func(tx fleet.Tx) error {
						if _, err := tx.LockNodes(ctx, reversed); err != nil {
							return err
						}
						cs := make([]fleet.Command, len(reversed))
						for i, node := range reversed {
							cs[i] = command(fmt.Sprintf("%s-r%d-%d", node, si, k), node)
						}
						return tx.InsertCommands(ctx, cs)
					}))
				}
			}()
			wg.Add(1)
			go func() { // lease batches over every node, split per lane
				defer wg.Done()
				<-start
				for range 6 {
					batch := make([]fleet.LeaseRenewal, nodes)
					for i, id := range reversed {
						batch[i] = fleet.LeaseRenewal{NodeID: id, Until: time.Now().Add(time.Minute)}
					}
					_, err := s.RenewLeases(ctx, batch)
					fail(err)
				}
			}()
			wg.Add(1)
			go func() { // strays: routed to one node, locking a node of another lane too
				defer wg.Done()
				<-start
				for k := range 8 {
					from, to := ids[k%nodes], ids[(k+5)%nodes]
					fail(s.Tx(fleet.OnNode(ctx, from), func(tx fleet.Tx) error {
						if _, err := tx.LockNode(ctx, from); err != nil {
							return err
						}
						_, err := tx.LockNode(ctx, to)
						return err
					}))
				}
			}()
		}
		issued := make(chan struct{})
		go func() { issuing.Wait(); close(issued) }()
		for _, node := range ids {
			for si, s := range stores {
				wg.Add(1)
				go func() { // claim and settle, routed to the node, until nothing is left
					defer wg.Done()
					<-start
					for round := 0; round < 10000; round++ {
						done := false
						select {
						case <-issued:
							done = true
						default:
						}
						now := time.Now()
						var cs []fleet.Command
						err := s.Tx(fleet.OnNode(ctx, node), func(tx fleet.Tx) error {
							var err error
							_, cs, err = tx.ClaimDue(ctx, fleet.Due{NodeID: node, Fencing: int64(si + 1), Now: now,
								RedeliverBefore: now, Limit: 3})
							return err
						})
						fail(err)
						if len(cs) > 0 {
							fail(settle(s, node, cs))
							continue
						}
						if done {
							return
						}
						runtime.Gosched()
					}
					fail(fmt.Errorf("claimer of %s never finished", node))
				}()
			}
		}
		close(start)
		issuing.Wait()
		wg.Wait()
		require.Empty(t, failures)

		want := nodes * len(stores) * (perNode + releases)
		settled := map[string]int{}
		for _, node := range ids {
			entries, err := a.Audit(ctx, node, 0, 0)
			require.NoError(t, err)
			for _, e := range entries {
				if e.Action == "settle" {
					settled[e.Detail["op"].(string)]++
				}
			}
			cs, err := a.Commands(ctx, node, "", 0)
			require.NoError(t, err)
			require.Len(t, cs, len(stores)*(perNode+releases), "%s: every command issued once", node)
			for _, c := range cs {
				require.Equal(t, fleet.CommandApplied, c.State, c.OperationID)
			}
		}
		for op, n := range settledShared {
			settled[op] += n
		}
		require.Len(t, settled, want, "every command settled")
		for op, n := range settled {
			require.Equal(t, 1, n, "%s applied once", op)
		}
		t.Logf("replica a: %+v; replica b: %+v", a.GroupStats(), b.GroupStats())
		require.NotEmpty(t, settledShared, "replica b settled some")
		if db.Dialect == models.Postgres {
			require.Positive(t, b.GroupStats().SettleStatements, "replica b's settlements ran in shared statements")
			require.Positive(t, a.GroupStats().Strays+b.GroupStats().Strays, "the strays ran again, alone")
		}
	})
}

// A request that fails inside a batch leaves none of its writes, and
// every other request of the batch commits its own, once: the batch ran
// first without savepoints, so the failure sent it round again
// with them (Reruns), the failed request alone rolled back; the next batch
// keeps savepoints from the start, and one that runs clean drops them.
func TestGroupCommitFailedRequestLeavesNothing(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := models.NewFleetStore(db, "r1", nil)
		n := sampleNode("gf", "rent-gf", 1)
		n.State = fleet.StateReady
		insert(t, s, n)
		refused := fmt.Errorf("refused")
		// batch runs reqs requests in one batch, those with i%4 == 0
		// failing after their write: a first request holds the lane
		// until the others are queued behind it.
		batch := func(round string, reqs int, fail bool) {
			held, release := make(chan struct{}), make(chan struct{})
			go func() {
				assert.NoError(t, s.Tx(ctx, func(fleet.Tx) error { close(held); <-release; return nil }))
			}()
			<-held
			var wg sync.WaitGroup
			for i := range reqs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					err := s.Tx(ctx, func(tx fleet.Tx) error {
						if err := tx.InsertCommand(ctx, fleet.Command{OperationID: fmt.Sprintf("%s-%d", round, i), NodeID: "gf",
							Kind: "stop_workload", Payload: json.RawMessage(`{}`), PayloadDigest: "d", FencingToken: 1,
							IssuedAt: t0, State: fleet.CommandPending}); err != nil {
							return err
						}
						if fail && i%4 == 0 {
							return refused // after its write
						}
						return nil
					})
					if fail && i%4 == 0 {
						assert.ErrorIs(t, err, refused)
					} else {
						assert.NoError(t, err)
					}
				}()
			}
			testwait.For(t, "the requests to queue", testwait.Patience, func() bool { return models.QueuedExclusive(s) == reqs })
			close(release)
			wg.Wait()
			for i := range reqs {
				_, err := s.Command(ctx, fmt.Sprintf("%s-%d", round, i))
				if fail && i%4 == 0 {
					require.ErrorIs(t, err, fleet.ErrNoRows, "%s: request %d failed: its write is gone", round, i)
				} else {
					require.NoError(t, err, "%s: request %d committed", round, i)
				}
			}
		}
		reruns := func() int64 { return s.GroupStats().Reruns }
		batch("clean", 12, false)
		require.Zero(t, reruns(), "a clean batch runs once")
		batch("failing", 40, true)
		want := int64(1)
		require.Equal(t, want, reruns(), "the failed request sent its batch round again")
		batch("after", 40, true)
		require.Equal(t, want, reruns(), "savepoints from the start after a failure")
		batch("clean-again", 12, false)
		batch("failing-again", 40, true)
		require.Equal(t, 2*want, reruns(), "a clean batch dropped the savepoints again")
	})
}

// A transaction routed to an operation of no node (a fan-out's parent,
// fleet.OnOperation) runs in a lane: locking that operation keeps to its
// route; locking another such operation, or releasing held children
// (their nodes' rows, of every lane), strays and runs again alone in the
// exclusive lane — and succeeds there.
func TestGroupCommitOperationRoute(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		fs := models.NewFleetStore(db, "r1", nil)
		if db.Dialect != models.Postgres {
			t.Skip("SQLite: one writer, no lanes")
		}
		s := models.NewLedgerStore(fs)
		mk := func(id string) {
			op := ledger.Operation{
				ID: id, RequestID: "req-" + id, Digest: "d",
				PrincipalKind: ledger.PrincipalAdmin, PrincipalID: "u1", Family: "fleet", Kind: "fleet.command",
				State: ledger.StatePending, Channel: ledger.ChannelLocal, Targets: []ledger.Target{{Kind: "fleet"}},
				Operation: json.RawMessage(`{}`), CreatedAt: t0, Deadline: t0.Add(time.Minute), UpdatedAt: t0,
			}
			op.TargetKind = "fleet"
			require.NoError(t, s.Insert(ctx, &op))
		}
		mk("parent-a")
		mk("parent-b")

		before := fs.GroupStats()
		require.NoError(t, s.Tx(fleet.OnOperation(ctx, "parent-a"), func(tx ledger.Tx) error {
			_, err := tx.LockOperation(ctx, "parent-a")
			return err
		}))
		after := fs.GroupStats()
		require.Equal(t, before.Strays, after.Strays, "its own operation")
		require.Equal(t, before.Exclusive, after.Exclusive, "in a lane")

		runs := 0
		require.NoError(t, s.Tx(fleet.OnOperation(ctx, "parent-a"), func(tx ledger.Tx) error {
			runs++
			_, err := tx.LockOperation(ctx, "parent-b")
			return err
		}))
		require.Equal(t, 2, runs, "strayed, then ran again")
		require.Equal(t, after.Strays+1, fs.GroupStats().Strays)
		require.Greater(t, fs.GroupStats().Exclusive, after.Exclusive, "ran again in the exclusive lane")

		strays := fs.GroupStats().Strays
		require.NoError(t, s.Tx(fleet.OnOperation(ctx, "parent-a"), func(tx ledger.Tx) error {
			_, err := tx.ReleaseHeld(ctx, "parent-a", 10, t0)
			return err
		}))
		require.Equal(t, strays+1, fs.GroupStats().Strays, "releasing held children strays")
	})
}

// A request whose caller gave up while it queued behind a batch (an
// agent's enrollment that timed out) is not run: its caller gets its
// context's error and nothing of it is written, while the requests queued
// beside it run as usual.
func TestGroupCommitSkipsRequestsWhoseCallerGaveUp(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := models.NewFleetStore(db, "r1", nil)
		running, release := make(chan struct{}), make(chan struct{})
		busy := make(chan error, 1)
		go func() {
			busy <- s.Tx(ctx, func(tx fleet.Tx) error {
				close(running)
				<-release
				return nil
			})
		}()
		<-running // the lane's batch is under way: whatever asks now queues
		gaveUp, cancel := context.WithCancel(ctx)
		var ran atomic.Bool
		skipped, kept := make(chan error, 1), make(chan error, 1)
		go func() {
			skipped <- s.Tx(gaveUp, func(tx fleet.Tx) error {
				ran.Store(true)
				return tx.AppendAudit(ctx, fleet.AuditEntry{At: t0, Actor: "test", Action: "gave.up", NodeID: "n1"})
			})
		}()
		go func() {
			kept <- s.Tx(ctx, func(tx fleet.Tx) error {
				return tx.AppendAudit(ctx, fleet.AuditEntry{At: t0, Actor: "test", Action: "kept", NodeID: "n1"})
			})
		}()
		testwait.For(t, "both requests queued behind the batch", time.Minute, func() bool { return models.QueuedExclusive(s) == 2 })
		cancel()
		close(release)
		require.NoError(t, <-busy)
		require.ErrorIs(t, <-skipped, context.Canceled)
		require.NoError(t, <-kept)
		require.False(t, ran.Load(), "the request whose caller gave up never ran")
		require.Zero(t, dbtest.Count(t, db.DB, &models.NodeAudit{}, "action = ?", "gave.up"))
		require.EqualValues(t, 1, dbtest.Count(t, db.DB, &models.NodeAudit{}, "action = ?", "kept"))
	})
}

// TestGroupCommitSkipsRequestsWhoseCallerGaveUpAtTheGate: a lane batch
// held at the gate by an exclusive one does not run the requests whose
// caller gave up meanwhile (an enrollment past its queue bound is one),
// and runs the others. Postgres: SQLite has no lanes.
func TestGroupCommitSkipsRequestsWhoseCallerGaveUpAtTheGate(t *testing.T) {
	db := dbtest.Open(t, models.Postgres)
	s := models.NewFleetStore(db, "r1", nil)
	ids := nodesInLanes("gate", 1)
	insert(t, s, sampleNode(ids[0], "rent-gate", 1))
	held, release := make(chan struct{}), make(chan struct{})
	exclusiveDone := make(chan error, 1)
	go func() {
		exclusiveDone <- s.Tx(ctx, func(fleet.Tx) error {
			close(held)
			<-release
			return nil
		})
	}()
	<-held
	gaveUp, cancel := context.WithCancel(ctx)
	var ran atomic.Bool
	skipped := make(chan error, 1)
	go func() {
		skipped <- s.Tx(fleet.OnNode(gaveUp, ids[0]), func(tx fleet.Tx) error {
			ran.Store(true)
			return tx.AppendAudit(ctx, fleet.AuditEntry{At: t0, Actor: "test", Action: "gave.up", NodeID: ids[0]})
		})
	}()
	testwait.For(t, "the lane batch to wait at the gate", testwait.Patience, func() bool { return models.GateWaiting(s) == 1 })
	cancel()
	close(release)
	require.NoError(t, <-exclusiveDone)
	require.ErrorIs(t, <-skipped, context.Canceled)
	require.False(t, ran.Load(), "the request whose caller gave up at the gate never ran")
	require.Zero(t, dbtest.Count(t, db.DB, &models.NodeAudit{}, "action = ?", "gave.up"))
	// The lane runs on.
	require.NoError(t, s.Tx(fleet.OnNode(ctx, ids[0]), func(tx fleet.Tx) error {
		return tx.AppendAudit(ctx, fleet.AuditEntry{At: t0, Actor: "test", Action: "kept", NodeID: ids[0]})
	}))
	require.EqualValues(t, 1, dbtest.Count(t, db.DB, &models.NodeAudit{}, "action = ?", "kept"))
}

// A bulk transaction (a fan-out's first: thousands of children) runs
// beside the lanes, not in one: while it is held, a transaction of a node
// in its operation's lane and an exclusive one both commit. In its
// operation's lane it held that lane back, and once the exclusive request
// waited at the gate behind it, every lane. A lock outside its operation
// strays, and the transaction runs again in the exclusive lane. SQLite
// has one writer: the bulk transaction is its batch like any other.
func TestGroupCommitBulkBesideTheLanes(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		fs := models.NewFleetStore(db, "r1", nil)
		s := models.NewLedgerStore(fs)
		const parent = "bulk-parent"
		op := ledger.Operation{
			ID: parent, RequestID: "req-" + parent, Digest: "d",
			PrincipalKind: ledger.PrincipalAdmin, PrincipalID: "u1", Family: "fleet", Kind: "fleet.command",
			State: ledger.StatePending, Channel: ledger.ChannelLocal, Targets: []ledger.Target{{Kind: "fleet"}},
			Operation: json.RawMessage(`{}`), CreatedAt: t0, Deadline: t0.Add(time.Minute), UpdatedAt: t0, TargetKind: "fleet",
		}
		require.NoError(t, s.Insert(ctx, &op))
		lockParent := func(tx ledger.Tx) error {
			_, err := tx.LockOperation(ctx, parent)
			return err
		}
		if db.Dialect != models.Postgres {
			require.NoError(t, s.Tx(fleet.OnOperationBulk(ctx, parent), lockParent))
			return
		}
		lanes := fs.GroupStats().Lanes
		node := nodesInLanes("bulk", lanes)[models.LaneOf("operation:"+parent, lanes)]
		insert(t, fs, sampleNode(node, "rent-"+node, 1))

		before := fs.GroupStats()
		held, release := make(chan struct{}), make(chan struct{})
		bulkDone := make(chan error, 1)
		go func() {
			bulkDone <- s.Tx(fleet.OnOperationBulk(ctx, parent), func(tx ledger.Tx) error {
				if err := lockParent(tx); err != nil {
					return err
				}
				close(held)
				<-release
				return nil
			})
		}()
		<-held
		lockNode := func(tx fleet.Tx) error {
			_, err := tx.LockNode(ctx, node)
			return err
		}
		exclusive := make(chan error, 1)
		go func() { exclusive <- fs.Tx(ctx, lockNode) }()
		lane := make(chan error, 1)
		go func() { lane <- fs.Tx(fleet.OnNode(ctx, node), lockNode) }()
		for name, done := range map[string]chan error{"the exclusive transaction": exclusive, "the lane's transaction": lane} {
			select {
			case err := <-done:
				require.NoError(t, err, name)
			case <-time.After(testwait.Patience):
				close(release)
				t.Fatalf("%s waited for the bulk transaction", name)
			}
		}
		close(release)
		require.NoError(t, <-bulkDone)
		after := fs.GroupStats()
		require.Equal(t, before.Strays, after.Strays)
		require.GreaterOrEqual(t, after.MaxRunning, int64(2), "beside the others")

		runs := 0
		require.NoError(t, s.Tx(fleet.OnOperationBulk(ctx, parent), func(tx ledger.Tx) error {
			runs++
			_, err := tx.Fleet().LockNode(ctx, node)
			return err
		}))
		require.Equal(t, 2, runs, "strayed, then ran again")
		require.Equal(t, after.Strays+1, fs.GroupStats().Strays)
	})
}

// Background writes (fleet.TxRoute.Background: a fleet.configure's
// deliveries and reports, queued by the thousand) take at most
// MaxBackground of a batch: a write that arrives behind hundreds of them
// runs in the next batch, and that batch, like every batch of theirs, is
// short. They keep their share of each batch while they wait, so a flood
// of the others does not starve them either. Within that share a
// finishing write (a report) goes ahead of the background crowd (the
// deliveries still queued). Both dialects, in the exclusive lane
// (SQLite's one writer).
func TestGroupCommitBackgroundFillsTheBatch(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := models.NewFleetStore(db, "r1", nil)
		background := fleet.WithTxRoute(ctx, fleet.TxRoute{Background: true})
		finishing := fleet.WithTxRoute(ctx, fleet.TxRoute{Background: true, Finishing: true})
		const queued = 200
		// order answers the position each write ran at, once the
		// exclusive lane, held while they queue, lets them through: queued
		// writes of the crowd's kind, then one of the other.
		order := func(crowd, last context.Context) (lastAt int, batches int64) {
			var mu sync.Mutex
			var ran []string
			write := func(c context.Context, name string) <-chan error {
				done := make(chan error, 1)
				go func() {
					done <- s.Tx(c, func(fleet.Tx) error {
						mu.Lock()
						defer mu.Unlock()
						ran = append(ran, name)
						return nil
					})
				}()
				return done
			}
			held, release := make(chan struct{}), make(chan struct{})
			busy := make(chan error, 1)
			go func() {
				busy <- s.Tx(ctx, func(fleet.Tx) error {
					close(held)
					<-release
					return nil
				})
			}()
			<-held
			var all []<-chan error
			for i := range queued {
				all = append(all, write(crowd, fmt.Sprint("crowd-", i)))
			}
			testwait.For(t, "the crowd queued", testwait.Patience, func() bool { return models.QueuedExclusive(s) == queued })
			all = append(all, write(last, "last"))
			testwait.For(t, "the last write queued", testwait.Patience, func() bool { return models.QueuedExclusive(s) == queued+1 })
			before := s.GroupStats().Batches
			close(release)
			require.NoError(t, <-busy)
			for _, done := range all {
				require.NoError(t, <-done)
			}
			require.Len(t, ran, queued+1)
			return slices.Index(ran, "last"), s.GroupStats().Batches - before
		}
		at, batches := order(background, ctx)
		require.Less(t, at, models.MaxBatch, "ahead of the background crowd: in the next batch")
		require.GreaterOrEqual(t, batches, int64(queued/models.MaxBackground), "the background crowd goes in short batches")
		at, _ = order(ctx, background)
		require.Less(t, at, models.MaxBatch, "background keeps its share of the next batch")
		at, _ = order(background, finishing)
		require.Less(t, at, models.MaxBackground, "a report goes ahead of the deliveries queued before it")
	})
}
