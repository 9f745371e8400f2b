package models

import (
	"context"
	"errors"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/nodeward/nodeward/fleet"
)

// groupCommit runs the fleet's concurrent transactions as one, on both
// dialects: whoever arrives while no commit is under way leads, takes every
// waiting request and runs them back to back in one database transaction,
// each in its own savepoint (only once one of them has failed: see run),
// then commits once; requests arriving meanwhile
// wait for the next batch, led by the first of them. An idle store adds no
// delay (a lone request is its own batch, with no savepoint); a busy one
// pays one commit (one fsync) per batch instead of one per request.
//
// Lanes (Postgres). One batch at a time makes the stream's round trips
// the bound, so a Postgres store runs several batches at once, one per
// lane, each on its own connection. A request whose context names its
// node (fleet.TxRoute) goes to the lane of that node (a hash of its id),
// one that names an operation of no node (a fan-out's parent,
// fleet.OnOperation) to the lane of that operation; every other request —
// many nodes (releasing a fan-out's held children), no node (the
// dispatcher, the sweep) — goes to the exclusive lane, whose batches run
// while no other lane's does (gate). Within a replica two lanes then never
// wait on each other's rows:
//
//   - a node's rows (the node, its commands and their operations, its
//     configuration, invitations and advisory key) are locked only by the
//     lane of that node or by the exclusive lane, which runs alone; so is
//     a fan-out parent's row, by its own lane (a fan-out's children are
//     new rows when its lane inserts them, and their nodes' rows after);
//   - the one lock a routed request may take besides, a package host's
//     quota key (TxRoute.Shared), is taken by every lane in one order: a
//     lane runs its batch sorted by (shared key, node id), so such keys
//     are taken in ascending order and waits between lanes form no cycle;
//   - a request that strays from its route (locks another lane's node or
//     an unnamed shared key; fleetTx.stray) is rolled back to its
//     savepoint at once — having waited on nothing it had not been routed
//     to, or having let go of what it took — and runs again in the
//     exclusive lane.
//
// A bulk request (fleet.TxRoute.Bulk: a large fan-out's first transaction,
// inserting up to 10,000 children with their documents, seconds long) is
// a batch of its own on a connection of its own, outside the gate: in its
// operation's lane it held that lane's batches back for its whole length,
// and once an exclusive request waited at the gate behind it, every
// lane's (sync.RWMutex holds new readers back behind a waiting writer).
// It locks its operation and inserts new rows only, so a lane's batch or
// the exclusive lane's can wait on it only for that operation's row (a
// cancel of it), and it waits on nobody after taking that row: no cycle.
// A lock outside its operation strays as a lane's would. At most as many
// run at once as there are lanes (bulk), so they never hold more
// connections than the lanes do.
//
// Sorting by node id also has every lane's batch lock its nodes in id
// order, as the lease renewals do, so batches of two replicas rarely meet
// in the opposite order. When they still do (two replicas' exclusive
// batches, a unique key two lanes insert, a stray caught after its lock),
// Postgres refuses one statement of one side with a deadlock: that
// statement's request alone is rolled back (to its savepoint), and once
// the batch has committed it runs again alone in the exclusive lane, so a
// deadlock costs a retry, never an error to the caller. A request runs
// again only when its own statement was refused: it changed nothing.
//
// SQLite has one writer: one lane, the exclusive one, takes everything.
//
// Postgres: the batch's cross-replica notifications go out in one
// statement just before its commit (see flushNotes); those that may follow
// the commit go to the announcer once it has committed (announce.go).
type groupCommit struct {
	store *FleetStore
	// lanes are the per-node lanes (none on SQLite or with one lane);
	// excl takes every request with no route, and the retries.
	lanes []*lane
	excl  *lane
	// bulk bounds the bulk requests running at once (len(lanes)).
	bulk chan struct{}
	// gate: a lane's batch runs under its read lock, the exclusive lane's
	// under its write lock (which also holds new lane batches back while
	// it waits: sync.RWMutex prefers the writer).
	gate sync.RWMutex

	running     atomic.Int64 // batches running now
	gateWaiting atomic.Int64 // lane batches waiting to take the gate now
	queued      atomic.Int64 // requests waiting for a batch now
	stats       groupCounters
}

