package models

import (
	"container/list"
	"context"
	"database/sql"
	"strings"
	"sync"
	"sync/atomic"

	"gorm.io/gorm"
)

// SQLite compiles a statement's text on every plain Exec or Query (the
// parser was a quarter of the server's CPU); the driver keeps the compiled
// statement only on a prepared one. stmtPool is the GORM connection pool of
// the SQLite pools: it runs each statement on a prepared *sql.Stmt kept per
// text, so a text is compiled once per connection.
//
// GORM's own PrepareStmt does not serve here: inside a transaction it
// prepares on the *sql.Tx, and database/sql re-prepares such a statement
// in every later transaction, where the command path runs.
//
// The writer's transactions are BEGIN IMMEDIATE … COMMIT statements on its
// one held connection (writerPool.BeginTx), so its prepared statements stay
// valid across transactions. The readers' pool prepares on the *sql.DB:
// database/sql prepares it again on each connection it runs on, once.

// stmtCacheSize bounds each pool's kept statements. The fixed statements
// are a few dozen texts; an IN list or a VALUES list makes one text per
// length, so the texts are not bounded by themselves: the least recently
// used is closed past this.
const stmtCacheSize = 256

// preparer is *sql.DB (the readers) or *sql.Conn (the writer).
type preparer interface {
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

type stmtPool struct {
	on preparer
	// db is the pool on answers to GORM's DB() (stats, Close, Ping).
	db *sql.DB

	mu    sync.Mutex
	byKey map[string]*list.Element // of *keptStmt
	lru   list.List                // front: most recently used
	// prepares counts the texts prepared for keeping (tests).
	prepares atomic.Int64
}

type keptStmt struct {
	query string
	stmt  *sql.Stmt
	// users are the calls between taking the statement and running it;
	// an evicted statement is closed when the last of them is done (a
	// closed *sql.Stmt fails). Rows already open hold Close off by
	// themselves. Under stmtPool.mu.
	users   int
	evicted bool
}

func newStmtPool(on preparer, db *sql.DB) *stmtPool {
	return &stmtPool{on: on, db: db, byKey: map[string]*list.Element{}}
}

// take answers the kept statement for query, preparing it on first use;
// the caller gives it back (put) once it has run it.
func (p *stmtPool) take(ctx context.Context, query string) (*keptStmt, error) {
	p.mu.Lock()
	if e, ok := p.byKey[query]; ok {
		p.lru.MoveToFront(e)
		k := e.Value.(*keptStmt)
		k.users++
		p.mu.Unlock()
		return k, nil
	}
	p.mu.Unlock()
	// Prepared outside the lock: on the readers' pool it may wait for a
	// connection. Two callers may prepare one text at once; the later keeps
	// the earlier's and closes its own.
	p.prepares.Add(1)
	st, err := p.on.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.byKey[query]; ok {
		p.lru.MoveToFront(e)
		go st.Close()
		k := e.Value.(*keptStmt)
		k.users++
		return k, nil
	}
	k := &keptStmt{query: query, stmt: st, users: 1}
	p.byKey[query] = p.lru.PushFront(k)
	if p.lru.Len() > stmtCacheSize {
		old := p.lru.Remove(p.lru.Back()).(*keptStmt)
		delete(p.byKey, old.query)
		old.evicted = true
		if old.users == 0 {
			// Closed apart: Close waits for the rows still open on it.
			go old.stmt.Close()
		}
	}
	return k, nil
}

func (p *stmtPool) put(k *keptStmt) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k.users--
	if k.evicted && k.users == 0 {
		go k.stmt.Close()
	}
}

func (p *stmtPool) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for e := p.lru.Front(); e != nil; e = e.Next() {
		_ = e.Value.(*keptStmt).stmt.Close()
	}
	p.lru.Init()
	clear(p.byKey)
}

func (p *stmtPool) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	return p.on.PrepareContext(ctx, query)
}

func (p *stmtPool) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	k, err := p.take(ctx, query)
	if err != nil {
		return nil, err
	}
	defer p.put(k)
	return k.stmt.ExecContext(ctx, args...)
}

func (p *stmtPool) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	k, err := p.take(ctx, query)
	if err != nil {
		return nil, err
	}
	defer p.put(k)
	return k.stmt.QueryContext(ctx, args...)
}

func (p *stmtPool) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	k, err := p.take(ctx, query)
	if err != nil {
		// A *sql.Row carrying err cannot be made outside database/sql:
		// the connection's own QueryRow answers the same error.
		return p.on.QueryRowContext(ctx, query, args...)
	}
	defer p.put(k)
	return k.stmt.QueryRowContext(ctx, args...)
}

// GetDBConn answers the *sql.DB under the pool (GORM's DB()).
func (p *stmtPool) GetDBConn() (*sql.DB, error) { return p.db, nil }

// BeginTx begins a transaction on the readers' pool, as database/sql's
// (its statements are not kept). Write transactions are the writer's
// (writerPool.BeginTx, DB.Tx).
func (p *stmtPool) BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error) {
	return p.db.BeginTx(ctx, opts)
}

// writerPool is the writer's stmtPool: its transactions are statements on
// its one connection.
type writerPool struct{ *stmtPool }

// BeginTx takes the write lock up front (IMMEDIATE), as the DSN's _txlock
// did for database/sql's transactions: two writers queue on busy_timeout
// instead of deadlocking on a lock upgrade.
func (w writerPool) BeginTx(ctx context.Context, _ *sql.TxOptions) (gorm.ConnPool, error) {
	_, err := w.ExecContext(ctx, "BEGIN IMMEDIATE")
	if err != nil && strings.Contains(err.Error(), "within a transaction") {
		// A transaction a failed ROLLBACK left open: end it, once.
		_, _ = w.on.ExecContext(context.Background(), "ROLLBACK")
		_, err = w.ExecContext(ctx, "BEGIN IMMEDIATE")
	}
	if err != nil {
		return nil, err
	}
	return &writerTx{w.stmtPool}, nil
}

// writerTx is a transaction on the writer's connection: its statements are
// the pool's, and Commit and Rollback end it. They run without the
// caller's context: a cancelled context must not leave it open.
type writerTx struct{ *stmtPool }

func (t *writerTx) Commit() error {
	if _, err := t.ExecContext(context.Background(), "COMMIT"); err != nil {
		// A COMMIT that failed (SQLITE_BUSY) leaves the transaction open.
		_ = t.Rollback()
		return err
	}
	return nil
}

func (t *writerTx) Rollback() error {
	_, err := t.ExecContext(context.Background(), "ROLLBACK")
	if err != nil && strings.Contains(err.Error(), "no transaction is active") {
		// SQLite already rolled it back (a full disk, an I/O error).
		return nil
	}
	return err
}
