// Package models holds the GORM models (one per table) and the store
// implementations over GORM for both dialects: the embedded SQLite default
// and PostgreSQL. The schema itself is owned by versioned SQL in migrations/;
// nothing here creates tables.
package models

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/libtnb/sqlite"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/nodeward/nodeward/internal/dbtime"
	"github.com/nodeward/nodeward/migrations"
)

// Dialects.
const (
	SQLite   = "sqlite"
	Postgres = "postgres"
)

// ErrDataDirLocked means another process holds the SQLite data folder.
var ErrDataDirLocked = errors.New("data folder is in use by another nodeward process (SQLite is single-process; several replicas need PostgreSQL)")

// DB is an open database: the GORM handle plus what the product needs to know
// about it.
type DB struct {
	*gorm.DB
	// Dialect is SQLite or Postgres.
	Dialect string
	// URL is the PostgreSQL URL (empty for SQLite); listeners dial it.
	URL string
	// Path is the SQLite file (empty for Postgres).
	Path string

	sqlDB *sql.DB
	lock  *os.File
	// writers serialises SQLite write transactions in the process. SQLite
	// has one writer at a time anyway; queueing here is fair and cheap,
	// where waiting in SQLite's busy handler is neither. Nil for Postgres.
	writers *sync.Mutex
	// writer is the SQLite connection write transactions (Tx) run on, a
	// pool of its own holding one connection, kept apart from the readers'
	// pool. In one shared pool the one writer (the fleet's group commit,
	// which every submit, claim and settlement waits on) queued for a
	// connection behind every read, and database/sql hands a freed
	// connection to a random waiter: under a fleet's re-poll wave (two
	// reads a poll, hundreds waiting) a batch could wait there for
	// hundreds of milliseconds with its commit's whole queue behind it
	// (issue 13, the hold run's tail). Nil for Postgres.
	writer    *gorm.DB
	writerSQL *sql.DB
	// writerConn is the writer pool's one connection, held (writerPool).
	writerConn *sql.Conn
	// stmts are the SQLite pools' kept statements (sqlitestmts.go).
	stmts []*stmtPool
	// ckpt copies SQLite's write-ahead log into the database file off the
	// writer (sqlitecheckpoint.go); nil for Postgres.
	ckpt *checkpointer
	// writeLanes is the fleet store's number of per-node write lanes
	// (Options.WriteLanes resolved).
	writeLanes int
}

// Options says which database to open.
type Options struct {
	// URL is a PostgreSQL URL (postgres:// or postgresql://). Empty selects
	// SQLite in DataDir.
	URL string
	// DataDir holds the SQLite database and its lock.
	DataDir string
	// MaxOpenConns bounds the pool; zero picks a default per dialect.
	MaxOpenConns int
	// WriteLanes is how many write batches the fleet store's group commit
	// runs at once on Postgres, each on its own connection (models/group.go);
	// zero picks DefaultWriteLanes of the pool, 1 runs one batch at a time.
	// SQLite always runs one.
	WriteLanes int
	// CheckpointEvery is how often SQLite's write-ahead log is copied into
	// the database file (zero: DefaultCheckpointEvery).
	CheckpointEvery time.Duration
	// WrapConnector, when set, wraps the Postgres driver's connector: the
	// write-path counters (internal/sqlcount) count through it. Nil in
	// production.
	WrapConnector func(driver.Connector) driver.Connector
}

// Open opens (and for SQLite creates) the database. It does not migrate.
func Open(ctx context.Context, opts Options) (*DB, error) {
	if opts.URL != "" {
		return openPostgres(ctx, opts)
	}
	return openSQLite(ctx, opts)
}

func gormConfig() *gorm.Config {
	return &gorm.Config{
		Logger:                 logger.Discard,
		SkipDefaultTransaction: true,
		NowFunc:                func() time.Time { return dbtime.Norm(time.Now()) },
		TranslateError:         true,
	}
}

