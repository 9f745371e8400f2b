package ledgerplans

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/nodeward/nodeward/models"
)

// Plan is a query's EXPLAIN (ANALYZE, BUFFERS).
type Plan struct {
	Query
	// Text is the plan as Postgres printed it.
	Text string
	// SeqScan reports a sequential scan of operations or operation_events.
	SeqScan bool
	// Execution is the execution time Postgres measured.
	Execution time.Duration
}

var (
	seqScan   = regexp.MustCompile(`Seq Scan on (operations|operation_events)\b`)
	execution = regexp.MustCompile(`Execution Time: ([0-9.]+) ms`)
)

// Explain runs EXPLAIN (ANALYZE, BUFFERS) of q's SQL with q's arguments
// bound as the store binds them, so the plan is the one the store gets.
// Statements that lock (Claim's FOR UPDATE) hold their locks only for the
// EXPLAIN's own transaction.
func Explain(ctx context.Context, db *models.DB, q Query) (Plan, error) {
	sqlDB, err := db.DB.DB()
	if err != nil {
		return Plan{}, err
	}
	rows, err := sqlDB.QueryContext(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+q.SQL, q.Args...)
	if err != nil {
		return Plan{}, fmt.Errorf("explain %s: %w", q.Name, err)
	}
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			return Plan{}, err
		}
		lines = append(lines, line)
	}
	if err := rows.Err(); err != nil {
		return Plan{}, fmt.Errorf("explain %s: %w", q.Name, err)
	}
	p := Plan{Query: q, Text: strings.Join(lines, "\n")}
	p.SeqScan = seqScan.MatchString(p.Text)
	if m := execution.FindStringSubmatch(p.Text); m != nil {
		ms, _ := strconv.ParseFloat(m[1], 64)
		p.Execution = time.Duration(ms * float64(time.Millisecond))
	}
	return p, nil
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
