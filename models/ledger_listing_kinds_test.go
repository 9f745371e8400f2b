package models_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// TestLedgerListingByFamilyAndTargetKind: the family and target_kind
// filters have no index of their own (migration 00021); the service
// narrows family, kind and target_kind to (kind, target kind) pairs
// (ledger.Registry.Narrow) and the store reads those through
// operations_kind_target. Every filter answers exactly the
// operations it names, newest first, page by page through `before`, on
// both dialects: a common family and a rare one, every target kind
// (a fan-out over one node is indexed as that node), unknown values
// (nothing), and the filters combined with the others.
func TestLedgerListingByFamilyAndTargetKind(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := models.NewLedgerStore(models.NewFleetStore(db, "r1", nil))
		reg := servedRegistry()
		type spec struct {
			kind   string
			target ledger.Target
			n      int
		}
		node := func(i int) ledger.Target {
			return ledger.Target{Kind: ledger.TargetNode, ID: fmt.Sprintf("node-%d", i%5)}
		}
		specs := []spec{
			{ledger.KindNodeLaunchWorkload, ledger.Target{}, 60},
			{ledger.KindNodePrepareImage, ledger.Target{}, 40},
			{ledger.KindNodeInvite, ledger.Target{}, 12},
			{ledger.KindNodeConfigure, ledger.Target{}, 6},
			{ledger.KindFleetCommand, ledger.Target{Kind: ledger.TargetFleet}, 4},
			{ledger.KindFleetCommand, ledger.Target{Kind: ledger.TargetNode, ID: "node-1"}, 2},
			{ledger.KindFleetDiagnose, ledger.Target{Kind: ledger.TargetFleet}, 2},
			{ledger.KindCredentialIssue, ledger.Target{Kind: ledger.TargetPackageHost, ID: "ph-1"}, 3},
			{ledger.KindDiagnoseEndpoint, ledger.Target{Kind: ledger.TargetEndpoint, ID: "https://example.test"}, 2},
		}
		// Interleave the kinds so each page mixes them.
		var order []spec
		for left := true; left; {
			left = false
			for i := range specs {
				if specs[i].n > 0 {
					order, left = append(order, specs[i]), true
					specs[i].n--
				}
			}
		}
		now := t0
		for i, sp := range order {
			k, ok := reg.Kind(sp.kind)
			require.True(t, ok, sp.kind)
			target := sp.target
			if target.Kind == "" {
				target = node(i)
			}
			p := "u1"
			if i%3 == 0 {
				p = "u2"
			}
			op := ledger.Operation{
				ID: fmt.Sprintf("op-%03d", i), RequestID: fmt.Sprintf("req-%03d", i), Digest: "d",
				PrincipalKind: ledger.PrincipalAdmin, PrincipalID: p, Family: k.Family, Kind: k.Name,
				State: ledger.StatePending, Channel: ledger.ChannelLocal, Targets: []ledger.Target{target},
				TargetKind: target.Kind, TargetID: target.ID,
				Operation: json.RawMessage(`{}`), CreatedAt: now, Deadline: now.Add(time.Hour), UpdatedAt: now,
			}
			require.NoError(t, s.Insert(ctx, &op))
			if i%4 != 0 { // most end, every seventh failed
				op.State, op.FinishedAt, op.AcceptedAt = ledger.StateSucceeded, &now, &now
				if i%7 == 0 {
					op.State, op.Error = ledger.StateFailed, &ledger.Error{Code: "boom", Message: "boom"}
				}
				require.NoError(t, s.Tx(ctx, func(tx ledger.Tx) error { return tx.UpdateOperation(ctx, op) }))
			}
		}
		all, err := s.List(ctx, ledger.Filter{Limit: 500})
		require.NoError(t, err)
		require.Len(t, all, len(order))

		matches := func(f ledger.Filter, o ledger.Operation) bool {
			return (f.Family == "" || o.Family == f.Family) && (f.Kind == "" || o.Kind == f.Kind) &&
				(f.TargetKind == "" || o.TargetKind == f.TargetKind) && (f.TargetID == "" || o.TargetID == f.TargetID) &&
				(f.PrincipalID == "" || o.PrincipalID == f.PrincipalID) && (f.State == "" || o.State == f.State)
		}
		ids := func(ops []ledger.Operation) []string {
			out := []string{}
			for _, o := range ops {
				out = append(out, o.ID)
			}
			return out
		}
		for _, f := range []ledger.Filter{
			{Family: ledger.FamilyCommands}, // common
			{Family: ledger.FamilyFleet},    // rare
			{Family: ledger.FamilyNodes},
			{Family: ledger.FamilyNodeConfig},
			{Family: ledger.FamilyDiagnose},
			{Family: ledger.FamilyCredentials},
			{Family: "bogus"},
			{TargetKind: ledger.TargetNode},
			{TargetKind: ledger.TargetFleet},
			{TargetKind: ledger.TargetPackageHost},
			{TargetKind: ledger.TargetEndpoint},
			{TargetKind: "bogus"},
			{Family: ledger.FamilyFleet, TargetKind: ledger.TargetNode},
			{Family: ledger.FamilyCommands, TargetKind: ledger.TargetFleet},
			{Family: ledger.FamilyCommands, Kind: ledger.KindNodePrepareImage},
			{Family: ledger.FamilyNodes, Kind: ledger.KindNodePrepareImage},
			{Kind: ledger.KindFleetCommand},
			{Kind: ledger.KindNodeLaunchWorkload},
			{Kind: ledger.KindFleetCommand, TargetKind: ledger.TargetFleet},
			{Kind: "bogus"},
			{Family: ledger.FamilyCommands, State: ledger.StateFailed},
			{Family: ledger.FamilyCommands, State: ledger.StatePending},
			{TargetKind: ledger.TargetNode, State: ledger.StateSucceeded},
			{Family: ledger.FamilyCommands, TargetID: "node-3"},
			{TargetKind: ledger.TargetNode, TargetID: "node-1"},
			{Family: ledger.FamilyCommands, PrincipalID: "u2"},
			{TargetKind: ledger.TargetFleet, PrincipalID: "u1"},
		} {
			t.Run(fmt.Sprintf("%+v", f), func(t *testing.T) {
				var want []string
				for _, o := range all {
					if matches(f, o) {
						want = append(want, o.ID)
					}
				}
				if f.PrincipalID != "" {
					f.PrincipalKind = ledger.PrincipalAdmin
				}
				narrowed := reg.Narrow(f)
				require.NotNil(t, narrowed.Kinds, "the filter reads the kind index")
				var got []string
				for page := 0; ; page++ {
					narrowed.Limit = 7
					ops, err := s.List(ctx, narrowed)
					require.NoError(t, err)
					require.LessOrEqual(t, len(ops), 7)
					got = append(got, ids(ops)...)
					if len(ops) < 7 {
						break
					}
					narrowed.Before = ops[len(ops)-1].Cursor
					require.Less(t, page, 100)
				}
				require.Equal(t, want, nilIfEmpty(got), "newest first, every page")
				if db.Dialect == models.SQLite && len(narrowed.Kinds) > 0 {
					requireNoTableScan(t, db, s.Statements().List(narrowed))
				}
			})
		}
	})
}

