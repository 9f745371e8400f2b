package models

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sync/atomic"
)

// fairPool is the Postgres pool as GORM sees it: statements outside a
// transaction take their connections in the order they asked.
//
// database/sql hands a freed connection to a random waiter
// (connRequestSet.TakeRandom). With a few waiters that is harmless; with
// hundreds (a bring-up of thousands of agents, every new poll reading its
// node while the machine is saturated) a waiter's chance per handout is
// 1/N, so some wait many times the mean: measured, three replicas under
// 336 concurrent enrollments answered 0.4–2 % of them after more than 4 s
// against a median of 0.4 s. Here at most one statement at
// a time waits inside database/sql (turn); the others queue on the
// channel, whose blocked senders are served first come, first served.
//
// Transactions bypass the queue (BeginTx): each is a group commit's
// batch (many requests) or a short administrative write, and it competes
// only with the one statement holding the turn, so it is served almost
// at once.
type fairPool struct {
	db   *sql.DB
	turn chan struct{}
	// asked counts the statements that asked for a connection (tests).
	asked atomic.Int64
}

func newFairPool(db *sql.DB) *fairPool {
	return &fairPool{db: db, turn: make(chan struct{}, 1)}
}

// conn waits its turn, then for a connection of the pool.
func (p *fairPool) conn(ctx context.Context) (*sql.Conn, error) {
	p.asked.Add(1)
	select {
	case p.turn <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-p.turn }()
	return p.db.Conn(ctx)
}

// retried runs fn on a connection taken in turn; a connection found
// broken before the statement was sent (driver.ErrBadConn, as after a
// database restart) is dropped and fn runs once more on another, as
// database/sql's own pool would.
func retried[T any](ctx context.Context, p *fairPool, fn func(c *sql.Conn) (T, error)) (T, *sql.Conn, error) {
	var zero T
	for attempt := 0; ; attempt++ {
		c, err := p.conn(ctx)
		if err != nil {
			return zero, nil, err
		}
		v, err := fn(c)
		if err == nil {
			return v, c, nil
		}
		_ = c.Close() // a broken connection was already discarded
		if attempt > 0 || !errors.Is(err, driver.ErrBadConn) {
			return zero, nil, err
		}
	}
}

func (p *fairPool) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	res, c, err := retried(ctx, p, func(c *sql.Conn) (sql.Result, error) { return c.ExecContext(ctx, query, args...) })
	if err != nil {
		return nil, err
	}
	return res, c.Close()
}

func (p *fairPool) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	rows, c, err := retried(ctx, p, func(c *sql.Conn) (*sql.Rows, error) { return c.QueryContext(ctx, query, args...) })
	if err != nil {
		return nil, err
	}
	// The connection goes back to the pool when the caller closes the
	// rows: Close waits for that.
	go func() { _ = c.Close() }()
	return rows, nil
}

// QueryRowContext runs on the pool as it is: only GORM's Row() asks for a
// *sql.Row, which carries its error to Scan (no retry could be made here),
// and no path of this server's uses it.
func (p *fairPool) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return p.db.QueryRowContext(ctx, query, args...)
}

// PrepareContext prepares on the pool: a statement of the pool takes a
// connection each time it runs.
func (p *fairPool) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	return p.db.PrepareContext(ctx, query)
}

// BeginTx bypasses the queue (see fairPool).
func (p *fairPool) BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error) {
	return p.db.BeginTx(ctx, opts)
}

// GetDBConn answers the pool itself (GORM's DB(): stats, Ping, Close).
func (p *fairPool) GetDBConn() (*sql.DB, error) { return p.db, nil }
