package fleet

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/nodeward/nodeward/metrics"
)

// leaseBatcher coalesces lease renewals into group commits: every heartbeat
// and held long-poll asks for a renewal, and one transaction a flush
// interval writes them all. A heartbeat's answer waits for the commit that
// holds it (so an acknowledged heartbeat is durable); a long-poll's renewal
// does not wait, and is skipped while the lease was renewed recently
// (DECISIONS.md §8), so an idle agent costs no write per poll.
type leaseBatcher struct {
	store    Store
	settings Settings
	now      func() time.Time
	metrics  *metrics.Metrics
	log      *slog.Logger
	kick     chan struct{}

	mu      sync.Mutex // guards the following
	pending map[string]LeaseRenewal
	// flush is the flush the pending renewals will ride, made when a
	// heartbeat first waits on it (a held poll's renewal waits for none).
	flush *flushResult
	// renewed is, per node, the end of the lease this replica last wrote.
	renewed map[string]time.Time

	// batch is the run loop's own, reused by every flush so renewing the
	// held polls allocates nothing here once its capacity is reached.
	batch []LeaseRenewal
}

// flushResult is closed once its batch has been written.
type flushResult struct {
	done chan struct{}
	err  error
}

func newLeaseBatcher(store Store, st Settings, now func() time.Time, m *metrics.Metrics, log *slog.Logger) *leaseBatcher {
	return &leaseBatcher{store: store, settings: st, now: now, metrics: m, log: log,
		kick:    make(chan struct{}, 1),
		pending: map[string]LeaseRenewal{}, renewed: map[string]time.Time{}}
}

// heartbeat queues a renewal (with facts, if any) and waits for its commit.
func (b *leaseBatcher) heartbeat(ctx context.Context, r LeaseRenewal) error {
	b.mu.Lock()
	if old, ok := b.pending[r.NodeID]; ok {
		r = mergeRenewal(old, r)
	}
	b.pending[r.NodeID] = r
	if b.flush == nil {
		b.flush = &flushResult{done: make(chan struct{})}
	}
	f := b.flush
	b.mu.Unlock()
	select {
	case <-f.done:
		return f.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// mergeRenewal is the renewal a batch writes for a node given old, pending,
// and r, asked after it: r, with the facts an earlier heartbeat of the
// batch carried if r has none, and announced if either asked to (a
// spurious announcement is cheap, a missed one is not).
func mergeRenewal(old, r LeaseRenewal) LeaseRenewal {
	switch {
	case old.Facts == nil:
	case r.Facts == nil:
		r.Facts = old.Facts
	case old.Facts.Announce && !r.Facts.Announce:
		f := *r.Facts
		f.Announce = true
		r.Facts = &f
	}
	return r
}

// touch renews the lease for an arriving long-poll that will wait up to
// wait, unless the lease last written still outlasts that wait by the
// margin (leaseMargin) — the poll's end, when the agent polls again at
// once and this is asked anew; it does not wait for the commit.
//
// The margin is what a node held poll after poll may take between one
// poll's end and the next's arrival, plus what the renewal may take to be
// written, and still never go lost (the sweeper marks a node lost only
// once its lease has ended). With the defaults (a 90 s lease, the agent's
// 25 s wait) a held poll renews every second arrival, ~50 s, with 40 s of
// the lease left when it asks; a 60 s wait renews on every arrival, as the
// lease must. A poll that does not wait (wait 0) renews once its lease is
// down to two thirds: when its agent asks next is unknown.
//
// A margin of a ninth (10 s) renewed every third arrival instead, with
// 15 s left: a third fewer writes, but under overload (a 50,000-agent
// bring-up on two cores, answers and commits seconds late) 25,000 leases
// lapsed, and each lapse — a sweep write, a notification, a node read on
// the next poll — added to the load that made the next one late
// (BENCHMARKS.md, tenth sitting).
func (b *leaseBatcher) touch(nodeID string, wait time.Duration) bool {
	now := b.now()
	horizon := wait + leaseMargin(b.settings.Lease)
	if wait <= 0 {
		horizon = b.settings.Lease - b.settings.Lease/3
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if until, ok := b.renewed[nodeID]; ok && until.Sub(now) >= horizon {
		return false
	}
	if _, ok := b.pending[nodeID]; ok {
		return false
	}
	b.pending[nodeID] = LeaseRenewal{NodeID: nodeID, Until: now.Add(b.settings.Lease)}
	return true
}

// leaseMargin is how much of a lease a held poll's renewal keeps beyond
// the poll's wait: a third of the lease (30 s of the default 90 s). It is
// the server's coalesced renewal, not the agent's heartbeat, whose facts
// come at least every third of the lease (DECISIONS.md §8).
func leaseMargin(lease time.Duration) time.Duration { return lease / 3 }

// forget drops the coalescing memory for a node (re-enrolled or retired).
func (b *leaseBatcher) forget(nodeID string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.renewed, nodeID)
}

func (b *leaseBatcher) run(ctx context.Context) {
	t := time.NewTicker(b.settings.LeaseFlushInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			// Write what was asked before stopping, so a drained server
			// loses no acknowledged heartbeat.
			b.flushOnce(context.WithoutCancel(ctx))
			return
		case <-t.C:
		case <-b.kick:
		}
		b.flushOnce(ctx)
	}
}

// flushOnce writes the pending batch in one commit.
func (b *leaseBatcher) flushOnce(ctx context.Context) {
	b.mu.Lock()
	if len(b.pending) == 0 {
		b.mu.Unlock()
		return
	}
	batch := b.batch[:0]
	for _, r := range b.pending {
		batch = append(batch, r)
	}
	b.batch = batch
	f := b.flush
	clear(b.pending) // keeps its buckets for the next batch
	b.flush = nil
	b.mu.Unlock()

	_, err := b.store.RenewLeases(ctx, batch)
	if err != nil {
		b.log.Error("lease renewal batch", "err", err, "size", len(batch))
	} else {
		now := b.now()
		b.mu.Lock()
		for _, r := range batch {
			b.renewed[r.NodeID] = r.Until
		}
		// Bound the memory: leases already ended are useless.
		if len(b.renewed) > 4*len(batch)+1024 {
			for id, until := range b.renewed {
				if until.Before(now) {
					delete(b.renewed, id)
				}
			}
		}
		b.mu.Unlock()
		// Counted once the coalescing memory knows the batch, so a reader of
		// the counter sees a consistent batcher.
		b.metrics.HeartbeatsFlushed.Add(float64(len(batch)))
	}
	clear(batch) // drop the facts' references until the next flush
	if f != nil {
		f.err = err
		close(f.done)
	}
}