// TestSQLiteEndedStatementsReadTheIndex: the overview's counts and
// retention's select read operations_ended_finished (migration 00021) on
// SQLite too, never the whole table.
func TestSQLiteEndedStatementsReadTheIndex(t *testing.T) {
	db := dbtest.Open(t, models.SQLite)
	st := models.NewLedgerStore(models.NewFleetStore(db, "r1", nil)).Statements()
	for _, s := range []models.Statement{st.Summarize(t0.Add(-time.Hour), t0.Add(-24*time.Hour)), st.PruneOperations(t0, 500)} {
		plan := requireNoTableScan(t, db, s)
		require.Contains(t, plan, "operations_ended_finished", "%s", s.SQL)
	}
}

// TestSQLiteRecoveryScanReadsTheIndex: the owner loop's scan for what
// dead replicas left running (every 5 s) reads operations_owned on a
// database SQLite has no statistics for — the server never gathers any —
// not every operation kept for 90 days in seq order. It did until the scan
// named the owner as a range.
func TestSQLiteRecoveryScanReadsTheIndex(t *testing.T) {
	db := dbtest.Open(t, models.SQLite)
	st := models.NewLedgerStore(models.NewFleetStore(db, "r1", nil)).Statements()
	plan := requireNoTableScan(t, db, st.Orphans("r1", t0, 100))
	require.Contains(t, plan, "operations_owned")
}

