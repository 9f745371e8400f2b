package models

import (
	"context"
	"fmt"
	"sync"

	"gorm.io/gorm"

	"github.com/nodeward/nodeward/fleet"
)

// groupCommit runs the fleet's concurrent transactions as one: whoever
// arrives while no commit is under way leads, takes every waiting request
// and runs them back to back in one database transaction, each in its own
// savepoint, then commits once; requests arriving meanwhile wait for the
// next batch, led by the first of them. An idle store adds no delay (a lone
// request is its own batch, with no savepoint); a busy one pays one commit
// (one fsync) per batch instead of one per request.
type groupCommit struct {
	store *FleetStore

	mu       sync.Mutex // guards the following
	pending  []*groupReq
	flushing bool
}

type groupReq struct {
	fn    func(fleet.Tx) error
	notes []fleet.Notification
	err   error
	done  chan struct{} // closed when err is final
	lead  chan struct{} // signalled when this request must lead the next batch
}

// maxBatch bounds one batch, so a commit never waits on an unbounded list.
const maxBatch = 128

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
			r.notes, r.err = nil, nil
			t := &fleetTx{fleetReader: fleetReader{g: tx, dialect: s.dialect, batched: !single}, store: s, notes: &r.notes}
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
				r.err, r.notes = err, nil
				if rerr := tx.RollbackTo(sp).Error; rerr != nil {
					return rerr
				}
			}
		}
		return nil
	})
	var notes []fleet.Notification
	for _, r := range batch {
		if err != nil && r.err == nil {
			r.err = err // the commit failed: nothing of the batch happened
		}
		if r.err == nil {
			notes = append(notes, r.notes...)
		}
	}
	if len(notes) > 0 && s.onCommit != nil {
		s.onCommit(notes)
	}
	for _, r := range batch {
		close(r.done)
	}
}
