package models_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/testwait"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// TestSettlePending: the settlement a node's results ask for is written
// only to the node's pending commands; every command asked for is
// answered as found (another node's, one settled before), an unknown one
// is absent; the answer says whether the node has another pending
// command. On Postgres, where the statement also locks another lane's
// command, the request strays and runs again alone.
func TestSettlePending(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := models.NewFleetStore(db, "r1", nil)
		const lanes = 4
		s.SetWriteLanes(lanes)
		own := "sp-node"
		other := ""
		for i := 0; other == ""; i++ {
			if id := fmt.Sprintf("sp-other-%d", i); models.LaneOf(id, lanes) != models.LaneOf(own, lanes) {
				other = id
			}
		}
		insert(t, s, sampleNode(own, "sp-r1", 1), sampleNode(other, "sp-r2", 1))
		command := func(op, node string, st fleet.CommandState) fleet.Command {
			c := fleet.Command{OperationID: op, NodeID: node, Kind: "launch_workload", Payload: json.RawMessage(`{}`),
				PayloadDigest: "d", FencingToken: 1, IssuedAt: t0, State: st}
			if st == fleet.CommandRefused {
				c.FailureCode, c.FailureMessage, c.SettledAt = "node_retired", "retired", tp(t0)
			}
			return c
		}
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
			return tx.InsertCommands(ctx, []fleet.Command{command("sp-a", own, fleet.CommandPending),
				command("sp-b", own, fleet.CommandPending), command("sp-done", own, fleet.CommandRefused),
				command("sp-left", own, fleet.CommandPending), command("sp-x", other, fleet.CommandPending)})
		}))
		settle := func(ss ...fleet.Settlement) ([]fleet.SettleFound, bool) {
			var found []fleet.SettleFound
			var left bool
			require.NoError(t, s.Tx(fleet.OnNode(ctx, own), func(tx fleet.Tx) error {
				var err error
				found, left, err = tx.SettlePending(ctx, own, t0.Add(time.Hour), ss)
				return err
			}))
			sort.Slice(found, func(i, j int) bool { return found[i].OperationID < found[j].OperationID })
			return found, left
		}
		strays := s.GroupStats().Strays
		found, left := settle(
			fleet.Settlement{OperationID: "sp-x", State: fleet.CommandApplied},
			fleet.Settlement{OperationID: "sp-b", State: fleet.CommandRefused, FailureCode: "refused_by_node", FailureMessage: "pull failed"},
			fleet.Settlement{OperationID: "sp-missing", State: fleet.CommandApplied},
			fleet.Settlement{OperationID: "sp-a", State: fleet.CommandApplied, Duplicate: true},
			fleet.Settlement{OperationID: "sp-done", State: fleet.CommandApplied},
		)
		require.Equal(t, []fleet.SettleFound{
			{OperationID: "sp-a", NodeID: own, Kind: "launch_workload", State: fleet.CommandPending, Settled: true},
			{OperationID: "sp-b", NodeID: own, Kind: "launch_workload", State: fleet.CommandPending, Settled: true},
			{OperationID: "sp-done", NodeID: own, Kind: "launch_workload", State: fleet.CommandRefused, FailureCode: "node_retired"},
			{OperationID: "sp-x", NodeID: other, Kind: "launch_workload", State: fleet.CommandPending},
		}, found)
		require.True(t, left, "sp-left is pending")
		if db.Dialect == models.Postgres {
			require.Equal(t, strays+1, s.GroupStats().Strays, "another lane's command locked: ran again alone")
		}
		get := func(op string) fleet.Command {
			c, err := s.Command(ctx, op)
			require.NoError(t, err)
			return c
		}
		a, b := get("sp-a"), get("sp-b")
		require.Equal(t, fleet.CommandApplied, a.State)
		require.Empty(t, a.FailureCode)
		require.Equal(t, t0.Add(time.Hour), *a.SettledAt)
		require.Equal(t, fleet.CommandRefused, b.State)
		require.Equal(t, "refused_by_node", b.FailureCode)
		require.Equal(t, "pull failed", b.FailureMessage)
		require.Equal(t, command("sp-done", own, fleet.CommandRefused).FailureMessage, get("sp-done").FailureMessage)
		require.Equal(t, t0, *get("sp-done").SettledAt, "settled before: unchanged")
		require.Equal(t, fleet.CommandPending, get("sp-x").State, "another node's: unchanged")

		found, left = settle(fleet.Settlement{OperationID: "sp-left", State: fleet.CommandApplied})
		require.Len(t, found, 1)
		require.True(t, found[0].Settled)
		require.False(t, left, "nothing pending left")

		// Two replicas settle overlapping sets of one node's commands at
		// once, in opposite orders: each command is settled by one call.
		s2 := models.NewFleetStore(db, "r2", nil)
		const n = 30
		var cs []fleet.Command
		for i := range n {
			cs = append(cs, command(fmt.Sprintf("sp-c%02d", i), own, fleet.CommandPending))
		}
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error { return tx.InsertCommands(ctx, cs) }))
		var mu sync.Mutex
		settled := map[string]int{}
		var errs []error
		var wg sync.WaitGroup
		for w, st := range []*models.FleetStore{s, s2, s, s2} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := 0; k < n; k += 5 {
					var ss []fleet.Settlement
					for j := range 10 {
						i := (k + j) % n
						if w%2 == 1 {
							i = n - 1 - i
						}
						ss = append(ss, fleet.Settlement{OperationID: cs[i].OperationID, State: fleet.CommandApplied})
					}
					var found []fleet.SettleFound
					err := st.Tx(fleet.OnNode(ctx, own), func(tx fleet.Tx) error {
						var err error
						found, _, err = tx.SettlePending(ctx, own, time.Now(), ss)
						return err
					})
					mu.Lock()
					if err != nil {
						errs = append(errs, err)
					}
					for _, f := range found {
						if f.Settled {
							settled[f.OperationID]++
						}
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		require.Empty(t, errs)
		require.Len(t, settled, n)
		for op, k := range settled {
			require.Equal(t, 1, k, "%s settled once", op)
			require.Equal(t, fleet.CommandApplied, get(op).State)
		}
	})
}

