package models_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/models"
)

// TestPostgresOpenOperationsGenericPlans: the statements over open
// operations keep their indexes in the generic plan a pooled connection
// switches to, on a table analyzed while no operation was open and whose
// open set grew since. The per-node quota count (run for every
// command submitted) must not take operations_open — it did, walking every
// open operation instead of the node's few (migration 00020) — and the
// listing's open-state filter still reads an index, not the table.
func TestPostgresOpenOperationsGenericPlans(t *testing.T) {
	ctx := context.Background()
	db := openOneConnection(t)
	seed := func(from, to int, state string, terminal bool) {
		t.Helper()
		require.NoError(t, db.Exec(`INSERT INTO operations (id, request_id, digest, principal_kind, principal_id, family, kind,
				state, terminal, channel, target_kind, target_id, operation, created_at, deadline, updated_at)
			SELECT 'op-' || i, 'req-' || i, 'd', 'admin', 'u1', 'commands', 'node.prepare_image',
				?, ?, 'long_poll', 'node', 'node-' || (i % 100), '{}', now(), now() + interval '1 hour', now()
			FROM generate_series(?::int, ?::int) AS i`, state, terminal, from, to).Error)
	}
	seed(1, 5000, "succeeded", true)
	require.NoError(t, db.Exec("ANALYZE operations").Error) // none open
	seed(5001, 8000, "pending", false)

	st := models.NewLedgerStore(models.NewFleetStore(db, "r1", nil)).Statements()
	count := genericPlan(ctx, t, db, st.CountOpenForNode("node-7", []string{ledger.KindNodeRetire}))
	require.NotContains(t, count.indexes, "operations_open", "the quota count walked every open operation:\n%s", count.text)
	require.Empty(t, count.seqScans, "the quota count read the table:\n%s", count.text)
	for _, state := range []ledger.State{ledger.StatePending, ledger.StateRunning} {
		list := genericPlan(ctx, t, db, st.List(ledger.Filter{State: state}))
		require.Empty(t, list.seqScans, "the %s listing read the table:\n%s", state, list.text)
		require.Contains(t, list.indexes, "operations_open", "the %s listing:\n%s", state, list.text)
	}
}

// plan is what a generic plan reads.
type plan struct {
	indexes, seqScans []string
	text              string
}

// genericPlan explains s as a prepared statement under plan_cache_mode =
// force_generic_plan, on the one connection of db.
func genericPlan(ctx context.Context, t *testing.T, db *models.DB, s models.Statement) plan {
	t.Helper()
	args := make([]string, len(s.Args))
	for i, a := range s.Args {
		switch v := a.(type) {
		case string:
			args[i] = "'" + strings.ReplaceAll(v, "'", "''") + "'"
		case int, int64:
			args[i] = fmt.Sprint(v)
		default:
			t.Fatalf("argument %d of %s: %T", i, s.SQL, a)
		}
	}
	for _, q := range []string{"SET plan_cache_mode = force_generic_plan", "PREPARE generic_q AS " + s.SQL} {
		require.NoError(t, db.WithContext(ctx).Exec(q).Error, q)
	}
	defer func() {
		require.NoError(t, db.WithContext(ctx).Exec("DEALLOCATE generic_q").Error)
		require.NoError(t, db.WithContext(ctx).Exec("RESET plan_cache_mode").Error)
	}()
	var out string
	require.NoError(t, db.WithContext(ctx).Raw("EXPLAIN (FORMAT JSON) EXECUTE generic_q("+strings.Join(args, ", ")+")").Row().Scan(&out))
	var root []struct{ Plan planNode }
	require.NoError(t, json.Unmarshal([]byte(out), &root))
	p := plan{text: out}
	var walk func(n planNode)
	walk = func(n planNode) {
		if n.IndexName != "" {
			p.indexes = append(p.indexes, n.IndexName)
		}
		if n.NodeType == "Seq Scan" {
			p.seqScans = append(p.seqScans, n.RelationName)
		}
		for _, c := range n.Plans {
			walk(c)
		}
	}
	walk(root[0].Plan)
	return p
}

type planNode struct {
	NodeType     string     `json:"Node Type"`
	RelationName string     `json:"Relation Name"`
	IndexName    string     `json:"Index Name"`
	Plans        []planNode `json:"Plans"`
}
