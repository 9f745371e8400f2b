package models_test

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// TestHandScannedRowsRoundTrip: the rows the command path scans by hand
// (sqlpath.go) carry every field to its place: the node IssueToNode
// answers and the commands ClaimDue answers equal what GORM reads back,
// field by field, with every field set to a value no other field has, so
// two columns swapped or shifted fail here. Both dialects.
func TestHandScannedRowsRoundTrip(t *testing.T) {
	withStore(t, func(t *testing.T, s *models.FleetStore, rec *recorder) {
		at := func(min int) *time.Time { v := t0.Add(time.Duration(min) * time.Minute); return &v }
		n := fleet.Node{ID: "full", RentalID: "rent-full", Generation: 3, State: fleet.StateReady, FencingToken: 41,
			CreatedAt: *at(1), UpdatedAt: *at(2), EnrolledAt: at(3), LeaseExpiresAt: at(4), LastHeartbeatAt: at(5),
			RetiredAt: at(6), AgentVersion: "9.8.7", Facts: json.RawMessage(`{"cpus":12}`), FactsObservedAt: at(7),
			FactsReceivedAt: at(8), Disk: fleet.Disk{State: "low", FreeBytes: ip(1 << 33), ObservedAt: at(9)},
			PriceMicros: ip(123456), Purchase: fleet.Purchase{BillingIntervalSeconds: ip(3600), EligibleClasses: []string{"gpu", "a"},
				AvailableUntil: at(10)}}
		insert(t, s, n)

		var issued fleet.Node
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
			var err error
			var ok bool
			issued, ok, err = tx.IssueToNode(ctx, fleet.Command{OperationID: "cmd", NodeID: "full", Kind: "prepare_image",
				Payload: json.RawMessage(`{"image":"i"}`), PayloadDigest: "digest", FencingToken: 99, IssuedAt: *at(11),
				State: fleet.CommandPending})
			require.True(t, ok)
			return err
		}))
		stored, err := s.Node(ctx, "full")
		require.NoError(t, err)
		require.Equal(t, stored, issued, "the issue's node is the stored node")
		require.Equal(t, n, issued, "every field as inserted")

		// Two claims: the second a redelivery, so first and last delivery
		// differ, as do the fencing tokens.
		claim := func(fencing int64, now time.Time) []fleet.Command {
			var got []fleet.Command
			require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
				var err error
				_, got, err = tx.ClaimDue(ctx, fleet.Due{NodeID: "full", Fencing: fencing, Now: now,
					RedeliverBefore: now.Add(-time.Minute), Limit: 5})
				return err
			}))
			require.Len(t, got, 1)
			return got
		}
		claim(41, *at(20))
		got := claim(42, *at(30))[0]
		want := fleet.Command{OperationID: "cmd", NodeID: "full", Kind: "prepare_image", Payload: json.RawMessage(`{"image":"i"}`),
			PayloadDigest: "digest", FencingToken: 42, IssuedAt: *at(11), State: fleet.CommandPending, DeliveredFencing: ip(42),
			FirstDeliveredAt: at(20), LastDeliveredAt: at(30), DeliveryCount: 2}
		require.Equal(t, want, got, "every field of the claimed command")
		c, err := s.Command(ctx, "cmd")
		require.NoError(t, err)
		require.Equal(t, c, got, "the claim's command is the stored command")

		// LockCommands reads the settlement columns too.
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
			got, err := tx.LockCommands(ctx, []string{"cmd", "absent"})
			require.Equal(t, map[string]fleet.Command{"cmd": c}, got)
			return err
		}))
	})
}

// TestHandScannedColumnsAreTheTables: the column lists of the statements
// sent around GORM name every column of their table, so a column a
// migration adds is not silently left out of what they read.
func TestHandScannedColumnsAreTheTables(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		// operations.end_state is generated from state and terminal, which
		// are read.
		for table, list := range map[string]string{"commands": models.CommandColumns, "nodes": models.NodeColumns,
			"operations": models.OperationColumns + ", end_state"} {
			var cols []string
			q := `SELECT name FROM pragma_table_xinfo(?)` // generated columns too
			if db.Dialect == models.Postgres {
				q = `SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = ?`
			}
			require.NoError(t, db.Raw(q, table).Scan(&cols).Error)
			var named []string
			for _, c := range strings.Split(list, ",") {
				named = append(named, strings.TrimSpace(c))
			}
			sort.Strings(cols)
			sort.Strings(named)
			require.Equal(t, cols, named, table)
		}
	})
}

