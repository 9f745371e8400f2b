package models_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// TestPostgresMaintainTablesActsAtAutovacuumThresholds: with autovacuum's
// default thresholds, a table whose rows mostly changed is analyzed, one
// with many dead rows is vacuumed (and analyzed), an untouched one is left
// alone, and a second pass does not analyze again what nothing changed
// since.
func TestPostgresMaintainTablesActsAtAutovacuumThresholds(t *testing.T) {
	ctx := context.Background()
	db := openOneConnection(t)

	for _, stmt := range []string{
		"CREATE TABLE probe_grown (id int)",
		"CREATE TABLE probe_churned (id int)",
		"INSERT INTO probe_grown SELECT g FROM generate_series(1, 1000) g",
		"INSERT INTO probe_churned SELECT g FROM generate_series(1, 1000) g",
		"ANALYZE probe_churned",
		"DELETE FROM probe_churned WHERE id % 2 = 0",
		"SELECT pg_stat_force_next_flush()",
	} {
		require.NoError(t, db.Exec(stmt).Error, stmt)
	}

	done, err := db.MaintainTables(ctx, 0, models.MaintainAll)
	require.NoError(t, err)
	got := map[string]bool{}
	for _, m := range done {
		got[m.Table] = m.Vacuum
	}
	require.Equal(t, map[string]bool{"probe_grown": false, "probe_churned": true}, got,
		"the migrated tables hold a few rows (below the thresholds); the probes passed them")

	var analyzed, vacuumed int
	require.NoError(t, db.Raw(`SELECT
			(SELECT COUNT(*) FROM pg_stat_user_tables WHERE schemaname = current_schema() AND relname LIKE 'probe_%' AND last_analyze IS NOT NULL),
			(SELECT COUNT(*) FROM pg_stat_user_tables WHERE schemaname = current_schema() AND relname LIKE 'probe_%' AND last_vacuum IS NOT NULL)`).
		Row().Scan(&analyzed, &vacuumed))
	require.Equal(t, 2, analyzed)
	require.Equal(t, 1, vacuumed)

	require.NoError(t, db.Exec("SELECT pg_stat_force_next_flush()").Error)
	again, err := db.MaintainTables(ctx, 0, models.MaintainAll)
	require.NoError(t, err)
	for _, m := range again {
		// The churned table may be vacuumed again: another session's open
		// snapshot (tests of other packages share the server) can keep its
		// dead rows from being removed, as it would for autovacuum.
		require.NotEqual(t, "probe_grown", m.Table, "analyzed, and nothing changed since")
	}
}

func TestMaintainTablesDoesNothingOnSQLite(t *testing.T) {
	db := dbtest.Open(t, models.SQLite)
	off, err := db.AutovacuumOff(context.Background())
	require.NoError(t, err)
	require.False(t, off)
	done, err := db.MaintainTables(context.Background(), 0, models.MaintainAll)
	require.NoError(t, err)
	require.Empty(t, done)
}

// addProbeRows inserts n rows into a probe table and flushes the session's
// statistics, so pg_stat_user_tables counts them at once.
func addProbeRows(t *testing.T, db *models.DB, table string, n int) {
	t.Helper()
	for _, stmt := range []string{
		"INSERT INTO " + table + " SELECT g FROM generate_series(1, " + strconv.Itoa(n) + ") g",
		"SELECT pg_stat_force_next_flush()",
	} {
		require.NoError(t, db.Exec(stmt).Error, stmt)
	}
}

// maintainedProbe runs MaintainTables and answers whether it did the table.
func maintainedProbe(t *testing.T, db *models.DB, table string, naptime time.Duration) bool {
	t.Helper()
	done, err := db.MaintainTables(context.Background(), naptime, models.MaintainAll)
	require.NoError(t, err)
	for _, m := range done {
		if m.Table == table {
			return true
		}
	}
	return false
}

// TestPostgresMaintainTablesOnceANaptimeOneReplicaAtATime: like
// autovacuum, a table is maintained at most once per naptime however fast
// it changes, and while one replica maintains the schema the others leave
// it alone.
func TestPostgresMaintainTablesOnceANaptimeOneReplicaAtATime(t *testing.T) {
	ctx := context.Background()
	opts := dbtest.Options(t, models.Postgres)
	opts.MaxOpenConns = 1
	open := func() *models.DB {
		db, err := models.Open(ctx, opts)
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		return db
	}
	db, other := open(), open()
	require.NoError(t, db.Migrate(ctx))
	grow := func() { addProbeRows(t, db, "probe_busy", 2000) }
	maintained := func(naptime time.Duration) bool { return maintainedProbe(t, db, "probe_busy", naptime) }
	require.NoError(t, db.Exec("CREATE TABLE probe_busy (id int)").Error)
	grow()

	const lock = "hashtextextended('nodeward.maintain.' || current_schema(), 0)"
	require.NoError(t, other.Exec("SELECT pg_advisory_lock("+lock+")").Error)
	require.False(t, maintained(0), "another replica is maintaining the schema")
	require.NoError(t, other.Exec("SELECT pg_advisory_unlock("+lock+")").Error)
	require.True(t, maintained(0))

	grow()
	require.False(t, maintained(time.Hour), "analyzed less than a naptime ago")
	require.True(t, maintained(0), "past its naptime")
}

