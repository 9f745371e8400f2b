package ledgerplans_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/internal/ledgerplans"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// small is CI's scale (DECISIONS.md §30): `make plans` runs a million.
var small = ledgerplans.Scale{Operations: 20_000, Nodes: 1_000, Open: 400}

// TestSelectivePlansUseIndexes is the small version of `make plans`: at
// 20,000 operations, every selective listing filter and hot statement
// (Query.Selective: package_host_id, the rare family, kind and
// target_kind, the open states, request_id, operation_id, parent,
// target_id, and their combinations; Claim, the quota counts, Orphans,
// Overdue, FanningOut, Prune, OperationByRequest, Events, ChildCounts,
// CountOpen) is planned without a sequential scan of operations or
// operation_events, custom and generic plan alike. The unselective ones
// (a common family, kind, state or target_kind, no filter) are left out:
// at this size reading the table whole is the planner's right answer for
// them.
func TestSelectivePlansUseIndexes(t *testing.T) {
	dbtest.Dialects(t) // under CI=true, no Postgres URL is a failure
	db := dbtest.Open(t, models.Postgres)
	r, err := ledgerplans.Run(context.Background(), db, small)
	require.NoError(t, err)
	require.EqualValues(t, small.Operations, r.Counts.Operations)
	require.EqualValues(t, small.Open, r.Counts.Open)
	selective := 0
	for _, p := range r.Plans {
		if !p.Selective {
			continue
		}
		selective++
		if p.SeqScan {
			t.Errorf("%s: sequential scan\n%s\ncustom:\n%s\ngeneric:\n%s", p.Name, p.SQL, p.Custom.Text, p.Generic.Text)
		}
	}
	require.Greater(t, selective, 30)
}

// TestSeqScanIsCaught checks the detector on a real plan: a filter no
// index serves reads the table whole.
func TestSeqScanIsCaught(t *testing.T) {
	dbtest.Dialects(t)
	db := dbtest.Open(t, models.Postgres)
	p, err := ledgerplans.Explain(context.Background(), db,
		ledgerplans.Query{Name: "unindexed", Statement: models.Statement{SQL: "SELECT * FROM operations WHERE reason = $1", Args: []any{"x"}}})
	require.NoError(t, err)
	require.True(t, p.Custom.SeqScan, p.Custom.Text)
	require.True(t, p.Generic.SeqScan, p.Generic.Text)
	require.Len(t, ledgerplans.Report{Plans: []ledgerplans.Plan{p}}.Failed(), 1)
}

// TestStatementsAreTheStores checks that what the tool explains is what
// the store runs: the listing statement, run as built, answers the rows
// the store's List answers.
func TestStatementsAreTheStores(t *testing.T) {
	dbtest.Dialects(t)
	ctx := context.Background()
	db := dbtest.Open(t, models.Postgres)
	_, err := ledgerplans.Seed(ctx, db, ledgerplans.Scale{Operations: 3_000, Nodes: 50, Open: 100})
	require.NoError(t, err)
	store := models.NewLedgerStore(models.NewFleetStore(db, "test", nil))
	for _, f := range []ledger.Filter{
		{State: ledger.StatePending, Limit: 20},
		{PrincipalKind: ledger.PrincipalPackageHost, PrincipalID: "ph_07", Kind: ledger.KindNodeRetire, Before: 2_000, Limit: 10},
		{TargetID: "nod_000007", Limit: 5},
	} {
		ops, err := store.List(ctx, f)
		require.NoError(t, err)
		require.NotEmpty(t, ops, "filter %+v matches seeded rows", f)
		var want []int64
		for _, o := range ops {
			want = append(want, o.Cursor)
		}
		st := store.Statements().List(f)
		require.True(t, strings.HasPrefix(st.SQL, "SELECT"), st.SQL)
		sqlDB, err := db.DB.DB()
		require.NoError(t, err)
		rows, err := sqlDB.QueryContext(ctx, "SELECT seq FROM ("+st.SQL+") q ORDER BY seq DESC", st.Args...)
		require.NoError(t, err)
		var got []int64
		for rows.Next() {
			var seq int64
			require.NoError(t, rows.Scan(&seq))
			got = append(got, seq)
		}
		require.NoError(t, rows.Err())
		require.NoError(t, rows.Close())
		require.Equal(t, want, got, "filter %+v", f)
	}
}

// TestConfigStatementsAreTheStores: the desired configuration's lagging
// count and page, run as the tool explains them, answer what the fleet
// store answers over the seeded nodes.
func TestConfigStatementsAreTheStores(t *testing.T) {
	dbtest.Dialects(t)
	ctx := context.Background()
	db := dbtest.Open(t, models.Postgres)
	_, err := ledgerplans.Seed(ctx, db, ledgerplans.Scale{Operations: 3_000, Nodes: 400, Open: 100})
	require.NoError(t, err)
	fs := models.NewFleetStore(db, "test", nil)
	st := models.NewLedgerStore(fs).Statements()
	lagging, never, err := fs.CountConfigs(ctx)
	require.NoError(t, err)
	require.Positive(t, lagging)
	require.Positive(t, never)
	c := st.CountConfigs()
	var gotLagging, gotNever int64
	require.NoError(t, db.WithContext(ctx).Raw(c.SQL, c.Args...).Row().Scan(&gotLagging, &gotNever))
	require.Equal(t, []int64{lagging, never}, []int64{gotLagging, gotNever})

	page, err := fs.LaggingConfigs(ctx, "nod_000300", 5)
	require.NoError(t, err)
	require.Len(t, page, 5)
	l := st.LaggingConfigs("nod_000300", 5)
	var ids []string
	require.NoError(t, db.WithContext(ctx).Raw("SELECT node_id FROM ("+l.SQL+") q ORDER BY node_id DESC", l.Args...).Scan(&ids).Error)
	want := make([]string, len(page))
	for i, p := range page {
		want[i] = p.NodeID
	}
	require.Equal(t, want, ids)
}