// TestSQLiteNodeConfiguresReadTheOpenTargetIndex: a configuration's
// delivery and report, and a new revision's supersession, find the node's
// open configure operations through operations_open_target on SQLite,
// which has no statistics (the server never gathers any). Left to its
// heuristics SQLite took operations_kind_target, two equal columns against
// one, and read every configure operation of the ledger's history for each
// node's delivery and report.
func TestSQLiteNodeConfiguresReadTheOpenTargetIndex(t *testing.T) {
	db := dbtest.Open(t, models.SQLite)
	st := models.NewLedgerStore(models.NewFleetStore(db, "r1", nil)).Statements()
	for _, s := range []models.Statement{
		st.OpenConfigures("node-7"),
		st.OpenConfiguresOf([]string{"node-7", "node-8"}),
		st.ConfiguresRunning("node-7", t0),
	} {
		plan := requireNoTableScan(t, db, s)
		require.Contains(t, plan, "operations_open_target", "%s", s.SQL)
		require.NotContains(t, plan, "operations_kind_target", "%s", s.SQL)
	}
}

// TestSQLiteLedgerStatementsReadTheirIndexes: every hot statement of the
// ledger and the desired configuration that the plan tool explains on
// Postgres (docs/ledger-plans.md) reads, on SQLite, the index it was
// written for. SQLite plans without statistics — the server gathers none
// — so a plan is fixed by the schema and the statement alone, and a new
// index or a reworded filter can change it (operations_kind_target took
// over a node's open configures that way).
func TestSQLiteLedgerStatementsReadTheirIndexes(t *testing.T) {
	db := dbtest.Open(t, models.SQLite)
	st := models.NewLedgerStore(models.NewFleetStore(db, "r1", nil)).Statements()
	admin := ledger.Principal{Kind: ledger.PrincipalAdmin, ID: "usr_01"}
	host := ledger.Principal{Kind: ledger.PrincipalPackageHost, ID: "ph_01"}
	for _, c := range []struct {
		name    string
		st      models.Statement
		indexes []string
	}{
		{"ClaimQueue", st.ClaimQueue(100), []string{"operations_claimable"}},
		{"CountOpenForNode", st.CountOpenForNode("node-7", nil), []string{"operations_open_target"}},
		{"CountOpenForNode, except node.retire", st.CountOpenForNode("node-7", []string{ledger.KindNodeRetire}), []string{"operations_open_target"}},
		{"CountOpenForPrincipal, administrator", st.CountOpenForPrincipal(admin), []string{"operations_open_principal"}},
		{"CountOpenForPrincipal, package host", st.CountOpenForPrincipal(host), []string{"operations_open_principal"}},
		{"Overdue", st.Overdue(t0, 100), []string{"operations_waiting"}},
		{"FanningOut", st.FanningOut(100), []string{"operations_fanning_out"}},
		{"OperationByRequest", st.OperationByRequest(admin, "r-1"), []string{"operations_request"}},
		{"Events", st.Events("op-1", 0, 500), []string{"operation_events_operation"}},
		{"ChildCounts", st.ChildCounts("op-1"), []string{"operations_parent"}},
		{"CountOpen", st.CountOpen(), []string{"operations_open"}},
		{"DueWork", st.DueWork(fleet.Due{NodeID: "node-7", Fencing: 1, RedeliverBefore: t0}), []string{"commands_pending"}},
		{"LaggingConfigs", st.LaggingConfigs("", 101), []string{"node_configs_lagging"}},
		{"LaggingConfigs, before", st.LaggingConfigs("node-5", 101), []string{"node_configs_lagging"}},
		{"CountConfigs", st.CountConfigs(), []string{"node_configs_lagging", "node_configs_never_reported"}},
	} {
		plan := requireNoTableScan(t, db, c.st)
		for _, idx := range c.indexes {
			require.Regexp(t, `(?m)USING (COVERING )?INDEX `+idx+`( |$)`, plan, "%s:\n%s", c.name, c.st.SQL)
		}
	}
}