// groupCounters count what the lanes did, for tests, the load tool and
// the metrics.
type groupCounters struct {
	batches, maxRunning, strays, retries, reruns atomic.Int64
	// settleStatements is how many shared settlement statements ran
	// (mergeSettlements), settlesMerged how many requests they settled.
	settleStatements, settlesMerged atomic.Int64
	// issueStatements is how many shared statements recorded submits'
	// commands ahead (mergeIssues), issuesMerged how many they recorded.
	issueStatements, issuesMerged atomic.Int64
	// exclusive is how long the exclusive lane held the gate, in
	// nanoseconds; laneWait how long lane batches waited to take it.
	exclusive, laneWait atomic.Int64
}

// GroupStats are the group commit's counters since the store was made.
type GroupStats struct {
	Lanes int // per-node lanes (0: one exclusive lane takes everything)
	// Batches is how many batches (transactions) ran; MaxRunning the most
	// that ran at once.
	Batches, MaxRunning int64
	// Strays is how many requests left their route and ran again in the
	// exclusive lane; Retries how many ran again after a deadlock.
	Strays, Retries int64
	// Reruns is how many batches ran again with savepoints because a
	// request failed in their run without (run).
	Reruns int64
	// Exclusive is how long exclusive batches ran, every lane held back
	// meanwhile (on SQLite every batch: the writer's busy time);
	// LaneGateWait how long lane batches waited for them to finish, summed
	// over the lanes.
	Exclusive, LaneGateWait time.Duration
	// Queued is how many requests wait for a batch now, over every lane.
	Queued int64
	// SettleStatements is how many statements settled the optimistic
	// batches' settlement requests (Postgres), SettlesMerged how many
	// requests they settled: the batches' settlements per statement.
	SettleStatements, SettlesMerged int64
	// IssueStatements is how many statements recorded the optimistic
	// batches' command submits ahead (Postgres), IssuesMerged how many
	// submits they recorded.
	IssueStatements, IssuesMerged int64
}

// GroupStats answers the group commit's counters.
func (s *FleetStore) GroupStats() GroupStats {
	g := s.group
	return GroupStats{Lanes: len(g.lanes), Batches: g.stats.batches.Load(), MaxRunning: g.stats.maxRunning.Load(),
		Strays: g.stats.strays.Load(), Retries: g.stats.retries.Load(), Reruns: g.stats.reruns.Load(),
		Exclusive: time.Duration(g.stats.exclusive.Load()), LaneGateWait: time.Duration(g.stats.laneWait.Load()),
		Queued: g.queued.Load(), SettleStatements: g.stats.settleStatements.Load(), SettlesMerged: g.stats.settlesMerged.Load(),
		IssueStatements: g.stats.issueStatements.Load(), IssuesMerged: g.stats.issuesMerged.Load()}
}

// lane is one queue of batches, run one at a time.
type lane struct {
	g     *groupCommit
	index int // -1: the exclusive lane; len(lanes): a bulk request's own
	bulk  bool

	// spoiled: the lane's last batch had a failed request, so the next
	// one keeps savepoints from the start (run).
	spoiled atomic.Bool

	mu sync.Mutex // guards the following
	// pending, finishing and background are the requests waiting for a
	// batch, each in arrival order; finishing holds those of
	// fleet.TxRoute.Finishing, background the other ones of
	// fleet.TxRoute.Background (take says how a batch draws on them).
	pending, finishing, background []*groupReq
	flushing                       bool
}

type groupReq struct {
	ctx   context.Context // the caller's: one that ended is not run (runNext)
	fn    func(fleet.Tx) error
	route fleet.TxRoute // zero in the exclusive lane
	// background, finishing: fleet.TxRoute.Background and Finishing, in
	// whichever lane.
	background, finishing bool
	notes                 []fleet.Notification
	// pg are the payloads of this request's notifications to announce to
	// the other replicas (Postgres), sent with the batch's commit.
	pg []string
	// after are the payloads the announcer sends once the batch has
	// committed (Postgres; see announce.go).
	after []string
	// audit are this request's node audit rows, written with the batch
	// (flushAudit).
	audit []NodeAudit
	err   error
	// strayed: the request locked outside its route (fleetTx.stray).
	strayed bool
	tries   int // runs again after a deadlock
	// settle, when not nil, is the settlement this request is: fn runs
	// it alone, or the batch runs it with others (mergeSettlements).
	settle *settleReq
	// issue, when not nil, is what this submit writes first: the batch
	// may write it ahead, with others (mergeIssues).
	issue *issueAhead
	done  chan struct{} // closed when err is final
	lead  chan struct{} // signalled when this request must lead the next batch
}