// TestPostgresMaintainTablesAnalyzesATableThatOutgrewItsStatistics: within
// its naptime, a table that grew several times over since the planner last
// counted it is analyzed anyway.
func TestPostgresMaintainTablesAnalyzesATableThatOutgrewItsStatistics(t *testing.T) {
	db := openOneConnection(t)
	insert := func(n int) { addProbeRows(t, db, "probe_filling", n) }
	analyzed := func() bool { return maintainedProbe(t, db, "probe_filling", time.Hour) }
	require.NoError(t, db.Exec("CREATE TABLE probe_filling (id int)").Error)
	insert(1000)
	require.True(t, analyzed(), "never maintained")
	insert(500)
	require.False(t, analyzed(), "grew by half within its naptime: left alone")
	insert(5000)
	require.True(t, analyzed(), "grew over four times past what the planner counted")
}

// TestPostgresAnalyzeOutgrownOnlyAnalyzesTablesThatOutgrewTheirStatistics:
// the scope a server with autovacuum on uses analyzes a table filling from
// empty and one that grew over four times within its naptime, and leaves
// to autovacuum what autovacuum does: dead rows, and tables that changed
// without outgrowing their statistics.
func TestPostgresAnalyzeOutgrownOnlyAnalyzesTablesThatOutgrewTheirStatistics(t *testing.T) {
	db := openOneConnection(t)
	maintain := func() map[string]bool {
		done, err := db.MaintainTables(context.Background(), time.Hour, models.AnalyzeOutgrown)
		require.NoError(t, err)
		got := map[string]bool{}
		for _, m := range done {
			got[m.Table] = m.Vacuum
		}
		return got
	}
	for _, stmt := range []string{
		"CREATE TABLE probe_filling (id int)",
		"CREATE TABLE probe_churned (id int)",
		"INSERT INTO probe_churned SELECT g FROM generate_series(1, 4000) g",
		"ANALYZE probe_churned",
		"DELETE FROM probe_churned WHERE id % 2 = 0",
	} {
		require.NoError(t, db.Exec(stmt).Error, stmt)
	}
	addProbeRows(t, db, "probe_filling", 1500)
	require.Equal(t, map[string]bool{"probe_filling": false}, maintain(),
		"the filling table is analyzed, never vacuumed; the churned one's dead rows and changes are autovacuum's")

	addProbeRows(t, db, "probe_filling", 3000)
	require.Empty(t, maintain(), "tripled what the planner counted: not outgrown yet")
	addProbeRows(t, db, "probe_filling", 2000)
	require.Equal(t, map[string]bool{"probe_filling": false}, maintain(), "past four times")

	full, err := db.MaintainTables(context.Background(), 0, models.MaintainAll)
	require.NoError(t, err)
	require.Contains(t, full, models.TableMaintenance{Table: "probe_churned", Vacuum: true},
		"with autovacuum off the same dead rows are vacuumed")
}

// TestPostgresTableKeeperAnalyzesAFillingTable: whether the server's
// autovacuum is on or off, the keeper a replica runs analyzes a table that
// fills from empty without waiting for a naptime.
func TestPostgresTableKeeperAnalyzesAFillingTable(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	opts := dbtest.Options(t, models.Postgres)
	db, err := models.Open(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	require.NoError(t, db.Migrate(ctx))
	require.NoError(t, db.Exec("CREATE TABLE probe_keeper (id int)").Error)
	addProbeRows(t, db, "probe_keeper", 2000)

	analyzed := make(chan models.TableMaintenance, 16)
	k := &models.TableKeeper{DB: db, Interval: 20 * time.Millisecond, Naptime: time.Hour,
		Maintained: func(m models.TableMaintenance) {
			select {
			case analyzed <- m:
			case <-ctx.Done(): // the test has its answer; never block the keeper's exit
			}
		}}
	stopped := make(chan struct{})
	go func() { defer close(stopped); k.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-stopped })
	deadline := time.After(30 * time.Second)
	for {
		select {
		case m := <-analyzed:
			if m.Table == "probe_keeper" {
				require.False(t, m.Vacuum, "nothing to vacuum: rows were only inserted")
				return
			}
		case <-deadline:
			t.Fatal("the keeper did not analyze a table that filled from empty")
		}
	}
}
