package models

import (
	"context"
	"database/sql/driver"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// Table maintenance on Postgres.
//
// The pool's connections prepare each statement once and, after five runs,
// Postgres may keep a generic plan for it until the table's statistics
// change. A table that was never analyzed has no statistics, so while it is
// small every index that matches a lookup costs the same and the generic
// plan may keep the wrong one: measured, the submit's idempotency lookup
// (principal, request id) kept operations_principal on some connections and
// read every operation of the administrator — up to 15,000 buffers a call,
// growing with the table — where operations_request reads 2. autovacuum's
// ANALYZE fixes that within a minute, the minute a table filling from
// empty is planned as nearly empty; with autovacuum off (as on some
// servers, and this project's benchmark machine) nothing ever does, and no
// dead row is ever removed either. So when autovacuum is off, the server
// vacuums and analyzes its own tables the way autovacuum would have, and
// whether it is off or on, it analyzes a table that outgrew its statistics
// without waiting for the minute; each ANALYZE makes the connections plan
// again with real figures.
//
// The way autovacuum would have includes how often: its launcher visits a
// database once per autovacuum_naptime (a minute by default), so a table
// that changes fast is still maintained at most about once a minute. A
// keeper on every replica checking every 15 s, with nothing else bounding
// it, vacuumed and analyzed operations every 6 s through a 50,000-node
// invitation run (83 times in 8 minutes), each ANALYZE sampling the whole
// table, and took about half of Postgres's CPU from the requests.

// Thresholds of autovacuum's defaults (autovacuum_vacuum_threshold and
// _scale_factor, autovacuum_analyze_threshold and _scale_factor): a table is
// vacuumed once this many of its rows are dead, analyzed once this many
// changed since its last ANALYZE.
const (
	vacuumBaseRows      = 50
	vacuumScaleFactor   = 0.2
	analyzeBaseRows     = 50
	analyzeScaleFactor  = 0.1
	maintenanceCostWait = "2ms" // autovacuum_vacuum_cost_delay's default
)

// MaintenanceNaptime is autovacuum_naptime's default: MaintainTables
// leaves alone a table vacuumed or analyzed (by anyone) more recently —
// unless the table outgrew what the planner believes of it
// (pg_class.reltuples, set by the last VACUUM or ANALYZE) outgrownFactor
// times over: a table filling from empty would otherwise be planned for a
// minute as the few hundred rows it held (10,000 invitations into an
// empty schema ran at 125–140/s with the naptime alone, 167–176/s with
// this, 166–190/s before the naptime). Growth by a factor is geometric,
// so that costs a few extra ANALYZEs over a table's whole life.
const (
	MaintenanceNaptime = time.Minute
	outgrownFactor     = 4
	outgrownBaseRows   = 250
)

// maintainLock is the session advisory lock, per schema, that lets one
// replica at a time maintain the schema's tables (VACUUM cannot run in a
// transaction, so the lock cannot be a transaction's).
const maintainLock = `hashtextextended('nodeward.maintain.' || current_schema(), 0)`

// AutovacuumOff reports whether Postgres's autovacuum is off for this
// server (then nothing vacuums or analyzes our tables unless we do). It is
// false on SQLite.
func (db *DB) AutovacuumOff(ctx context.Context) (bool, error) {
	if db.Dialect != Postgres {
		return false, nil
	}
	var off bool
	err := db.sqlDB.QueryRowContext(ctx,
		`SELECT current_setting('autovacuum') = 'off' OR current_setting('track_counts') = 'off'`).Scan(&off)
	return off, err
}

// TableMaintenance is what MaintainTables did to one table.
type TableMaintenance struct {
	Table  string
	Vacuum bool // VACUUM (ANALYZE); otherwise ANALYZE alone
}

// MaintenanceScope says what MaintainTables may do.
type MaintenanceScope int

const (
	// MaintainAll vacuums and analyzes as autovacuum would: for a server
	// whose autovacuum is off.
	MaintainAll MaintenanceScope = iota
	// AnalyzeOutgrown only analyzes a table that outgrew what the planner
	// believes of it, whatever its naptime: for a server whose autovacuum
	// is on. Autovacuum visits a database once per naptime, and that
	// minute is long for a table filling from empty: measured with
	// autovacuum on and its visit not yet come, 10,000 invitations then
	// 1,000 commands/s ran at p99 3.1–6.2 s, against 0.14–0.23 s with this
	// scope (BENCHMARKS.md, thirty-fourth sitting).
	AnalyzeOutgrown
)

// MaintainTables does for the tables of the current schema what autovacuum
// would have at its default thresholds: VACUUM (ANALYZE) where dead rows
// passed the vacuum threshold, ANALYZE where changes since the last ANALYZE
// passed the analyze threshold, skipping tables vacuumed or analyzed less
// than naptime ago unless they outgrew their statistics. With scope
// AnalyzeOutgrown it only analyzes the tables that outgrew them, and
// vacuums nothing. It runs throttled the way autovacuum is
// (vacuum_cost_delay 2 ms), on one connection, and does nothing while
// another replica maintains the schema. On SQLite it does nothing.
//
// Dead rows matter as much as statistics: a bitmap scan of an index over
// open operations (the per-node quota count) visits every entry whose row
// has since ended until a vacuum removes it, and never marks them dead as a
// plain index scan does.
func (db *DB) MaintainTables(ctx context.Context, naptime time.Duration, scope MaintenanceScope) ([]TableMaintenance, error) {
	if db.Dialect != Postgres {
		return nil, nil
	}
	conn, err := db.sqlDB.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	var mine bool
	if err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock("+maintainLock+")").Scan(&mine); err != nil {
		return nil, fmt.Errorf("table maintenance lock: %w", err)
	}
	if !mine {
		return nil, nil
	}
	defer func() {
		// A session lock outlives its holder's work: a connection that
		// cannot say it let go is not handed back to the pool holding it.
		if _, err := conn.ExecContext(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock("+maintainLock+")"); err != nil {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}()
	// $8, outgrown only: no vacuum, no naptime, only the outgrown rule.
	rows, err := conn.QueryContext(ctx, `
		SELECT s.relname, NOT $8 AND s.n_dead_tup > $1 + $2 * GREATEST(s.n_live_tup, 0)
		FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
		WHERE s.schemaname = current_schema()
		  AND ((NOT $8 AND s.n_dead_tup > $1 + $2 * GREATEST(s.n_live_tup, 0))
		    OR s.n_mod_since_analyze > $3 + $4 * GREATEST(s.n_live_tup, 0))
		  AND ((NOT $8 AND COALESCE(GREATEST(s.last_vacuum, s.last_autovacuum, s.last_analyze, s.last_autoanalyze), '-infinity')
		      < now() - make_interval(secs => $5))
		    OR s.n_live_tup > $6 * GREATEST(c.reltuples, $7))
		ORDER BY s.relname`, vacuumBaseRows, vacuumScaleFactor, analyzeBaseRows, analyzeScaleFactor, naptime.Seconds(),
		outgrownFactor, outgrownBaseRows, scope == AnalyzeOutgrown)
	if err != nil {
		return nil, fmt.Errorf("find tables to maintain: %w", err)
	}
	var due []TableMaintenance
	for rows.Next() {
		var m TableMaintenance
		if err := rows.Scan(&m.Table, &m.Vacuum); err != nil {
			_ = rows.Close()
			return nil, err
		}
		due = append(due, m)
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	if len(due) == 0 {
		return nil, nil
	}
	// Session settings on a connection of the pool: reset before it goes back.
	if _, err := conn.ExecContext(ctx, "SET vacuum_cost_delay = '"+maintenanceCostWait+"'"); err != nil {
		return nil, err
	}
	defer func() { _, _ = conn.ExecContext(context.WithoutCancel(ctx), "RESET vacuum_cost_delay") }()
	var done []TableMaintenance
	for _, m := range due {
		stmt := "ANALYZE "
		if m.Vacuum {
			stmt = "VACUUM (ANALYZE) "
		}
		if _, err := conn.ExecContext(ctx, stmt+pgx.Identifier{m.Table}.Sanitize()); err != nil {
			return done, fmt.Errorf("%s%s: %w", stmt, m.Table, err)
		}
		done = append(done, m)
	}
	return done, nil
}

// TableKeeper keeps the server's tables' statistics in step with their
// growth, and, while Postgres's autovacuum is off, does autovacuum's work
// (see MaintainTables and its scopes). Every replica may run one: one at a
// time maintains, and a table is maintained at most once per Naptime
// unless it outgrew its statistics.
type TableKeeper struct {
	DB       *DB
	Interval time.Duration // how often to look; default 15 s
	Naptime  time.Duration // default MaintenanceNaptime
	Log      *slog.Logger
	// Maintained, when set, is told each table vacuumed or analyzed.
	Maintained func(TableMaintenance)
}

// Run checks every Interval until ctx ends. It does nothing on SQLite.
func (k *TableKeeper) Run(ctx context.Context) {
	if k.DB.Dialect != Postgres {
		return
	}
	interval := k.Interval
	if interval <= 0 {
		interval = 15 * time.Second
	}
	naptime := k.Naptime
	if naptime <= 0 {
		naptime = MaintenanceNaptime
	}
	log := k.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	warned := false
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		off, err := k.DB.AutovacuumOff(ctx)
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("table maintenance: could not read the autovacuum setting", "err", err)
			}
		} else {
			scope := AnalyzeOutgrown
			if off {
				scope = MaintainAll
				if !warned {
					log.Warn("Postgres autovacuum is off: nodeward vacuums and analyzes its own tables at autovacuum's default thresholds while it stays off")
					warned = true
				}
			}
			done, err := k.DB.MaintainTables(ctx, naptime, scope)
			for _, m := range done {
				if k.Maintained != nil {
					k.Maintained(m)
				}
			}
			if err != nil && ctx.Err() == nil {
				log.Warn("table maintenance failed", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
