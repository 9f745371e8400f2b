// Package sqlcount counts what a database/sql pool sends: statements,
// transactions begun, commits and rollbacks, and statements run outside a
// transaction (each its own commit on Postgres). Its counts are the
// machine-independent measure of the write path (commits and round trips
// per settled command); wall-clock figures depend on the machine, these do
// not. Wrap a driver.Connector with Counter.Wrap and open the pool with
// sql.OpenDB.
package sqlcount

import (
	"context"
	"database/sql/driver"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

// Counts is a snapshot of a Counter.
type Counts struct {
	// Statements is every statement sent (each one round trip).
	Statements int64
	// Begins and Commits are explicit transactions begun and committed;
	// Rollbacks those rolled back.
	Begins, Commits, Rollbacks int64
	// AutoCommits are statements sent outside a transaction: each is a
	// transaction of its own, committed by the server.
	AutoCommits int64
	// Notifies are statements sent outside a transaction that only notify
	// (SELECT pg_notify(…)), counted apart from the others: the server
	// commits each as a transaction, but it writes no WAL and flushes
	// nothing, and the requests whose changes it announces answered
	// without waiting for it (models' announcer).
	Notifies int64
}

// RoundTrips is every exchange with the server: statements, BEGINs,
// COMMITs and ROLLBACKs.
func (c Counts) RoundTrips() int64 { return c.Statements + c.Begins + c.Commits + c.Rollbacks }

// Transactions is what the server counts as committed transactions
// (pg_stat_database.xact_commit): explicit commits and autocommitted
// statements.
func (c Counts) Transactions() int64 { return c.Commits + c.AutoCommits }

// Sub answers c − o.
func (c Counts) Sub(o Counts) Counts {
	return Counts{Statements: c.Statements - o.Statements, Begins: c.Begins - o.Begins, Commits: c.Commits - o.Commits,
		Rollbacks: c.Rollbacks - o.Rollbacks, AutoCommits: c.AutoCommits - o.AutoCommits, Notifies: c.Notifies - o.Notifies}
}

// Add answers c + o.
func (c Counts) Add(o Counts) Counts {
	return Counts{Statements: c.Statements + o.Statements, Begins: c.Begins + o.Begins, Commits: c.Commits + o.Commits,
		Rollbacks: c.Rollbacks + o.Rollbacks, AutoCommits: c.AutoCommits + o.AutoCommits, Notifies: c.Notifies + o.Notifies}
}

// Counter counts the exchanges of every connection it wraps.
type Counter struct {
	statements, begins, commits, rollbacks, auto, notifies atomic.Int64

	mu    sync.Mutex
	bySQL map[string]int64 // statement text (first line, trimmed) → count
}

// Snapshot answers the counts so far.
func (c *Counter) Snapshot() Counts {
	return Counts{Statements: c.statements.Load(), Begins: c.begins.Load(), Commits: c.commits.Load(),
		Rollbacks: c.rollbacks.Load(), AutoCommits: c.auto.Load(), Notifies: c.notifies.Load()}
}

// Texts answers how often each statement was sent since the last call,
// most frequent first, and starts counting afresh.
func (c *Counter) Texts() []TextCount {
	c.mu.Lock()
	m := c.bySQL
	c.bySQL = nil
	c.mu.Unlock()
	out := make([]TextCount, 0, len(m))
	for s, n := range m {
		out = append(out, TextCount{SQL: s, N: n})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].N != out[j].N {
			return out[i].N > out[j].N
		}
		return out[i].SQL < out[j].SQL
	})
	return out
}

// TextCount is one statement text and how often it was sent.
type TextCount struct {
	SQL string
	N   int64
}

func (c *Counter) statement(query string, inTx bool) {
	q := strings.Join(strings.Fields(query), " ")
	switch {
	case !inTx && strings.HasPrefix(q, "SELECT pg_notify("):
		c.notifies.Add(1)
	case !inTx:
		c.statements.Add(1)
		c.auto.Add(1)
	default:
		c.statements.Add(1)
	}
	if len(q) > 90 {
		q = q[:90]
	}
	c.mu.Lock()
	if c.bySQL == nil {
		c.bySQL = map[string]int64{}
	}
	c.bySQL[q]++
	c.mu.Unlock()
}

// Wrap answers a connector whose connections are counted by c.
func (c *Counter) Wrap(inner driver.Connector) driver.Connector {
	return &connector{inner: inner, c: c}
}

type connector struct {
	inner driver.Connector
	c     *Counter
}

func (k *connector) Connect(ctx context.Context) (driver.Conn, error) {
	cn, err := k.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &conn{Conn: cn, c: k.c}, nil
}

func (k *connector) Driver() driver.Driver { return k.inner.Driver() }

// conn forwards to the driver's connection; database/sql uses one
// connection from one goroutine at a time, so inTx needs no lock.
type conn struct {
	driver.Conn
	c    *Counter
	inTx bool
}

func (cn *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	cn.c.begins.Add(1)
	tx, err := cn.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	cn.inTx = true
	return &txn{Tx: tx, cn: cn}, nil
}

func (cn *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	cn.c.statement(query, cn.inTx)
	return cn.Conn.(driver.ExecerContext).ExecContext(ctx, query, args)
}

func (cn *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	cn.c.statement(query, cn.inTx)
	return cn.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
}

func (cn *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	st, err := cn.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return &stmt{Stmt: st, cn: cn, query: query}, nil
}

func (cn *conn) Ping(ctx context.Context) error {
	if p, ok := cn.Conn.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

func (cn *conn) ResetSession(ctx context.Context) error {
	cn.inTx = false
	if r, ok := cn.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (cn *conn) IsValid() bool {
	if v, ok := cn.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

func (cn *conn) CheckNamedValue(nv *driver.NamedValue) error {
	if ch, ok := cn.Conn.(driver.NamedValueChecker); ok {
		return ch.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

type txn struct {
	driver.Tx
	cn *conn
}

func (t *txn) Commit() error {
	t.cn.inTx = false
	t.cn.c.commits.Add(1)
	return t.Tx.Commit()
}

func (t *txn) Rollback() error {
	t.cn.inTx = false
	t.cn.c.rollbacks.Add(1)
	return t.Tx.Rollback()
}

type stmt struct {
	driver.Stmt
	cn    *conn
	query string
}

func (s *stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	s.cn.c.statement(s.query, s.cn.inTx)
	return s.Stmt.(driver.StmtExecContext).ExecContext(ctx, args)
}

func (s *stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	s.cn.c.statement(s.query, s.cn.inTx)
	return s.Stmt.(driver.StmtQueryContext).QueryContext(ctx, args)
}