func openPostgres(ctx context.Context, opts Options) (*DB, error) {
	u, err := url.Parse(opts.URL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		// The URL may carry a password: never echo it.
		return nil, errors.New("database URL must be a postgres:// URL")
	}
	dialector := postgres.Open(opts.URL)
	if opts.WrapConnector != nil {
		pc, err := pgx.ParseConfig(opts.URL)
		if err != nil {
			return nil, fmt.Errorf("open postgres: %w", redactURLError(err, opts.URL))
		}
		dialector = postgres.New(postgres.Config{Conn: sql.OpenDB(opts.WrapConnector(stdlib.GetConnector(*pc)))})
	}
	gdb, err := gorm.Open(dialector, gormConfig())
	if err != nil {
		return nil, fmt.Errorf("open postgres: %w", redactURLError(err, opts.URL))
	}
	sqlDB, err := gdb.DB()
	if err != nil {
		return nil, err
	}
	maxOpen := opts.MaxOpenConns
	if maxOpen == 0 {
		maxOpen = 32
	}
	sqlDB.SetMaxOpenConns(maxOpen)
	sqlDB.SetMaxIdleConns(maxOpen)
	sqlDB.SetConnMaxIdleTime(5 * time.Minute)
	if err := sqlDB.PingContext(ctx); err != nil {
		_ = sqlDB.Close()
		return nil, fmt.Errorf("connect to postgres: %w", redactURLError(err, opts.URL))
	}
	// Statements take the pool's connections first come, first served
	// (fairPool).
	fair := newFairPool(sqlDB)
	gdb.ConnPool, gdb.Statement.ConnPool = fair, fair
	lanes := opts.WriteLanes
	if lanes <= 0 {
		lanes = DefaultWriteLanes(maxOpen)
	}
	return &DB{DB: gdb, Dialect: Postgres, URL: opts.URL, sqlDB: sqlDB, writeLanes: lanes}, nil
}

// redactURLError keeps a driver error from echoing a URL with its password.
func redactURLError(err error, rawURL string) error {
	msg := err.Error()
	if u, perr := url.Parse(rawURL); perr == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok && pw != "" {
			msg = strings.ReplaceAll(msg, pw, "xxxxx")
		}
	}
	return errors.New(msg)
}

// SQLiteFile is the embedded database's file in a data folder.
func SQLiteFile(dataDir string) string { return filepath.Join(dataDir, "nodeward.db") }

func openSQLite(ctx context.Context, opts Options) (*DB, error) {
	if opts.DataDir == "" {
		return nil, errors.New("no data folder for the embedded database")
	}
	if err := os.MkdirAll(opts.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data folder: %w", err)
	}
	lock, err := lockDataDir(opts.DataDir)
	if err != nil {
		return nil, err
	}
	path := SQLiteFile(opts.DataDir)
	// Create the file ourselves so the database (which holds digests and
	// sealed secrets) is private to this user from the first byte.
	if f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600); err == nil {
		_ = f.Close()
	}
	// IMMEDIATE transactions (the migrations'; the writer's begin their
	// own, writerPool) take the write lock up front, so two writers queue
	// on busy_timeout instead of deadlocking on a lock upgrade.
	// The path is escaped: SQLite reads a file: URI, where a '#' or '?' in a
	// folder name would otherwise cut the path short. Times are written as
	// "2006-01-02 15:04:05.999999999-07:00" in UTC (_time_format,
	// _timezone): SQL compares them as text, and the files written before
	// keep that form. _texttotime and _inttotime off: a column is read as
	// it always was (only DATE/DATETIME/TIMESTAMP text becomes a time).
	// temp_store MEMORY keeps the savepoints' sub-journals in memory: the
	// group commit opens a savepoint per request, and with file temp
	// storage every page a request touched was copied to a temp file by a
	// write call of its own (18 % of the server's CPU at saturation).
	dsn := "file:" + (&url.URL{Path: path}).EscapedPath() + "?_txlock=immediate&_time_format=sqlite&_timezone=UTC" +
		"&_texttotime=0&_inttotime=0" +
		"&_pragma=journal_mode(WAL)" +
		"&_pragma=synchronous(FULL)" +
		"&_pragma=busy_timeout(10000)" +
		"&_pragma=foreign_keys(1)" +
		"&_pragma=temp_store(MEMORY)"
	fail := func(err error, closers ...func() error) (*DB, error) {
		for _, c := range closers {
			_ = c()
		}
		_ = lock.Close()
		return nil, fmt.Errorf("open sqlite: %w", err)
	}
	sqlDB, err := sql.Open("sqlite", dsn)
	if err != nil {
		return fail(err)
	}
	maxOpen := opts.MaxOpenConns
	if maxOpen == 0 {
		maxOpen = 8
	}
	sqlDB.SetMaxOpenConns(maxOpen)
	sqlDB.SetMaxIdleConns(maxOpen)
	if err := sqlDB.PingContext(ctx); err != nil {
		return fail(err, sqlDB.Close)
	}
	readers := newStmtPool(sqlDB, sqlDB)
	gdb, err := gorm.Open(sqlite.New(sqlite.Config{Conn: readers}), gormConfig())
	if err != nil {
		return fail(err, sqlDB.Close)
	}
	// The writer's own connection (DB.writer), opened like the others and
	// held for the life of the DB: its transactions are statements on it
	// (writerPool), so its prepared statements outlive them.
	wSQL, err := sql.Open("sqlite", dsn)
	if err != nil {
		return fail(err, sqlDB.Close)
	}
	wSQL.SetMaxOpenConns(1)
	wSQL.SetMaxIdleConns(1)
	wSQL.SetConnMaxLifetime(0)
	wSQL.SetConnMaxIdleTime(0)
	wConn, err := wSQL.Conn(ctx)
	if err != nil {
		return fail(err, wSQL.Close, sqlDB.Close)
	}
	writer := newStmtPool(wConn, wSQL)
	wdb, err := gorm.Open(sqlite.New(sqlite.Config{Conn: writerPool{writer}}), gormConfig())
	if err != nil {
		return fail(err, wConn.Close, wSQL.Close, sqlDB.Close)
	}
	return &DB{DB: gdb, Dialect: SQLite, Path: path, sqlDB: sqlDB, lock: lock, writers: &sync.Mutex{}, writer: wdb, writerSQL: wSQL,
		stmts: []*stmtPool{readers, writer}, writerConn: wConn, ckpt: startCheckpointer(sqlDB, opts.CheckpointEvery)}, nil
}