// maxBatch bounds one batch, so a commit never waits on an unbounded list.
const maxBatch = 128

// maxBackground bounds the background requests (fleet.TxRoute.Background)
// of one batch, whether or not others wait: a batch's length is what a
// write arriving meanwhile waits for. Once a fleet.configure's nodes
// shared one sealed document, a 2,000-node wave queued all its
// deliveries and reports at once; batches of 128 of them ran about a
// second each on Postgres, and a command submitted during the wave
// waited 1.1–1.3 s at the median; with 16, 0.16 s, for a wave as long
// (BENCHMARKS.md, forty-second sitting).
const maxBackground = 16

// maxTries bounds the runs again of a request refused by deadlocks.
const maxTries = 5

// DefaultWriteLanes is the number of per-node lanes for a Postgres pool
// of size pool: one per four connections, at most four, so the lanes
// leave most of the pool to reads (each lane holds one connection while
// its batch runs). Below two lanes, one exclusive lane takes everything.
func DefaultWriteLanes(pool int) int {
	return min(4, pool/4)
}

func newGroupCommit(s *FleetStore, lanes int) *groupCommit {
	g := &groupCommit{store: s}
	g.excl = &lane{g: g, index: -1}
	if s.dialect == Postgres && lanes > 1 {
		g.lanes = make([]*lane, lanes)
		for i := range g.lanes {
			g.lanes[i] = &lane{g: g, index: i}
		}
		g.bulk = make(chan struct{}, lanes)
	}
	return g
}

// laneOf answers the lane of a node among n lanes.
func laneOf(nodeID string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(nodeID))
	return int(h.Sum32() % uint32(n))
}

func (g *groupCommit) do(ctx context.Context, fn func(fleet.Tx) error) error {
	return g.enqueue(ctx, &groupReq{ctx: ctx, fn: fn})
}

// enqueue routes r to its lane and answers its outcome once final.
func (g *groupCommit) enqueue(ctx context.Context, r *groupReq) error {
	r.done, r.lead = make(chan struct{}), make(chan struct{}, 1)
	l := g.excl
	route, ok := fleet.TxRouteOf(ctx)
	r.background, r.finishing = route.Background, route.Background && route.Finishing
	if ok && len(g.lanes) > 0 {
		r.route = route
		if route.Bulk {
			g.runBulk(ctx, r)
			return r.err
		}
		l = g.lanes[laneOf(route.Key(), len(g.lanes))]
	}
	l.enqueue(ctx, r)
	return r.err
}

// runBulk runs a bulk request as a batch of its own, outside the gate (see
// groupCommit), once fewer than len(lanes) others run.
func (g *groupCommit) runBulk(ctx context.Context, r *groupReq) {
	select {
	case g.bulk <- struct{}{}:
	case <-ctx.Done():
		r.err = ctx.Err()
		close(r.done)
		return
	}
	defer func() { <-g.bulk }()
	if batch := dropEnded([]*groupReq{r}); len(batch) > 0 {
		// Its own lane index, which no node's is: every node it locks strays.
		g.runBatch(context.WithoutCancel(ctx), &lane{g: g, index: len(g.lanes), bulk: true}, batch)
	}
}

// enqueue adds r to the lane and returns once r's outcome is final,
// leading batches meanwhile when it is r's turn.
func (l *lane) enqueue(ctx context.Context, r *groupReq) {
	l.mu.Lock()
	switch {
	case r.finishing:
		l.finishing = append(l.finishing, r)
	case r.background:
		l.background = append(l.background, r)
	default:
		l.pending = append(l.pending, r)
	}
	l.g.queued.Add(1)
	leader := !l.flushing
	l.flushing = true
	l.mu.Unlock()
	if leader {
		l.runNext(ctx)
	}
	for {
		select {
		case <-r.done:
			return
		case <-r.lead:
			l.runNext(ctx)
		}
	}
}

