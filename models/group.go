package models

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"gorm.io/gorm"

	"github.com/nodeward/nodeward/fleet"
)

// groupCommit runs the fleet's concurrent transactions as one, on both
// dialects: whoever arrives while no commit is under way leads, takes every
// waiting request and runs them back to back in one database transaction,
// each in its own savepoint, then commits once; requests arriving meanwhile
// wait for the next batch, led by the first of them. An idle store adds no
// delay (a lone request is its own batch, with no savepoint); a busy one
// pays one commit (one fsync) per batch instead of one per request.
//
// Postgres: the batch's cross-replica notifications go out in one
// statement just before its commit (see flushNotes). A batch holds the row
// locks of all its requests until it commits, so it may meet another
// writer (the lease renewals, another replica's batch) in the opposite
// order; Postgres then refuses one statement of one side with a deadlock.
// That statement's request alone is rolled back (to its savepoint), and
// once the batch has committed it runs again in a transaction of its own,
// so a deadlock costs a retry, never an error to the caller. A request
// runs again only when its own statement was refused: it changed nothing.
type groupCommit struct {
	store *FleetStore

	mu       sync.Mutex // guards the following
	pending  []*groupReq
	flushing bool
}

type groupReq struct {
	fn    func(fleet.Tx) error
	notes []fleet.Notification
	// pg are the payloads of this request's notifications to announce to
	// the other replicas (Postgres), sent with the batch's commit.
	pg []string
	// audit are this request's node audit rows, written with the batch
	// (flushAudit).
	audit []NodeAudit
	err   error
	tries int           // runs again after a deadlock
	done  chan struct{} // closed when err is final
	lead  chan struct{} // signalled when this request must lead the next batch
}

// maxBatch bounds one batch, so a commit never waits on an unbounded list.
const maxBatch = 128

// maxTries bounds the runs again of a request refused by deadlocks.
const maxTries = 5

func (g *groupCommit) do(ctx context.Context, fn func(fleet.Tx) error) error {
	r := &groupReq{fn: fn, done: make(chan struct{}), lead: make(chan struct{}, 1)}
	g.mu.Lock()
	g.pending = append(g.pending, r)
	leader := !g.flushing
	g.flushing = true
	g.mu.Unlock()
	if leader {
		g.runNext(ctx)
	}
	for {
		select {
		case <-r.done:
			return r.err
		case <-r.lead:
			g.runNext(ctx)
		}
	}
}

// runNext runs one batch, then hands the lead to the first request still
// waiting (or stands down).
func (g *groupCommit) runNext(ctx context.Context) {
	g.mu.Lock()
	n := min(len(g.pending), maxBatch)
	batch := append([]*groupReq(nil), g.pending[:n]...)
	g.pending = g.pending[n:]
	g.mu.Unlock()

	g.run(context.WithoutCancel(ctx), batch)

	g.mu.Lock()
	if len(g.pending) > 0 {
		g.pending[0].lead <- struct{}{}
	} else {
		g.flushing = false
	}
	g.mu.Unlock()
}

func (g *groupCommit) run(ctx context.Context, batch []*groupReq) {
	s := g.store
	single := len(batch) == 1
	err := s.db.Tx(ctx, func(tx *gorm.DB) error {
		for i, r := range batch {
			r.notes, r.pg, r.audit, r.err = nil, nil, nil, nil
			t := &fleetTx{fleetReader: fleetReader{g: tx, dialect: s.dialect, batched: !single}, store: s, notes: &r.notes, pg: &r.pg,
				audit: &r.audit}
			if single {
				if err := r.fn(t); err != nil {
					r.err = err
					return err
				}
				continue
			}
			sp := fmt.Sprintf("g%d", i)
			if err := tx.SavePoint(sp).Error; err != nil {
				return err
			}
			if err := r.fn(t); err != nil {
				r.err, r.notes, r.pg, r.audit = err, nil, nil, nil
				if rerr := tx.RollbackTo(sp).Error; rerr != nil {
					return rerr
				}
			}
		}
		if err := flushAudit(tx, batch); err != nil {
			return err
		}
		return s.flushNotes(tx, batch)
	})
	var notes []fleet.Notification
	var again []*groupReq
	for _, r := range batch {
		if err != nil && r.err == nil {
			r.err = err // the commit failed: nothing of the batch happened
		}
		if r.err == nil {
			notes = append(notes, r.notes...)
		} else if (single || err == nil) && lockConflict(r.err) && r.tries < maxTries {
			again = append(again, r)
		}
	}
	if len(notes) > 0 && s.onCommit != nil {
		s.onCommit(notes)
	}
	for _, r := range batch {
		if !contains(again, r) {
			close(r.done)
		}
	}
	// Requests refused by a deadlock with another writer run again, each
	// alone: a batch of one takes its locks in its own order and waits.
	for _, r := range again {
		r.tries++
		g.run(ctx, []*groupReq{r})
	}
}

func contains(rs []*groupReq, r *groupReq) bool {
	for _, x := range rs {
		if x == r {
			return true
		}
	}
	return false
}

// lockConflict reports Postgres refusing a statement for a deadlock or a
// serialization failure: the statement changed nothing and may run again.
func lockConflict(err error) bool {
	var coded interface{ SQLState() string }
	if !errors.As(err, &coded) {
		return false
	}
	switch coded.SQLState() {
	case "40P01", "40001":
		return true
	}
	return false
}

// flushAudit writes the node audit rows of the batch's requests that
// succeeded, in their order, in one statement (a few for a very large
// batch): an audit row is only ever read after its transaction commits, so
// it need not be written where it was recorded, and a batch pays one round
// trip for it instead of one per request.
func flushAudit(tx *gorm.DB, batch []*groupReq) error {
	var rows []NodeAudit
	for _, r := range batch {
		if r.err == nil {
			rows = append(rows, r.audit...)
		}
	}
	if len(rows) == 0 {
		return nil
	}
	// 1,000 rows of 5 columns stay far below either dialect's bound on
	// statement parameters.
	return tx.CreateInBatches(&rows, 1000).Error
}

// flushNotes sends the batch's cross-replica notifications (Postgres) in
// one statement inside its transaction, so they are delivered when, and
// only if, it commits: one round trip per batch however many requests
// announced something. Postgres folds identical payloads of a transaction.
func (s *FleetStore) flushNotes(tx *gorm.DB, batch []*groupReq) error {
	if s.dialect != Postgres {
		return nil
	}
	var vals []string
	args := []any{s.channel}
	for _, r := range batch {
		if r.err != nil {
			continue
		}
		for _, p := range r.pg {
			vals = append(vals, "(CAST(? AS text))")
			args = append(args, p)
		}
	}
	if len(vals) == 0 {
		return nil
	}
	return tx.Exec(`SELECT pg_notify(?, v.p) FROM (VALUES `+strings.Join(vals, ", ")+`) AS v(p)`, args...).Error
}