// TestHandWrittenOperationRowsRoundTrip: an operation inserted by the
// fan-out's multi-row insert (InsertOperations) reads back field by field
// through the hand-scanned reads (Operation, LockOperation,
// LockOperations; LockParent, every field but the targets), with every field set to a value no other field has and
// a second operation with every optional field empty, so two columns
// swapped or shifted, or a NULL read as a value, fail here. Both dialects.
func TestHandWrittenOperationRowsRoundTrip(t *testing.T) {
	withStore(t, func(t *testing.T, s *models.FleetStore, _ *recorder) {
		ls := models.NewLedgerStore(s)
		at := func(min int) *time.Time { v := t0.Add(time.Duration(min) * time.Minute); return &v }
		full := ledger.Operation{ID: "op-full", RequestID: "req-full", Digest: "digest-full",
			PrincipalKind: ledger.PrincipalPackageHost, PrincipalID: "host-1", PrincipalName: "builder", PackageHostGeneration: 7,
			Family: ledger.FamilyCommands, Kind: ledger.KindNodePrepareImage, State: ledger.StateRunning,
			Channel: ledger.ChannelLongPoll, Attempt: 3, Targets: []ledger.Target{{Kind: ledger.TargetNode, ID: "n-1"}},
			TargetKind: ledger.TargetNode, TargetID: "n-1", ParentID: "op-parent", Held: true,
			Counts: &ledger.Counts{Total: 5, Succeeded: 2}, Reason: "why", Operation: json.RawMessage(`{"image":"img"}`),
			Result: json.RawMessage(`{"r":1}`), Error: &ledger.Error{Code: "code-x", Message: "message-x", Retryable: true},
			Evidence: json.RawMessage(`{"e":2}`), CancelRequestedAt: at(1), CancelReason: "cancel-why", Owner: "replica-9",
			CreatedAt: *at(2), AcceptedAt: at(3), FinishedAt: at(4), Deadline: *at(5), UpdatedAt: *at(6)}
		bare := ledger.Operation{ID: "op-bare", RequestID: "req-bare", Digest: "digest-bare",
			PrincipalKind: ledger.PrincipalAdmin, PrincipalID: "admin-1", Family: ledger.FamilyNodes, Kind: ledger.KindNodeRetire,
			State: ledger.StatePending, Channel: ledger.ChannelLocal, Targets: []ledger.Target{},
			Operation: json.RawMessage(`{}`), CreatedAt: *at(7), Deadline: *at(8), UpdatedAt: *at(9)}
		require.NoError(t, ls.Tx(ctx, func(tx ledger.Tx) error {
			return tx.InsertOperations(ctx, []ledger.Operation{full, bare}, nil)
		}))

		stored := func(op ledger.Operation, got ledger.Operation) {
			t.Helper()
			require.Positive(t, got.Cursor, op.ID)
			op.Cursor = got.Cursor
			require.Equal(t, op, got, "every field of %s as inserted", op.ID)
		}
		for _, op := range []ledger.Operation{full, bare} {
			got, err := ls.Operation(ctx, op.ID)
			require.NoError(t, err)
			stored(op, got)
			require.NoError(t, ls.Tx(ctx, func(tx ledger.Tx) error {
				locked, err := tx.LockOperation(ctx, op.ID)
				require.NoError(t, err)
				stored(op, locked)
				// A fan-out's advance reads every field but the targets.
				parent, err := tx.LockParent(ctx, op.ID)
				require.NoError(t, err)
				require.Empty(t, parent.Targets, "LockParent does not read the targets")
				withoutTargets := op
				withoutTargets.Targets = []ledger.Target{}
				stored(withoutTargets, parent)
				return nil
			}))
		}
		require.NoError(t, ls.Tx(ctx, func(tx ledger.Tx) error {
			locked, err := tx.LockOperations(ctx, []string{"op-full", "absent", "op-bare"})
			require.NoError(t, err)
			require.Len(t, locked, 2, "the two that exist, in id order")
			stored(bare, locked[0])
			stored(full, locked[1])
			return nil
		}))
		_, err := ls.Operation(ctx, "absent")
		require.ErrorIs(t, err, ledger.ErrNoRows)
		require.NoError(t, ls.Tx(ctx, func(tx ledger.Tx) error {
			_, err := tx.LockOperation(ctx, "absent")
			require.ErrorIs(t, err, ledger.ErrNoRows)
			_, err = tx.LockParent(ctx, "absent")
			require.ErrorIs(t, err, ledger.ErrNoRows)
			return nil
		}))
	})
}

