package ledgerplans

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/nodeward/nodeward/models"
)

// Plan is a query's EXPLAIN (ANALYZE, BUFFERS): the custom plan Postgres
// makes for the arguments, and the generic plan it may switch to for a
// statement prepared and run many times (the driver caches prepared
// statements per connection; plan_cache_mode = auto weighs the generic
// plan from the sixth run on).
type Plan struct {
	Query
	Custom, Generic Explained
	// SeqScan reports a sequential scan of operations, operation_events
	// or node_configs in either plan.
	SeqScan bool
}

// Explained is one plan as Postgres printed it.
type Explained struct {
	Text string
	// SeqScan reports a sequential scan of operations, operation_events
	// or node_configs.
	SeqScan bool
	// Execution is the execution time Postgres measured.
	Execution time.Duration
}

var (
	seqScan   = regexp.MustCompile(`Seq Scan on (operations|operation_events|node_configs)\b`)
	execution = regexp.MustCompile(`Execution Time: ([0-9.]+) ms`)
)

// Explain explains q twice: with its arguments bound as the store binds
// them (the custom plan), and as a prepared statement under
// plan_cache_mode = force_generic_plan (the generic plan). Statements that
// lock (Claim's FOR UPDATE) hold their locks only for the EXPLAIN's own
// transaction.
func Explain(ctx context.Context, db *models.DB, q Query) (Plan, error) {
	sqlDB, err := db.DB.DB()
	if err != nil {
		return Plan{}, err
	}
	conn, err := sqlDB.Conn(ctx)
	if err != nil {
		return Plan{}, err
	}
	defer func() { _ = conn.Close() }()
	if isWrite(q.SQL) {
		// EXPLAIN ANALYZE runs the statement: a write is explained in a
		// transaction rolled back, so the seeded data stays as seeded.
		if _, err := conn.ExecContext(ctx, "BEGIN"); err != nil {
			return Plan{}, err
		}
		defer func() { _, _ = conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK") }()
	}
	p := Plan{Query: q}
	if p.Custom, err = explain(ctx, conn, "EXPLAIN (ANALYZE, BUFFERS) "+q.SQL, q.Args...); err != nil {
		return Plan{}, fmt.Errorf("explain %s: %w", q.Name, err)
	}
	args := make([]string, len(q.Args))
	for i, a := range q.Args {
		if args[i], err = literal(a); err != nil {
			return Plan{}, fmt.Errorf("explain %s: %w", q.Name, err)
		}
	}
	execute := "EXPLAIN (ANALYZE, BUFFERS) EXECUTE ledgerplans_q"
	if len(args) > 0 {
		execute += "(" + strings.Join(args, ", ") + ")"
	}
	for _, s := range []string{"PREPARE ledgerplans_q AS " + q.SQL, "SET plan_cache_mode = force_generic_plan"} {
		if _, err := conn.ExecContext(ctx, s); err != nil {
			return Plan{}, fmt.Errorf("explain %s: %w", q.Name, err)
		}
	}
	p.Generic, err = explain(ctx, conn, execute)
	for _, s := range []string{"DEALLOCATE ledgerplans_q", "RESET plan_cache_mode"} {
		if _, derr := conn.ExecContext(ctx, s); err == nil {
			err = derr
		}
	}
	if err != nil {
		return Plan{}, fmt.Errorf("explain %s (generic): %w", q.Name, err)
	}
	p.SeqScan = p.Custom.SeqScan || p.Generic.SeqScan
	return p, nil
}

// isWrite reports whether a statement changes rows (a CTE's writes count).
func isWrite(sql string) bool {
	u := strings.ToUpper(sql)
	for _, w := range []string{"UPDATE ", "INSERT ", "DELETE "} {
		if strings.Contains(u, w) {
			return true
		}
	}
	return false
}

func explain(ctx context.Context, conn *sql.Conn, query string, args ...any) (Explained, error) {
	rows, err := conn.QueryContext(ctx, query, args...)
	if err != nil {
		return Explained{}, err
	}
	defer func() { _ = rows.Close() }()
	var lines []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			return Explained{}, err
		}
		lines = append(lines, line)
	}
	if err := rows.Err(); err != nil {
		return Explained{}, err
	}
	e := Explained{Text: strings.Join(lines, "\n")}
	e.SeqScan = seqScan.MatchString(e.Text)
	if m := execution.FindStringSubmatch(e.Text); m != nil {
		ms, _ := strconv.ParseFloat(m[1], 64)
		e.Execution = time.Duration(ms * float64(time.Millisecond))
	}
	return e, nil
}

// literal writes a statement argument as an SQL literal for EXECUTE.
func literal(a any) (string, error) {
	switch v := a.(type) {
	case string:
		return "'" + strings.ReplaceAll(v, "'", "''") + "'", nil
	case int:
		return strconv.Itoa(v), nil
	case int64:
		return strconv.FormatInt(v, 10), nil
	case bool:
		return strconv.FormatBool(v), nil
	case time.Time:
		return "'" + v.UTC().Format(time.RFC3339Nano) + "'", nil
	}
	return "", fmt.Errorf("no literal for an argument of type %T", a)
}

// ExplainAll explains every query in turn.
func ExplainAll(ctx context.Context, db *models.DB, qs []Query) ([]Plan, error) {
	out := make([]Plan, 0, len(qs))
	for _, q := range qs {
		p, err := Explain(ctx, db, q)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// Run seeds db (an empty, migrated Postgres schema) at sc and explains
// every query of Queries.
func Run(ctx context.Context, db *models.DB, sc Scale) (Report, error) {
	start := time.Now()
	counts, err := Seed(ctx, db, sc)
	if err != nil {
		return Report{}, err
	}
	r := Report{Scale: sc, Counts: counts, Seeding: time.Since(start)}
	st := models.NewLedgerStore(models.NewFleetStore(db, "ledgerplans", nil)).Statements()
	qs, err := Queries(ctx, db, st, sc)
	if err != nil {
		return Report{}, err
	}
	if r.Plans, err = ExplainAll(ctx, db, qs); err != nil {
		return Report{}, err
	}
	return r, nil
}