// runNext runs one batch, then hands the lead to the first request still
// waiting (or stands down).
func (l *lane) runNext(ctx context.Context) {
	l.mu.Lock()
	batch := l.take()
	l.g.queued.Add(-int64(len(batch)))
	l.mu.Unlock()

	// A request whose caller gave up while it queued (a client that timed
	// out and closed its connection) is answered its context's error
	// instead of run: nothing of it is written, so a caller that tries
	// again finds nothing done — an enrollment whose agent gave up leaves
	// its token unspent for the agent's retry — and a saturated store
	// spends nothing on answers nobody reads. A request already running
	// finishes (WithoutCancel): its outcome is the commit's.
	batch = dropEnded(batch)
	if len(batch) > 0 {
		l.g.runBatch(context.WithoutCancel(ctx), l, batch)
	}

	l.mu.Lock()
	switch {
	case len(l.pending) > 0:
		l.pending[0].lead <- struct{}{}
	case len(l.finishing) > 0:
		l.finishing[0].lead <- struct{}{}
	case len(l.background) > 0:
		l.background[0].lead <- struct{}{}
	default:
		l.flushing = false
	}
	l.mu.Unlock()
}

// take removes the lane's next batch from its queues (l.mu held): the
// waiting requests in arrival order, and at most maxBackground background
// ones (fleet.TxRoute.Background). A fleet.configure over 10,000 nodes
// queued 3,500–5,700 deliveries and reports at once, and a command
// submitted meanwhile waited behind all of them, 2.4–3.7 s at the median
// (BENCHMARKS.md, fortieth sitting); now it waits for about the batch
// running and its own, each short. Background requests keep their share
// of each batch while they wait, so the others never starve them either.
// Within that share the finishing ones (fleet.TxRoute.Finishing: the
// wave's reports) go first: with the share first-come, a wave over
// 10,000 nodes acknowledged almost none until its last delivery, then
// every report at once (BENCHMARKS.md, forty-second sitting).
func (l *lane) take() []*groupReq {
	fin := min(len(l.finishing), maxBackground)
	bg := min(len(l.background), maxBackground-fin)
	fg := min(len(l.pending), maxBatch-fin-bg)
	batch := make([]*groupReq, 0, fg+fin+bg)
	batch = append(append(append(batch, l.pending[:fg]...), l.finishing[:fin]...), l.background[:bg]...)
	l.pending, l.finishing, l.background = l.pending[fg:], l.finishing[fin:], l.background[bg:]
	return batch
}

// dropEnded answers the batch without the requests whose caller's context
// ended, answering each of those its context's error: nothing of them ran.
func dropEnded(batch []*groupReq) []*groupReq {
	return slices.DeleteFunc(batch, func(r *groupReq) bool {
		if err := r.ctx.Err(); err != nil {
			r.err = err
			close(r.done)
			return true
		}
		return false
	})
}

// runBatch runs a lane's batch, then the requests of it that must run
// again (a deadlock, a stray), each alone in the exclusive lane.
func (g *groupCommit) runBatch(ctx context.Context, l *lane, batch []*groupReq) {
	if l.index >= 0 {
		// (shared key, node id): see groupCommit. Stable, so requests of
		// one node keep their order of arrival.
		slices.SortStableFunc(batch, func(a, b *groupReq) int {
			if c := strings.Compare(a.route.Shared, b.route.Shared); c != 0 {
				return c
			}
			return strings.Compare(a.route.Key(), b.route.Key())
		})
	}
	again := g.runGated(ctx, l, batch)
	for len(again) > 0 {
		r := again[0]
		again = again[1:]
		if r.strayed {
			g.stats.strays.Add(1)
		} else {
			r.tries++
			g.stats.retries.Add(1)
		}
		r.strayed, r.route = false, fleet.TxRoute{}
		again = append(again, g.runGated(ctx, g.excl, []*groupReq{r})...)
	}
}