func TestNumbered(t *testing.T) {
	require.Equal(t, `SELECT $1, '?' || "a?b", $2 FROM t WHERE x = $3 AND y = 'it''s ?'`,
		models.Numbered(`SELECT ?, '?' || "a?b", ? FROM t WHERE x = ? AND y = 'it''s ?'`))
}

// TestCountOpenForNodeIsTheStatementExplained: the quota count the plan
// tool explains is the one the store runs — on SQLite the store's own
// statement, which answers the store's count, on Postgres the query of the
// function that takes the node's quota lock first (migration 00025) — and
// it counts exempt kinds out.
func TestCountOpenForNodeIsTheStatementExplained(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		fs := models.NewFleetStore(db, "r1", nil)
		ls := models.NewLedgerStore(fs)
		if db.Dialect == models.Postgres {
			for _, except := range [][]string{nil, {ledger.KindNodeRetire}, {ledger.KindNodeRetire, ledger.KindNodeDiagnose}} {
				var body string
				require.NoError(t, db.Raw(`SELECT prosrc FROM pg_proc WHERE proname = 'nodeward_open_for_node'`).Scan(&body).Error)
				got := ls.Statements().CountOpenForNode("n1", except)
				require.Contains(t, strings.Join(strings.Fields(body), " "), strings.Join(strings.Fields(got.SQL), " "))
			}
		}

		insert(t, fs, sampleNode("n1", "rent-count", 1))
		insert(t, fs, sampleNode("n2", "rent-count-2", 1))
		for i, kind := range []string{ledger.KindNodePrepareImage, ledger.KindNodeRetire, ledger.KindNodeDiagnose, ledger.KindNodePrepareImage} {
			node := "n1"
			if i == 3 {
				node = "n2" // another node's operation counts for it alone
			}
			op := &ledger.Operation{ID: fmt.Sprintf("op%d", i), RequestID: fmt.Sprintf("req%d", i), Digest: "d",
				PrincipalKind: ledger.PrincipalAdmin, PrincipalID: "u1", Family: ledger.FamilyCommands, Kind: kind,
				State: ledger.StatePending, Channel: ledger.ChannelLongPoll, Targets: []ledger.Target{{Kind: ledger.TargetNode, ID: node}},
				TargetKind: ledger.TargetNode, TargetID: node, Operation: json.RawMessage(`{}`), CreatedAt: t0,
				Deadline: t0.Add(time.Hour), UpdatedAt: t0}
			require.NoError(t, ls.Insert(ctx, op))
		}
		for except, want := range map[int]int{0: 3, 1: 2, 2: 1} {
			kinds := []string{ledger.KindNodeRetire, ledger.KindNodeDiagnose}[:except]
			require.NoError(t, ls.Tx(ctx, func(tx ledger.Tx) error {
				n, err := tx.CountOpenForNode(ctx, "n1", kinds)
				require.Equal(t, want, n, except)
				return err
			}))
			if db.Dialect != models.Postgres {
				var n int64
				got := ls.Statements().CountOpenForNode("n1", kinds)
				require.NoError(t, db.Raw(got.SQL, got.Args...).Scan(&n).Error)
				require.Equal(t, int64(want), n, "the explained statement counts as the store does")
			}
		}
	})
}

