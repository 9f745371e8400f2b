package models_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/models"
)

func openSQLite(t *testing.T, maxOpen int) *models.DB {
	t.Helper()
	db, err := models.Open(ctx, models.Options{DataDir: t.TempDir(), MaxOpenConns: maxOpen})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	require.NoError(t, db.Migrate(ctx))
	return db
}

// Each Go value is stored as the data folders written before hold it:
// times as "2006-01-02 15:04:05.999999999-07:00" text in UTC (SQL compares
// them as text), bools as integers, bytes as blobs. On both pools.
func TestSQLiteStoredForm(t *testing.T) {
	db := openSQLite(t, 2)
	zone := time.FixedZone("UTC+5:30", 5*3600+1800)
	vals := []any{t0, t0.Truncate(time.Second), time.Date(2026, 5, 1, 15, 0, 0, 500000000, zone), true, false,
		[]byte("ab"), int64(-7), "x", nil, 1.5}
	want := []string{
		"text '2026-05-01 09:30:00.123456+00:00'",
		"text '2026-05-01 09:30:00+00:00'",
		"text '2026-05-01 09:30:00.5+00:00'", // the same instant, in UTC
		"integer 1", "integer 0", "blob X'6162'", "integer -7", "text 'x'", "null NULL", "real 1.5",
	}
	// Bound straight to the driver: GORM inlines some values (nil).
	check := func(pool gorm.ConnPool) {
		for i, v := range vals {
			var got string
			require.NoError(t, pool.QueryRowContext(ctx, `SELECT typeof(?1) || ' ' || quote(?1)`, v).Scan(&got))
			require.Equal(t, want[i], got, "value %d (%T)", i, v)
		}
	}
	check(db.WithContext(ctx).Statement.ConnPool)
	require.NoError(t, db.Write(ctx, func(g *gorm.DB) error { check(g.Statement.ConnPool); return nil }))

	// A row written through the store.
	fs := models.NewFleetStore(db, "r1", nil)
	n := sampleNode("n1", "rent", 1)
	until := t0.Add(time.Minute)
	n.LeaseExpiresAt = &until
	insert(t, fs, n)
	var row string
	require.NoError(t, db.Raw(`SELECT quote(created_at) || ' ' || quote(lease_expires_at) || ' ' || quote(enrolled_at) || ' ' || quote(generation) FROM nodes`).Scan(&row).Error)
	require.Equal(t, "'2026-05-01 09:30:00.123456+00:00' '2026-05-01 09:31:00.123456+00:00' NULL 1", row)
}

// Rows in the forms the files written before hold (and SQL's own
// CURRENT_TIMESTAMP form, with no zone) read back as UTC times, and the
// stored text compares with a bound time.
func TestSQLiteReadsStoredRows(t *testing.T) {
	db := openSQLite(t, 2)
	require.NoError(t, db.Exec(`INSERT INTO nodes (id, rental_id, generation, state, fencing_token, created_at, updated_at,
		lease_expires_at, disk_state) VALUES ('n1', 'rent', 1, 'ready', 3, '2026-05-01 09:30:00.123456+00:00',
		'2026-05-01 09:30:00', '2026-05-01 09:31:00.5+00:00', 'never_reported')`).Error)
	fs := models.NewFleetStore(db, "r1", nil)
	var got fleet.Node
	require.NoError(t, fs.Tx(ctx, func(tx fleet.Tx) error {
		var err error
		got, err = tx.Node(ctx, "n1")
		return err
	}))
	require.Equal(t, t0, got.CreatedAt)
	require.Equal(t, time.UTC, got.CreatedAt.Location())
	require.Equal(t, t0.Truncate(time.Second), got.UpdatedAt)
	require.Equal(t, time.UTC, got.UpdatedAt.Location())
	require.NotNil(t, got.LeaseExpiresAt)
	require.Equal(t, time.Date(2026, 5, 1, 9, 31, 0, 500000000, time.UTC), *got.LeaseExpiresAt)
	require.Equal(t, int64(3), got.FencingToken)

	var n int64
	require.NoError(t, db.Raw(`SELECT COUNT(*) FROM nodes WHERE lease_expires_at < ?`, t0.Add(61*time.Second)).Scan(&n).Error)
	require.Equal(t, int64(1), n)
	require.NoError(t, db.Raw(`SELECT COUNT(*) FROM nodes WHERE lease_expires_at < ?`, t0.Add(59*time.Second)).Scan(&n).Error)
	require.Zero(t, n)
}