// runGated runs one batch under the gate — a lane's beside the other
// lanes', the exclusive lane's alone, a bulk request's outside it — and,
// once the gate is let go, hands out its notifications and outcomes.
func (g *groupCommit) runGated(ctx context.Context, l *lane, batch []*groupReq) []*groupReq {
	unlock := g.gate.RUnlock
	switch {
	case l.bulk:
		unlock = func() {}
	case l.index >= 0:
		waitFrom := time.Now()
		g.gateWaiting.Add(1)
		g.gate.RLock()
		g.gateWaiting.Add(-1)
		g.stats.laneWait.Add(int64(time.Since(waitFrom)))
	default:
		g.gate.Lock()
		heldFrom := time.Now()
		unlock = func() {
			g.stats.exclusive.Add(int64(time.Since(heldFrom)))
			g.gate.Unlock()
		}
	}
	// The gate may have held the batch back for long (the exclusive lane
	// runs alone): requests whose caller gave up meanwhile, or whose queue
	// bound passed (an enrollment's), are not run either.
	if batch = dropEnded(batch); len(batch) == 0 {
		unlock()
		return nil
	}
	n := g.running.Add(1)
	for {
		m := g.stats.maxRunning.Load()
		if n <= m || g.stats.maxRunning.CompareAndSwap(m, n) {
			break
		}
	}
	g.stats.batches.Add(1)
	began := time.Now()
	again, finish := g.run(ctx, l, batch)
	if g.store.onBatch != nil {
		g.store.onBatch(time.Since(began))
	}
	g.running.Add(-1)
	unlock()
	finish()
	return again
}

// run runs one batch in one transaction and answers the requests that
// must run again, and what finishes the others: their notifications
// handed to the local hook, their outcomes made final (done closed).
//
// Savepoints cost a round trip per request on Postgres, most of what a
// request's turn in the batch costs beside its own statement or two; on
// SQLite each copies every page its request touches into a sub-journal
// first (a fifth of the server's CPU at saturation). So a batch first
// runs without them (optimistic): when every request succeeds — nearly always — that is the
// batch. When one fails, nothing of the batch has happened yet: the
// transaction is rolled back and the batch runs again with a savepoint per
// request, the one way failures were always kept apart; the lane then
// keeps savepoints until a batch runs clean (spoiled), so a stream of
// refusals is never paid twice.
func (g *groupCommit) run(ctx context.Context, l *lane, batch []*groupReq) ([]*groupReq, func()) {
	single := len(batch) == 1
	var refused *groupReq
	if !single && !l.spoiled.Load() {
		err := g.runTx(ctx, l, batch, false)
		if !errors.Is(err, errRequestFailed) {
			return g.outcome(batch, false, err)
		}
		g.stats.reruns.Add(1)
		// A request refused for a lock (a deadlock, a stray) runs again
		// alone, as it would have from its savepoint: the others must not
		// take the same locks again beside it.
		for i, r := range batch {
			if r.err != nil && (r.strayed || lockConflict(r.err) && r.tries < maxTries) {
				refused, batch = r, slices.Delete(slices.Clone(batch), i, i+1)
				break
			}
		}
		single = len(batch) == 1
	}
	err := g.runTx(ctx, l, batch, !single)
	if !single {
		failed := false
		for _, r := range batch {
			failed = failed || r.err != nil
		}
		l.spoiled.Store(failed)
	}
	again, finish := g.outcome(batch, single, err)
	if refused != nil {
		again = append(again, refused)
	}
	return again, finish
}

// errRequestFailed ends an optimistic batch (run) whose request failed.
var errRequestFailed = errors.New("group commit: a request of the batch failed")