// TestIssueTakesAKeptOperationWithAnyNumberOfEvents: the issue's statement
// inserts the kept-back operation whether it has no event, one or several
// (each count its own statement text), with its cursor; both dialects.
func TestIssueTakesAKeptOperationWithAnyNumberOfEvents(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		fs := models.NewFleetStore(db, "r1", nil)
		ls := models.NewLedgerStore(fs)
		n := sampleNode("n1", "rent-events", 1)
		n.State = fleet.StateReady
		insert(t, fs, n)
		for events := range 3 {
			id := fmt.Sprintf("op%d", events)
			op := &ledger.Operation{ID: id, RequestID: "req-" + id, Digest: "d", PrincipalKind: ledger.PrincipalAdmin,
				PrincipalID: "u1", Family: ledger.FamilyCommands, Kind: ledger.KindNodePrepareImage, State: ledger.StatePending,
				Channel: ledger.ChannelLongPoll, Targets: []ledger.Target{{Kind: ledger.TargetNode, ID: "n1"}},
				TargetKind: ledger.TargetNode, TargetID: "n1", Operation: json.RawMessage(`{"image":"i"}`), CreatedAt: t0,
				Deadline: t0.Add(time.Hour), UpdatedAt: t0}
			var evs []ledger.Event
			for i := range events {
				evs = append(evs, ledger.Event{OperationID: id, Type: fmt.Sprintf("e%d", i), At: t0.Add(time.Duration(i) * time.Second),
					Data: json.RawMessage(`{}`)})
			}
			require.NoError(t, ls.Tx(ctx, func(tx ledger.Tx) error {
				if err := tx.InsertOperation(ctx, op, evs...); err != nil {
					return err
				}
				_, ok, err := tx.Fleet().IssueToNode(ctx, fleet.Command{OperationID: id, NodeID: "n1", Kind: "prepare_image",
					Payload: op.Operation, PayloadDigest: "d", IssuedAt: t0, State: fleet.CommandPending})
				require.True(t, ok)
				return err
			}), events)
			require.NotZero(t, op.Cursor, events)
			got, err := ls.Operation(ctx, id)
			require.NoError(t, err)
			require.Equal(t, op.Cursor, got.Cursor)
			stored, err := ls.Events(ctx, id, 0, 10)
			require.NoError(t, err)
			require.Len(t, stored, events)
		}
	})
}

// TestLargeRowsSplitAcrossStatements: multi-row statements are cut by
// their parameters' bytes as well as by rows, at least one row each, and
// rows whose documents span several statements all arrive whole: a
// fan-out's children carrying a large operation (InsertOperations) and
// the configurations of its release (SaveNodeConfigs). Both dialects.
func TestLargeRowsSplitAcrossStatements(t *testing.T) {
	sized := func(sizes ...int) func(int) int { return func(i int) int { return sizes[i] } }
	third := models.StatementBytes / 3
	require.Equal(t, 3, models.RowsThatFit(5, 500, sized(third, third, third, third, third)), "three thirds fit, a fourth does not")
	require.Equal(t, 1, models.RowsThatFit(2, 500, sized(2*models.StatementBytes, 1)), "a row larger than the bound goes alone")
	require.Equal(t, 500, models.RowsThatFit(10000, 500, sized(make([]int, 10000)...)), "small rows: the row bound")

	withStore(t, func(t *testing.T, s *models.FleetStore, _ *recorder) {
		ls := models.NewLedgerStore(s)
		big := json.RawMessage(`{"document":"` + strings.Repeat("x", models.StatementBytes/2) + `"}`)
		// Rows sharing an operation share its text; each keeps its own.
		other := json.RawMessage(`{"document":"` + strings.Repeat("y", models.StatementBytes/2) + `"}`)
		operations := []json.RawMessage{big, big, other, append(json.RawMessage(nil), big...), other}
		var ops []ledger.Operation
		var nodes []fleet.Node
		var cfgs []fleet.NodeConfig
		for i := range 5 {
			id := fmt.Sprintf("big-%d", i)
			ops = append(ops, ledger.Operation{ID: id, RequestID: "req-" + id, Digest: "d", PrincipalKind: ledger.PrincipalAdmin,
				PrincipalID: "u1", Family: ledger.FamilyNodeConfig, Kind: ledger.KindNodeConfigure, State: ledger.StatePending,
				Channel: ledger.ChannelLongPoll, Targets: []ledger.Target{{Kind: ledger.TargetNode, ID: id}},
				TargetKind: ledger.TargetNode, TargetID: id, Operation: operations[i], CreatedAt: t0, Deadline: t0.Add(time.Hour), UpdatedAt: t0})
			nodes = append(nodes, sampleNode(id, "rent-"+id, 1))
			cfgs = append(cfgs, fleet.NodeConfig{NodeID: id, Revision: 1, Hash: "h", Format: "f/v1", Box: []byte(big),
				SizeBytes: int64(len(big)), UpdatedAt: t0, OperationID: id})
		}
		insert(t, s, nodes...)
		require.NoError(t, ls.Tx(ctx, func(tx ledger.Tx) error {
			if err := tx.InsertOperations(ctx, ops, nil); err != nil {
				return err
			}
			return tx.Fleet().SaveNodeConfigs(ctx, cfgs)
		}))
		for i, op := range ops {
			got, err := ls.Operation(ctx, op.ID)
			require.NoError(t, err)
			require.JSONEq(t, string(operations[i]), string(got.Operation), "operation %d", i)
			c, err := s.NodeConfig(ctx, op.ID)
			require.NoError(t, err)
			require.Equal(t, []byte(big), c.Box)
		}
	})
}