// The durability, locking and temp-storage settings (DECISIONS.md §20) hold on every
// connection: each of the readers' and the writer's.
func TestSQLitePragmasOnEveryConnection(t *testing.T) {
	const readers = 3
	db := openSQLite(t, readers)
	check := func(q func(string) string) {
		require.Equal(t, "wal", q("journal_mode"))
		require.Equal(t, "2", q("synchronous"), "FULL")
		require.Equal(t, "10000", q("busy_timeout"))
		require.Equal(t, "1", q("foreign_keys"))
		require.Equal(t, "2", q("temp_store"), "MEMORY: savepoint sub-journals never reach a file")
	}
	var conns []func()
	for range readers {
		c, err := db.SQL().Conn(ctx)
		require.NoError(t, err)
		conns = append(conns, func() { _ = c.Close() })
		check(func(p string) string {
			var v string
			require.NoError(t, c.QueryRowContext(ctx, "PRAGMA "+p).Scan(&v))
			return v
		})
	}
	require.Equal(t, readers, db.SQL().Stats().InUse, "each reader connection checked")
	for _, c := range conns {
		c()
	}
	require.NoError(t, db.Write(ctx, func(g *gorm.DB) error {
		check(func(p string) string {
			var v string
			require.NoError(t, g.Raw("PRAGMA "+p).Scan(&v).Error)
			return v
		})
		return nil
	}))
}

// A statement text is compiled once per connection, however often it
// runs, in transactions or not; texts that vary (IN lists) are bounded.
func TestSQLiteStatementsKept(t *testing.T) {
	db := openSQLite(t, 4)
	fs := models.NewFleetStore(db, "r1", nil)
	insert(t, fs, sampleNode("n0", "rent-0", 1))
	round := func(i int) {
		require.NoError(t, db.Tx(ctx, func(tx *gorm.DB) error {
			return tx.Exec(`UPDATE nodes SET fencing_token = ? WHERE id = ?`, i, "n0").Error
		}))
		require.NoError(t, db.Write(ctx, func(g *gorm.DB) error {
			return g.Exec(`UPDATE nodes SET agent_version = ? WHERE id = ?`, strconv.Itoa(i), "n0").Error
		}))
		var n fleet.Node
		require.NoError(t, fs.Tx(ctx, func(tx fleet.Tx) error {
			var err error
			n, err = tx.Node(ctx, "n0")
			return err
		}))
		require.Equal(t, int64(i), n.FencingToken)
		var v string
		require.NoError(t, db.Raw(`SELECT agent_version FROM nodes WHERE id = ?`, "n0").Scan(&v).Error)
		require.Equal(t, strconv.Itoa(i), v)
	}
	round(1)
	_, before := models.KeptStatements(db)
	// Concurrent readers share the readers' kept statements.
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for range 50 {
				var v string
				require.NoError(t, db.Raw(`SELECT agent_version FROM nodes WHERE id = ?`, "n0").Scan(&v).Error, "reader %d", g)
			}
		})
	}
	for i := 2; i <= 50; i++ {
		round(i)
	}
	wg.Wait()
	_, after := models.KeptStatements(db)
	require.Equal(t, before[1], after[1], "the writer compiled nothing again")
	require.LessOrEqual(t, after[0]-before[0], 3, "the readers compiled each text at most once more (racing first uses)")

	// An IN list of every length from 1 to past the bound.
	for n := 1; n <= models.StmtCacheSize+40; n++ {
		ids := make([]string, n)
		for i := range ids {
			ids[i] = "n" + strconv.Itoa(i)
		}
		var c int64
		require.NoError(t, db.Raw(`SELECT COUNT(*) FROM nodes WHERE id IN ?`, ids).Scan(&c).Error)
		require.Equal(t, int64(1), c)
	}
	kept, _ := models.KeptStatements(db)
	require.Equal(t, models.StmtCacheSize, kept[0], "the readers keep at most the bound")
}

// A write transaction that fails, panics or is cancelled ends there: the
// writer's connection is left with none open, and its writes are undone.
func TestSQLiteWriterTransactionsEnd(t *testing.T) {
	db := openSQLite(t, 2)
	count := func() int64 {
		var n int64
		require.NoError(t, db.Raw(`SELECT COUNT(*) FROM node_state_counts`).Scan(&n).Error)
		return n
	}
	ins := func(tx *gorm.DB) error {
		return tx.Exec(`INSERT INTO node_state_counts(state, n) VALUES ('ready', 1)`).Error
	}
	boom := errors.New("boom")
	require.ErrorIs(t, db.Tx(ctx, func(tx *gorm.DB) error {
		require.NoError(t, ins(tx))
		return boom
	}), boom)
	require.Zero(t, count())

	require.Panics(t, func() {
		_ = db.Tx(ctx, func(tx *gorm.DB) error {
			require.NoError(t, ins(tx))
			panic("boom")
		})
	})
	require.Zero(t, count())

	cctx, cancel := context.WithCancel(ctx)
	err := db.Tx(cctx, func(tx *gorm.DB) error {
		require.NoError(t, ins(tx))
		cancel()
		return ins(tx)
	})
	require.Error(t, err)
	require.Zero(t, count())

	// A failed statement inside a savepoint (the group commit's) undoes
	// only its own part.
	require.NoError(t, db.Tx(ctx, func(tx *gorm.DB) error {
		require.NoError(t, ins(tx))
		require.NoError(t, tx.SavePoint("g0").Error)
		require.NoError(t, ins(tx))
		require.Error(t, tx.Exec(`INSERT INTO nodes(id) VALUES ('x')`).Error)
		return tx.RollbackTo("g0").Error
	}))
	require.Equal(t, int64(1), count())

	// The writer takes new transactions, and sees no open one.
	require.NoError(t, db.Tx(ctx, ins))
	require.Equal(t, int64(2), count())
	err = db.Write(ctx, func(g *gorm.DB) error { return g.Exec(`COMMIT`).Error })
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "no transaction is active"), err.Error())
}