// TestSQLiteNarrowedListingLeadsWithItsIndex: a listing narrowed by a
// request id, a parent, a target or an open state reads that filter's
// index on SQLite, with or without a cursor, whatever other filters it
// carries. Left to its heuristics (no statistics) SQLite read a kind's
// whole history for a node's operations of that kind, and every succeeded
// operation for a fan-out's succeeded children.
func TestSQLiteNarrowedListingLeadsWithItsIndex(t *testing.T) {
	db := dbtest.Open(t, models.SQLite)
	st := models.NewLedgerStore(models.NewFleetStore(db, "r1", nil)).Statements()
	reg := servedRegistry()
	host := ledger.PrincipalPackageHost
	for _, c := range []struct {
		name  string
		f     ledger.Filter
		index string
	}{
		{"request id and host", ledger.Filter{RequestID: "r-1", PrincipalKind: host, PrincipalID: "ph_1"}, "operations_request"},
		{"parent", ledger.Filter{ParentID: "op-1"}, "operations_parent"},
		{"parent and an ended state", ledger.Filter{ParentID: "op-1", State: ledger.StateSucceeded}, "operations_parent"},
		{"parent and a kind", ledger.Filter{ParentID: "op-1", Kind: ledger.KindNodeConfigure}, "operations_parent"},
		{"target", ledger.Filter{TargetID: "node-7"}, "operations_target_id"},
		{"target and a kind", ledger.Filter{TargetID: "node-7", Kind: ledger.KindNodeStopWorkload, TargetKind: ledger.TargetNode}, "operations_target_id"},
		{"target and an ended state", ledger.Filter{TargetID: "node-7", State: ledger.StateFailed}, "operations_target_id"},
		{"an open state and a family", ledger.Filter{State: ledger.StatePending, Family: ledger.FamilyCommands}, "operations_open"},
	} {
		for _, before := range []int64{0, 50} {
			f := reg.Narrow(c.f)
			f.Limit, f.Before = 100, before
			s := st.List(f)
			plan := requireNoTableScan(t, db, s)
			require.Regexp(t, `USING INDEX `+c.index+`( |$)`, plan, "%s, before %d:\n%s", c.name, before, s.SQL)
		}
	}
}

// TestSQLiteNodeCommandsReadTheIndexes: a node's commands of a state, or
// of any (both partial indexes merged), are read through
// commands_pending and commands_settled (migration 00021) on SQLite too.
func TestSQLiteNodeCommandsReadTheIndexes(t *testing.T) {
	db := dbtest.Open(t, models.SQLite)
	for _, c := range []struct {
		state    string
		launches bool
		want     []string
	}{
		{"pending", false, []string{"commands_pending"}},
		{"applied", false, []string{"commands_settled"}},
		{"", false, []string{"commands_pending", "commands_settled"}},
		{"", true, []string{"commands_pending", "commands_settled"}},
	} {
		plan := requireNoTableScan(t, db, models.NodeCommandsStatement(db, "node-7", c.state, 100, c.launches))
		for _, idx := range c.want {
			require.Contains(t, plan, idx, "state %q", c.state)
		}
	}
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

// servedRegistry holds the product's kinds, as the server's does.
func servedRegistry() *ledger.Registry {
	ks := append(ledger.ServedKinds(nil), ledger.CredentialKinds(nil)...)
	ks = append(ks, ledger.ConfigKinds(nil, nil)...)
	return ledger.NewRegistry(append(ks, ledger.EndpointKind(nil, nil))...)
}

// requireNoTableScan: SQLite's plan of st reads operations and commands
// through indexes, never a whole table. It answers the plan.
func requireNoTableScan(t *testing.T, db *models.DB, st models.Statement) string {
	t.Helper()
	plan := sqlitePlan(t, db, st)
	for _, table := range []string{"operations", "commands"} {
		require.False(t, slices.Contains(plan, "SCAN "+table), "a scan of %s:\n%s\n%s", table, st.SQL, strings.Join(plan, "\n"))
	}
	return strings.Join(plan, "\n")
}

// sqlitePlan answers the lines of SQLite's query plan of st.
func sqlitePlan(t *testing.T, db *models.DB, st models.Statement) []string {
	t.Helper()
	rows, err := db.Raw("EXPLAIN QUERY PLAN "+st.SQL, st.Args...).Rows()
	require.NoError(t, err)
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		require.NoError(t, rows.Scan(&id, &parent, &unused, &detail))
		plan = append(plan, detail)
	}
	require.NoError(t, rows.Err())
	return plan
}
