package models

import (
	"context"
	"time"

	"gorm.io/gorm"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/dbtime"
)

// Settlements are most of what a busy Postgres store writes: every result
// an agent reports is one. Each used to be its own statement inside the
// group commit's batch, so a batch of fifty results paid fifty round trips
// and fifty statement starts (42 % of Postgres's statement time in the
// deliver profile, docs/profiles/2026-12-05-…). A settlement needs nothing
// but its own lists, so a batch sends all of its settlements as one
// statement (settleSet) before its other requests, and hands each request
// the rows that are its own.

// settleReq is a request that is one node's settlement (FleetStore.Settle)
// and, once run, what it found.
type settleReq struct {
	nodeID string
	at     time.Time
	ss     []fleet.Settlement

	found []fleet.SettleFound
	left  bool
	// merged: the batch's shared statement ran it (mergeSettlements), so
	// the request's own fn does not run.
	merged bool
}

// maxMergedSettlements bounds the settlements one shared statement
// carries; a request past it runs its own.
const maxMergedSettlements = 128

// Settle implements fleet.Store: Tx.SettlePending in a transaction of its
// own, which on Postgres shares one statement with the other settlements
// of its batch.
func (s *FleetStore) Settle(ctx context.Context, nodeID string, at time.Time, ss []fleet.Settlement) ([]fleet.SettleFound, bool, error) {
	if len(ss) == 0 {
		return nil, false, nil
	}
	sr := &settleReq{nodeID: nodeID, at: dbtime.Norm(at), ss: ss}
	r := &groupReq{ctx: ctx, settle: sr, fn: func(tx fleet.Tx) error {
		var err error
		sr.found, sr.left, err = tx.SettlePending(ctx, nodeID, sr.at, ss)
		return err
	}}
	if err := s.group.enqueue(ctx, r); err != nil {
		return nil, false, err
	}
	return sr.found, sr.left, nil
}

// settlementsOnly reports a batch that is settlements alone, every one of
// which mergeSettlements puts in its one statement.
func settlementsOnly(batch []*groupReq) bool {
	n := 0
	owner := map[string]int{}
	for i, r := range batch {
		if r.settle == nil || anyOwned(owner, r.settle.ss) {
			return false
		}
		for _, s := range r.settle.ss {
			owner[s.OperationID] = i
		}
		n += len(r.settle.ss)
	}
	return n <= maxMergedSettlements
}

// settleOutsideTx runs an optimistic batch of settlements only (Postgres,
// settlementsOnly) as their shared statement outside a transaction: one
// statement is atomic by itself, so BEGIN and COMMIT around it were two
// round trips more, and the lane's connection held between them, for
// nothing (BENCHMARKS.md, thirty-third sitting). Its outcomes are the
// transaction's: a failure fails every request and nothing of it
// happened. No request strays (mergeSettlements' check of the route):
// straying guards the locks a transaction keeps from one statement to the
// next, and this statement keeps none past its end, so a lane it waits on,
// or that waits on it, waits for a statement that finishes. A deadlock
// with another replica fails it whole, as in a transaction, and it runs
// again.
func (g *groupCommit) settleOutsideTx(ctx context.Context, batch []*groupReq) error {
	db := g.store.db.WithContext(ctx)
	err := g.mergeSettlements(db, batch, g.requestTxs(db, nil, batch))
	if err != nil && len(batch) > 1 {
		return errRequestFailed
	}
	return err
}

// mergeSettlements runs the settlements of an optimistic batch (no
// savepoints) in one statement, first in the batch, and marks each request
// it ran (settleReq.merged); txs are the requests' transactions.
//
// Running them first answers every request as some order of their
// arrival would have: a result names a command its agent received, so
// one committed before this batch; a request of the same node ahead of it
// in the batch (a retirement, a re-enrollment) had not been answered
// either, so the two were concurrent; and a request settling an operation
// id already in the statement (the same result posted twice at once) is
// left out to run in its turn, after, and find it settled.
//
// A failure is every merged request's: the batch then runs again with
// savepoints, each settlement in its own statement, and one refused for
// a lock (a deadlock with another replica, a stray) runs alone in the
// exclusive lane, as any request.
func (g *groupCommit) mergeSettlements(tx *gorm.DB, batch []*groupReq, txs []*fleetTx) error {
	var set settleSet
	owner := map[string]int{} // operation id → its request in batch
	var merged []int
	for i, r := range batch {
		sr := r.settle
		if sr == nil || set.n+len(sr.ss) > maxMergedSettlements || anyOwned(owner, sr.ss) {
			continue
		}
		for _, s := range sr.ss {
			owner[s.OperationID] = i
		}
		set.add(sr.nodeID, sr.at, sr.ss)
		merged = append(merged, i)
		sr.found, sr.left = sr.found[:0], false
	}
	if len(merged) == 0 {
		return nil
	}
	err := set.run(tx, func(row settleRow) {
		i := owner[row.OperationID]
		sr := batch[i].settle
		sr.found = append(sr.found, row.SettleFound)
		sr.left = row.pendingLeft
		txs[i].noteEnded(row)
	})
	if err == nil {
		// As SettlePending: a command of another lane's node was locked.
		for _, i := range merged {
			for _, f := range batch[i].settle.found {
				if err = txs[i].stray(f.NodeID); err != nil {
					batch[i].err = err
					break
				}
			}
			if err != nil {
				break
			}
		}
	} else {
		for _, i := range merged {
			batch[i].err = err
		}
	}
	if err != nil {
		return err
	}
	for _, i := range merged {
		batch[i].settle.merged = true
	}
	g.stats.settleStatements.Add(1)
	g.stats.settlesMerged.Add(int64(len(merged)))
	return nil
}

// anyOwned reports whether an operation of ss is already in the set.
func anyOwned(owner map[string]int, ss []fleet.Settlement) bool {
	for _, s := range ss {
		if _, ok := owner[s.OperationID]; ok {
			return true
		}
	}
	return false
}