// runTx runs the batch's requests in one transaction, each in its own
// savepoint or (savepoints false) with none: then the first that fails
// ends the transaction, rolled back whole (errRequestFailed for a batch).
func (g *groupCommit) runTx(ctx context.Context, l *lane, batch []*groupReq, savepoints bool) error {
	s := g.store
	single := len(batch) == 1
	if !savepoints && s.dialect == Postgres && settlementsOnly(batch) {
		return g.settleOutsideTx(ctx, batch)
	}
	return s.db.Tx(ctx, func(tx *gorm.DB) error {
		txs := g.requestTxs(tx, l, batch)
		if !savepoints && s.dialect == Postgres {
			if err := g.mergeSettlements(tx, batch, txs); err != nil {
				if !single {
					return errRequestFailed
				}
				return err
			}
			if err := g.mergeIssues(tx, batch, txs); err != nil {
				return errRequestFailed // never single: it merges two or more
			}
		}
		for i, r := range batch {
			if r.settle != nil && r.settle.merged {
				continue
			}
			t := txs[i]
			fn := func() error {
				if err := r.fn(t); err != nil {
					return err
				}
				if t.ahead != nil {
					return errAheadMismatch // written ahead, and not asked for
				}
				return t.later.send(tx) // kept back, and no statement came after it
			}
			if !savepoints {
				if err := fn(); err != nil || r.strayed {
					if err == nil {
						err = errStrayed
					}
					r.err = err
					if !single {
						return errRequestFailed
					}
					return err
				}
				continue
			}
			// One name for every request's savepoint: ROLLBACK TO names the
			// newest of that name, this request's, and one text is one
			// kept statement (pgx's cache, sqlitestmts) instead of one per
			// place in the batch.
			const sp = "g"
			if err := tx.SavePoint(sp).Error; err != nil {
				return err
			}
			if err := fn(); err != nil || r.strayed {
				if err == nil {
					err = errStrayed
				}
				r.err, r.notes, r.pg, r.after, r.audit = err, nil, nil, nil, nil
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
}

// requestTxs resets the batch's requests for a run on db and answers
// their transactions; l nil runs them unrouted (no request strays).
func (g *groupCommit) requestTxs(db *gorm.DB, l *lane, batch []*groupReq) []*fleetTx {
	s := g.store
	txs := make([]*fleetTx, len(batch))
	for i, r := range batch {
		r.notes, r.pg, r.after, r.audit, r.err, r.strayed = nil, nil, nil, nil, nil, false
		t := &fleetTx{fleetReader: fleetReader{g: db, dialect: s.dialect, batched: len(batch) > 1, later: &later{}}, store: s,
			notes: &r.notes, pg: &r.pg, after: &r.after, audit: &r.audit}
		if l != nil && l.index >= 0 {
			t.route = &txRoute{TxRoute: r.route, lane: l.index, lanes: len(g.lanes), strayed: &r.strayed}
		}
		txs[i] = t
		if r.settle != nil {
			r.settle.merged = false
		}
	}
	return txs
}

// outcome settles each request of a batch that ran (err: the
// transaction's) and answers those that must run again, and what finishes
// the others.
func (g *groupCommit) outcome(batch []*groupReq, single bool, err error) ([]*groupReq, func()) {
	s := g.store
	var notes []fleet.Notification
	var after []string
	var again []*groupReq
	for _, r := range batch {
		if err != nil && r.err == nil {
			r.err = err // the commit failed: nothing of the batch happened
		}
		if r.err == nil {
			notes = append(notes, r.notes...)
			after = append(after, r.after...)
		} else if (single || err == nil) && (r.strayed || lockConflict(r.err) && r.tries < maxTries) {
			again = append(again, r)
		}
	}
	return again, func() {
		if len(notes) > 0 && s.onCommit != nil {
			s.onCommit(notes)
		}
		s.announcer.add(after...)
		for _, r := range batch {
			if !contains(again, r) {
				close(r.done)
			}
		}
	}
}

// errStrayed refuses a lock outside a request's route: the request runs
// again in the exclusive lane (it never reaches its caller).
var errStrayed = errors.New("group commit: transaction locked outside its route")

// txRoute is a routed request's route inside its lane's batch.
type txRoute struct {
	fleet.TxRoute
	lane, lanes int
	strayed     *bool
}

// stray reports (and records) a lock of node's rows outside the route; a
// nil route (exclusive lane) never strays.
func (t *fleetTx) stray(nodeID string) error {
	if t.route == nil || laneOf(nodeID, t.route.lanes) == t.route.lane {
		return nil
	}
	*t.route.strayed = true
	return errStrayed
}

// strayAny is stray for the nodes of a batched lock.
func (t *fleetTx) strayAny(nodeIDs []string) error {
	for _, id := range nodeIDs {
		if err := t.stray(id); err != nil {
			return err
		}
	}
	return nil
}

// strayKey is stray for an advisory key: "node:<id>" is that node's, the
// route's shared key is its own, any other strays.
func (t *fleetTx) strayKey(key string) error {
	if t.route == nil {
		return nil
	}
	if id, ok := strings.CutPrefix(key, "node:"); ok {
		return t.stray(id)
	}
	if key == t.route.Shared {
		return nil
	}
	*t.route.strayed = true
	return errStrayed
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