// TestSettleSharesOneStatement: settlements of many nodes that meet in one
// batch are written by one statement on Postgres (FleetStore.Settle), and
// each request is answered exactly as it would have been alone: only its
// node's pending commands settled, another node's and an unknown one
// answered as found, its own "another pending" answer, its operations
// ended with their events and announced to it. The same result posted
// twice at once is settled by the first post and found settled by the
// second. SQLite answers the same, a request at a time.
func TestSettleSharesOneStatement(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		rec := &recorder{}
		s := models.NewFleetStore(db, "r1", rec.hook)
		s.SetWriteLanes(0) // one lane: the held request keeps every other in one batch
		const nodes = 6
		var ids []string
		for i := range nodes {
			ids = append(ids, fmt.Sprintf("ss-%d", i))
			n := sampleNode(ids[i], "ss-rent-"+ids[i], 1)
			n.State = fleet.StateReady
			insert(t, s, n)
		}
		// Each node: a launch and a prepare delivered, and (even nodes) one
		// more left pending; each command with its running operation.
		var cs []fleet.Command
		for i, id := range ids {
			for _, k := range []string{"launch_workload", "prepare_image", "stop_workload"} {
				if k == "stop_workload" && i%2 == 1 {
					continue
				}
				cs = append(cs, fleet.Command{OperationID: id + "-" + k, NodeID: id, Kind: k, Payload: json.RawMessage(`{}`),
					PayloadDigest: "d", FencingToken: 1, IssuedAt: t0, State: fleet.CommandPending})
			}
		}
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error { return tx.InsertCommands(ctx, cs) }))
		for _, c := range cs {
			require.NoError(t, db.Exec(`INSERT INTO operations (id, request_id, digest, principal_kind, principal_id, family, kind,
					state, terminal, channel, target_kind, target_id, operation, created_at, deadline, updated_at)
				VALUES (?, ?, 'd', 'admin', 'u1', 'commands', ?, 'running', FALSE, 'long_poll', 'node', ?, '{}', ?, ?, ?)`,
				c.OperationID, "req-"+c.OperationID, "node."+c.Kind, c.NodeID, t0, t0.Add(time.Hour), t0).Error)
		}
		// The requests: each node applies its launch and refuses its
		// prepare; node 1 also names node 0's stop and an unknown id;
		// node 2's request is posted twice.
		at := t0.Add(time.Minute)
		type ask struct {
			node string
			ss   []fleet.Settlement
		}
		var asks []ask
		for i, id := range ids {
			ss := []fleet.Settlement{
				{OperationID: id + "-launch_workload", State: fleet.CommandApplied},
				{OperationID: id + "-prepare_image", State: fleet.CommandRefused, FailureCode: "refused_by_node", FailureMessage: "pull failed"},
			}
			if i == 1 {
				ss = append(ss, fleet.Settlement{OperationID: ids[0] + "-stop_workload", State: fleet.CommandApplied},
					fleet.Settlement{OperationID: "ss-unknown", State: fleet.CommandApplied})
			}
			asks = append(asks, ask{id, ss})
			if i == 2 {
				asks = append(asks, ask{id, ss})
			}
		}
		held, release := make(chan struct{}), make(chan struct{})
		go func() {
			assert.NoError(t, s.Tx(ctx, func(fleet.Tx) error { close(held); <-release; return nil }))
		}()
		<-held
		before := s.GroupStats()
		found := make([][]fleet.SettleFound, len(asks))
		left := make([]bool, len(asks))
		var wg sync.WaitGroup
		for i, a := range asks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var err error
				found[i], left[i], err = s.Settle(ctx, a.node, at, a.ss)
				assert.NoError(t, err)
				sort.Slice(found[i], func(x, y int) bool { return found[i][x].OperationID < found[i][y].OperationID })
			}()
			// One at a time into the queue, so the duplicate post is second.
			testwait.For(t, "the request to queue", testwait.Patience, func() bool { return models.QueuedExclusive(s) == i+1 })
		}
		close(release)
		wg.Wait()

		after := s.GroupStats()
		if db.Dialect == models.Postgres {
			require.Equal(t, before.SettleStatements+1, after.SettleStatements, "one statement for the batch's settlements")
			require.Equal(t, before.SettlesMerged+int64(len(asks)-1), after.SettlesMerged,
				"every request but the repeated post, which ran in its turn")
		} else {
			require.Zero(t, after.SettleStatements, "SQLite: a request at a time")
		}
		for k, a := range asks {
			i := slices.Index(ids, a.node)
			repeat := k > 0 && asks[k-1].node == a.node
			want := []fleet.SettleFound{
				{OperationID: a.node + "-launch_workload", NodeID: a.node, Kind: "launch_workload", State: fleet.CommandPending, Settled: true},
				{OperationID: a.node + "-prepare_image", NodeID: a.node, Kind: "prepare_image", State: fleet.CommandPending, Settled: true},
			}
			if repeat {
				want[0].State, want[0].Settled = fleet.CommandApplied, false
				want[1].State, want[1].Settled, want[1].FailureCode = fleet.CommandRefused, false, "refused_by_node"
			}
			if i == 1 {
				want = append(want, fleet.SettleFound{OperationID: ids[0] + "-stop_workload", NodeID: ids[0], Kind: "stop_workload",
					State: fleet.CommandPending})
			}
			sort.Slice(want, func(x, y int) bool { return want[x].OperationID < want[y].OperationID })
			require.Equal(t, want, found[k], "request %d (%s)", k, a.node)
			if !repeat { // (meaningless when nothing was settled)
				require.Equal(t, i%2 == 0, left[k], "request %d (%s): another command pending", k, a.node)
			}
		}

		type opRow struct {
			State          string
			Terminal       bool
			ErrorCode      *string
			ErrorRetryable *bool
			FinishedAt     *time.Time
		}
		for _, c := range cs {
			var o opRow
			require.NoError(t, db.Raw(`SELECT state, terminal, error_code, error_retryable, finished_at FROM operations WHERE id = ?`,
				c.OperationID).Scan(&o).Error)
			events := dbtest.Count(t, db.DB, &models.OperationEvent{}, "operation_id = ?", c.OperationID)
			got, err := s.Command(ctx, c.OperationID)
			require.NoError(t, err)
			switch c.Kind {
			case "launch_workload":
				require.Equal(t, fleet.CommandApplied, got.State)
				require.Equal(t, "succeeded", o.State, c.OperationID)
			case "prepare_image":
				require.Equal(t, fleet.CommandRefused, got.State)
				require.Equal(t, "failed", o.State, c.OperationID)
				require.Equal(t, "refused_by_node", *o.ErrorCode)
				require.True(t, *o.ErrorRetryable, "a refused prepare is retryable")
			default:
				require.Equal(t, fleet.CommandPending, got.State, "%s: named by another node, unchanged", c.OperationID)
				require.Equal(t, "running", o.State)
				require.False(t, o.Terminal)
				require.Zero(t, events)
				continue
			}
			require.True(t, o.Terminal)
			require.True(t, at.Equal(*o.FinishedAt), "%s finished at the settlement's time", c.OperationID)
			require.True(t, at.Equal(*got.SettledAt))
			require.Equal(t, int64(1), events, "%s: one end event", c.OperationID)
		}
		announced := map[string]int{}
		for _, n := range rec.all() {
			if n.Kind == fleet.NotifyOperation {
				announced[n.NodeID]++
			}
		}
		for _, c := range cs {
			want := 1
			if c.Kind == "stop_workload" {
				want = 0
			}
			require.Equal(t, want, announced[c.OperationID], "%s announced once it ended", c.OperationID)
		}
	})
}