// lockDataDir takes an exclusive advisory lock on the data folder for the
// life of the process: SQLite is one process (DECISIONS.md §23).
func lockDataDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "nodeward.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock data folder: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s: %w", dir, ErrDataDirLocked)
		}
		return nil, fmt.Errorf("lock data folder: %w", err)
	}
	return f, nil
}

// SQL returns the underlying *sql.DB.
func (db *DB) SQL() *sql.DB { return db.sqlDB }

// Migrate applies every pending migration of the dialect.
func (db *DB) Migrate(ctx context.Context) error {
	return migrations.Up(ctx, db.sqlDB, db.Dialect)
}

// MigrationsCurrent reports whether every embedded migration is applied.
func (db *DB) MigrationsCurrent(ctx context.Context) (bool, error) {
	return migrations.Current(ctx, db.sqlDB, db.Dialect)
}

// Ping checks the database answers.
func (db *DB) Ping(ctx context.Context) error { return db.sqlDB.PingContext(ctx) }

// Close closes the pool and releases the data folder.
func (db *DB) Close() error {
	if db.ckpt != nil {
		db.ckpt.close()
	}
	for _, p := range db.stmts {
		p.closeAll()
	}
	if db.writerConn != nil {
		_ = db.writerConn.Close()
	}
	if db.writerSQL != nil {
		_ = db.writerSQL.Close()
	}
	err := db.sqlDB.Close()
	if db.lock != nil {
		_ = db.lock.Close()
	}
	return err
}

// Tx runs fn in one transaction: committed when fn returns nil, rolled back
// otherwise. Everything that changes rows that must agree goes through here.
func (db *DB) Tx(ctx context.Context, fn func(tx *gorm.DB) error) error {
	if db.writers != nil {
		db.writers.Lock()
		defer db.writers.Unlock()
	}
	if db.writer != nil {
		return db.writer.WithContext(ctx).Transaction(fn)
	}
	return db.WithContext(ctx).Transaction(fn)
}

// Write runs fn's statements, outside a transaction, where writes go: on
// SQLite its one writer connection, under the writers lock, so a lone
// write (a lease, a heartbeat, a purge) queues with the group commit's
// batches instead of meeting them in SQLite's busy handler, where a
// writer that is never idle can hold it off past busy_timeout (SQLITE_BUSY
// under load); on Postgres the pool.
func (db *DB) Write(ctx context.Context, fn func(g *gorm.DB) error) error {
	if db.writer == nil {
		return fn(db.WithContext(ctx))
	}
	db.writers.Lock()
	defer db.writers.Unlock()
	return fn(db.writer.WithContext(ctx))
}

// WriterSQL answers the SQLite writer's own pool (one connection, held by
// the DB, so always in use; its WaitCount stays 0), or nil on
// Postgres, which has no separate writer.
func (db *DB) WriterSQL() *sql.DB { return db.writerSQL }