// Statements evicted while other readers run them: every call answers.
func TestSQLiteStatementsEvictedUnderUse(t *testing.T) {
	db := openSQLite(t, 4)
	fs := models.NewFleetStore(db, "r1", nil)
	insert(t, fs, sampleNode("n0", "rent-0", 1))
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			// Each goroutine walks its own lengths, together well past the
			// bound, so each evicts statements the others are using.
			for n := 1 + g; n <= 2*models.StmtCacheSize; n += 4 {
				ids := make([]string, n)
				for i := range ids {
					ids[i] = "n" + strconv.Itoa(i)
				}
				var c int64
				require.NoError(t, db.Raw(`SELECT COUNT(*) FROM nodes WHERE id IN ?`, ids).Scan(&c).Error)
				require.NoError(t, db.Raw(`SELECT COUNT(*) FROM nodes WHERE id IN ?`, ids[:1]).Scan(&c).Error)
				require.Equal(t, int64(1), c)
			}
		})
	}
	wg.Wait()
	kept, _ := models.KeptStatements(db)
	require.LessOrEqual(t, kept[0], models.StmtCacheSize)
}

// A statement that does not compile fails on each pool, and the pools go on.
func TestSQLiteStatementErrors(t *testing.T) {
	db := openSQLite(t, 2)
	var n int64
	require.Error(t, db.Raw(`SELECT COUNT(*) FROM no_such_table`).Scan(&n).Error)
	require.Error(t, db.WithContext(ctx).Statement.ConnPool.QueryRowContext(ctx, `SELECT nope FROM nodes`).Scan(&n))
	require.NoError(t, db.Write(ctx, func(g *gorm.DB) error {
		require.Error(t, g.Statement.ConnPool.QueryRowContext(ctx, `SELECT nope FROM nodes`).Scan(&n))
		require.Error(t, g.Exec(`UPDATE no_such_table SET x = 1`).Error)
		return g.Raw(`SELECT COUNT(*) FROM nodes`).Scan(&n).Error
	}))
	require.NoError(t, db.Raw(`SELECT COUNT(*) FROM nodes`).Scan(&n).Error)
	kept, _ := models.KeptStatements(db)
	require.Equal(t, [2]int{2, 2}, kept, "failed texts are not kept: each pool keeps the dialector's sqlite_version() and the COUNT")
}

// The write-ahead log is copied into the database file by the DB's
// checkpointer, not by the writer's commits (wal_autocheckpoint 0): after
// writes the checkpointer runs and copies their pages, the log is left
// with nothing to copy, and the writer then starts it over (it does not
// grow with every write).
func TestSQLiteCheckpointsOffTheWriter(t *testing.T) {
	db, err := models.Open(ctx, models.Options{DataDir: t.TempDir(), CheckpointEvery: 10 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	require.NoError(t, db.Migrate(ctx))
	s := models.NewFleetStore(db, "r1", nil)
	write := func(prefix string, n int) {
		for i := range n {
			insert(t, s, sampleNode(fmt.Sprintf("%s%03d", prefix, i), fmt.Sprintf("rent-%s%03d", prefix, i), 1))
		}
	}
	write("a", 200)
	require.Eventually(t, func() bool { return db.CheckpointStats().Frames > 0 }, 10*time.Second, 5*time.Millisecond,
		"the checkpointer copied nothing")
	walSize := func() int64 {
		fi, err := os.Stat(db.Path + "-wal")
		require.NoError(t, err)
		return fi.Size()
	}
	// Everything copied: the next write transaction starts the log over,
	// so more of the same writes leave its file no larger than the most
	// it has reached.
	require.Eventually(t, func() bool {
		var busy, logFrames, copied int64
		require.NoError(t, db.SQL().QueryRowContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &logFrames, &copied))
		return logFrames == copied
	}, 10*time.Second, 5*time.Millisecond)
	high := walSize()
	for round := range 5 {
		before := db.CheckpointStats().Runs
		write(fmt.Sprintf("r%d-", round), 200)
		require.Eventually(t, func() bool { return db.CheckpointStats().Runs > before+1 }, 10*time.Second, 5*time.Millisecond)
	}
	require.LessOrEqual(t, walSize(), 2*high, "the log grew with the writes: it is not started over")
}