// A shared settlement statement that locked another lane's command (a
// result naming a command of a node in another lane). Inside a
// transaction (a batch with other requests) it is rolled back whole: the
// batch runs again with savepoints, each settlement in its own statement,
// the straying request alone in the exclusive lane after it. A batch of
// settlements only runs its statement outside a transaction, which lets
// go of the lock when it ends, so nothing runs again. Either way every
// request is answered as if it had run alone. Postgres only: SQLite has
// one lane.
func TestSettleSharedStatementStrays(t *testing.T) {
	for _, tc := range []struct {
		name           string
		withOther      bool // a request that is no settlement joins the batch
		strays, reruns int64
	}{
		{name: "InATransaction", withOther: true, strays: 1, reruns: 1},
		{name: "SettlementsOnly", withOther: false, strays: 0, reruns: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dbtest.Each(t, func(t *testing.T, db *models.DB) {
				if db.Dialect != models.Postgres {
					t.Skip("SQLite: one writer, no lanes")
				}
				settleStrays(t, db, tc.withOther, tc.strays, tc.reruns)
			})
		})
	}
}

func settleStrays(t *testing.T, db *models.DB, withOther bool, strays, reruns int64) {
	s := models.NewFleetStore(db, "r1", nil)
	const lanes = 4
	s.SetWriteLanes(lanes)
	// Four nodes of lane 0 and one of lane 1.
	var mine []string
	other := ""
	for i := 0; len(mine) < 4 || other == ""; i++ {
		id := fmt.Sprintf("st-%d", i)
		switch models.LaneOf(id, lanes) {
		case 0:
			if len(mine) < 4 {
				mine = append(mine, id)
			}
		case 1:
			if other == "" {
				other = id
			}
		}
	}
	var cs []fleet.Command
	for _, id := range append(slices.Clone(mine), other) {
		n := sampleNode(id, "rent-"+id, 1)
		n.State = fleet.StateReady
		insert(t, s, n)
		cs = append(cs, fleet.Command{OperationID: id + "-op", NodeID: id, Kind: "stop_workload", Payload: json.RawMessage(`{}`),
			PayloadDigest: "d", FencingToken: 1, IssuedAt: t0, State: fleet.CommandPending})
	}
	require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error { return tx.InsertCommands(ctx, cs) }))

	// Hold lane 0 with a request of its first node, queue the
	// settlements of the other three behind it, the last also naming
	// the other lane's command.
	held, release := make(chan struct{}), make(chan struct{})
	go func() {
		assert.NoError(t, s.Tx(fleet.OnNode(ctx, mine[0]), func(fleet.Tx) error { close(held); <-release; return nil }))
	}()
	<-held
	before := s.GroupStats()
	found := make([][]fleet.SettleFound, 3)
	var wg sync.WaitGroup
	for i, id := range mine[1:] {
		ss := []fleet.Settlement{{OperationID: id + "-op", State: fleet.CommandApplied}}
		if i == 2 {
			ss = append(ss, fleet.Settlement{OperationID: other + "-op", State: fleet.CommandApplied})
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			found[i], _, err = s.Settle(fleet.OnNode(ctx, id), id, t0.Add(time.Minute), ss)
			assert.NoError(t, err)
			sort.Slice(found[i], func(x, y int) bool { return found[i][x].OperationID < found[i][y].OperationID })
		}()
	}
	queued := int64(3)
	if withOther {
		queued++
		wg.Add(1)
		go func() {
			defer wg.Done()
			assert.NoError(t, s.Tx(fleet.OnNode(ctx, mine[1]), func(tx fleet.Tx) error {
				_, err := tx.Node(ctx, mine[1])
				return err
			}))
		}()
	}
	testwait.For(t, "the requests to queue", testwait.Patience, func() bool { return s.GroupStats().Queued == queued })
	close(release)
	wg.Wait()

	after := s.GroupStats()
	require.Equal(t, before.Strays+strays, after.Strays, "requests that locked another lane's command and ran again alone")
	require.Equal(t, before.Reruns+reruns, after.Reruns, "batches run again with savepoints")
	require.Equal(t, before.SettleStatements+1, after.SettleStatements,
		"a shared statement rolled back counts nothing, the savepoints' run shares none; the straying request's lone run is one")
	for i, id := range mine[1:] {
		want := []fleet.SettleFound{{OperationID: id + "-op", NodeID: id, Kind: "stop_workload", State: fleet.CommandPending, Settled: true}}
		if i == 2 {
			want = append(want, fleet.SettleFound{OperationID: other + "-op", NodeID: other, Kind: "stop_workload", State: fleet.CommandPending})
		}
		require.Equal(t, want, found[i], id)
		c, err := s.Command(ctx, id+"-op")
		require.NoError(t, err)
		require.Equal(t, fleet.CommandApplied, c.State, id)
	}
	c, err := s.Command(ctx, other+"-op")
	require.NoError(t, err)
	require.Equal(t, fleet.CommandPending, c.State, "another node's command: unchanged")
}
