package main

import (
	"context"
	"fmt"
	"io"
	"math"
	neturl "net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nodeward/nodeward/models"
)

// Tail latency causes (issue 13: "tail latencies come with their cause
// when they exceed the target: GC, a batch, lock waits — say which, from a
// trace or counters"). Over the issue window the tool keeps the server's
// own counters (the Go collector's GC pauses, the lease and long-poll
// batches) and, on Postgres, samples pg_stat_activity every 100 ms for
// backends of the database waiting on a lock, on WAL or on another
// lightweight lock. When issue→receipt p99 exceeds -p99-target the report
// names the causes the counters support, strongest first.

// TailCause is the evidence about the window's tail latency.
type TailCause struct {
	TargetMS float64 `json:"target_ms"`
	Exceeded bool    `json:"exceeded"`
	// The issue side (intended issue time → the server's issued_at: the
	// issuer's queue, the request, its commit) and the delivery side
	// (issued_at → receipt: wake-up, the poll's answer), at p99.
	IssueSideP99MS    float64 `json:"issue_side_p99_ms"`
	DeliverySideP99MS float64 `json:"delivery_side_p99_ms"`
	// Go GC of the server (summed over replicas; with the server in this
	// process, the tool's too): collections, total stop-the-world pause,
	// and the longest pause (at most the total).
	GCs       float64 `json:"gc_cycles"`
	GCPauseMS float64 `json:"gc_pause_total_ms"`
	GCMaxMS   float64 `json:"gc_pause_max_ms"`
	HeapMB    float64 `json:"heap_mb"`
	// The collector's CPU over the window (assists, dedicated marking,
	// pauses: nodeward_gc_cpu_seconds_total) and the GC percent in force
	// at its end (nodeward_gc_percent: the memory policy's, or GOGC's).
	GCCPUSeconds float64 `json:"gc_cpu_seconds"`
	GCPercent    float64 `json:"gc_percent"`
	MachineBus   float64 `json:"machine_busy"`
	// Batches during the window: lease renewals flushed (renewals, not
	// their batches), lease sweeps, long-poll store queries (a wake-up's
	// read).
	RenewalsFlushed float64 `json:"lease_renewals_flushed"`
	LeaseSweeps     float64 `json:"lease_sweeps"`
	PollStoreReads  float64 `json:"long_poll_store_queries"`
	PollReadsSkip   float64 `json:"long_poll_due_reads_skipped"` // checks answered from the replica's knowledge that the node is quiet
	NodeCacheHits   float64 `json:"node_lookups_hit"`            // agent requests' node checks answered from the replica's node cache
	NodeReads       float64 `json:"node_lookups_store"`          // ... and by a read of the node
	CredReads       float64 `json:"credential_lookups_store"`    // API authentications that read the store (the issuers' token past its cache entry)
	CredShared      float64 `json:"credential_lookups_shared"`   // ... answered by a concurrent request's read instead
	PollRenewals    float64 `json:"long_poll_lease_renewals"`    // renewals queued by arriving polls (the rest of the flushed ones are heartbeats)
	Redeliveries    float64 `json:"redeliveries"`
	// The server's database pool (go_sql_*, db_name "pool"): waits for a
	// connection over the window and their total time.
	PoolWaits  float64 `json:"db_pool_waits"`
	PoolWaitMS float64 `json:"db_pool_wait_ms"`
	// The write path: the share of the window exclusive batches held every
	// lane back (summed over replicas; on SQLite the writer's busy share),
	// and the lanes' wait behind them.
	WriteExclusiveShare float64 `json:"write_exclusive_share"`
	LaneGateWaitMS      float64 `json:"write_lane_gate_wait_ms"`
	// The write batches of the window (nodeward_write_batch_seconds,
	// summed over replicas): how many, and their p99 from the histogram's
	// buckets, commit included — what a request queued behind a slow one
	// waits for.
	WriteBatches    float64 `json:"write_batches"`
	WriteBatchP99MS float64 `json:"write_batch_p99_ms"`
	PGSamples       int     `json:"pg_samples,omitempty"`
	PGLockWaits     float64 `json:"pg_lock_waiting_backends_avg,omitempty"` // heavyweight locks (rows, transactions)
	PGLWLockWaits   float64 `json:"pg_lwlock_waiting_backends_avg,omitempty"`
	PGWALWaits      float64 `json:"pg_wal_waiting_backends_avg,omitempty"` // WAL write/fsync: the commit's flush
	PGActive        float64 `json:"pg_active_backends_avg,omitempty"`
	PGLockWaitShare float64 `json:"pg_lock_wait_share,omitempty"` // samples with any backend waiting on a lock
	// PGLockWaiters names who waited on a lock, most often first: the
	// lock's kind and the waiting statement's start, with the average
	// number of backends waiting so.
	PGLockWaiters []LockWaiter `json:"pg_lock_waiters,omitempty"`
	Causes        []string     `json:"causes,omitempty"`
}

// LockWaiter is one kind of lock wait seen over the window.
type LockWaiter struct {
	Lock      string  `json:"lock"`      // pg_stat_activity.wait_event: transactionid, tuple, advisory, …
	Statement string  `json:"statement"` // the waiting statement's first words
	Backends  float64 `json:"backends_avg"`
}

// tailProbe samples Postgres over the window.
type tailProbe struct {
	db     *models.DB
	own    bool
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once

	mu                        sync.Mutex
	samples, lockSamples      int
	lock, lwlock, wal, active float64
	waiters                   map[[2]string]int
}

// startTailProbe starts sampling the backends of the server's schema on
// the Postgres at url (their application_name is the schema: newSchema);
// on SQLite (url empty) there is nothing to sample.
func startTailProbe(ctx context.Context, url string) *tailProbe {
	p := &tailProbe{done: make(chan struct{})}
	app := ""
	if u, err := neturl.Parse(url); err == nil {
		app = u.Query().Get("application_name")
	}
	if url == "" || app == "" {
		close(p.done)
		return p
	}
	var err error
	if p.db, err = models.Open(ctx, models.Options{URL: url, MaxOpenConns: 1}); err != nil {
		close(p.done)
		return p
	}
	p.own = true
	ctx, p.cancel = context.WithCancel(ctx)
	go func() {
		defer close(p.done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			var row struct{ Lock, LWLock, WAL, Active float64 }
			err := p.db.WithContext(ctx).Raw(`SELECT
  count(*) FILTER (WHERE wait_event_type = 'Lock') AS lock,
  count(*) FILTER (WHERE wait_event_type = 'LWLock' AND wait_event NOT LIKE 'WAL%') AS lw_lock,
  count(*) FILTER (WHERE wait_event LIKE 'WAL%') AS wal,
  count(*) FILTER (WHERE state = 'active') AS active
FROM pg_stat_activity WHERE application_name = ? AND pid <> pg_backend_pid()`, app).Scan(&row).Error
			if err == nil {
				p.mu.Lock()
				p.samples++
				p.lock += row.Lock
				p.lwlock += row.LWLock
				p.wal += row.WAL
				p.active += row.Active
				if row.Lock > 0 {
					p.lockSamples++
				}
				p.mu.Unlock()
			}
			if err == nil && row.Lock > 0 {
				p.sampleWaiters(ctx, app)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return p
}

// sampleWaiters counts the backends waiting on a lock now by the lock's
// kind and the statement's first words.
func (p *tailProbe) sampleWaiters(ctx context.Context, app string) {
	var rows []struct{ Event, Statement string }
	err := p.db.WithContext(ctx).Raw(`SELECT wait_event AS event,
  left(regexp_replace(query, '\s+', ' ', 'g'), 60) AS statement
FROM pg_stat_activity WHERE application_name = ? AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'`, app).Scan(&rows).Error
	if err != nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.waiters == nil {
		p.waiters = map[[2]string]int{}
	}
	for _, r := range rows {
		p.waiters[[2]string{r.Event, r.Statement}]++
	}
}

// stop ends the sampling (at the window's end); finish calls it too.
func (p *tailProbe) stop() {
	p.once.Do(func() {
		if p.cancel != nil {
			p.cancel()
		}
		<-p.done
		if p.own {
			_ = p.db.Close()
		}
	})
}

// finish reads the window's evidence.
func (p *tailProbe) finish(rep *Report, target float64, before, after map[string]float64) TailCause {
	p.stop()
	d := func(k string) float64 { return after[k] - before[k] }
	tc := TailCause{TargetMS: target, Exceeded: target > 0 && rep.SentP99 > target,
		IssueSideP99MS: max(0, rep.SentP99-rep.IssuedP99), DeliverySideP99MS: rep.IssuedP99,
		GCs: d("go_gc_duration_seconds_count"), GCPauseMS: 1000 * d("go_gc_duration_seconds_sum"),
		GCMaxMS: 1000 * after[`go_gc_duration_seconds{quantile="1"}`], HeapMB: after["go_memstats_heap_alloc_bytes"] / (1 << 20),
		MachineBus: rep.CPU.MachineBusy, RenewalsFlushed: d("nodeward_lease_renewals_flushed_total"),
		LeaseSweeps: d("nodeward_lease_sweeps_total"), PollStoreReads: d("nodeward_long_poll_store_queries_total"),
		PollReadsSkip: d("nodeward_long_poll_due_reads_skipped_total"), PollRenewals: d("nodeward_long_poll_lease_renewals_total"),
		NodeCacheHits: d(`nodeward_node_lookups_total{result="hit"}`), NodeReads: d(`nodeward_node_lookups_total{result="store"}`),
		CredReads: d(`nodeward_credential_lookups_total{result="store"}`), CredShared: d(`nodeward_credential_lookups_total{result="shared"}`),
		Redeliveries: d("nodeward_command_redeliveries_total"),
		PoolWaits:    d(`go_sql_wait_count_total{db_name="pool"}`), PoolWaitMS: 1000 * d(`go_sql_wait_duration_seconds_total{db_name="pool"}`),
		LaneGateWaitMS: 1000 * d("nodeward_write_lane_gate_wait_seconds_total"),
		GCCPUSeconds:   d("nodeward_gc_cpu_seconds_total"), GCPercent: after["nodeward_gc_percent"]}
	if rep.Seconds > 0 {
		tc.WriteExclusiveShare = d("nodeward_write_exclusive_seconds_total") / rep.Seconds
	}
	var p99 float64
	tc.WriteBatches, p99 = histogramQuantile(before, after, "nodeward_write_batch_seconds", 0.99)
	tc.WriteBatchP99MS = 1000 * p99
	// The Go collector's quantile 1 is the longest of the recent pauses,
	// which may predate the window: no pause in it is longer than their sum.
	tc.GCMaxMS = min(tc.GCMaxMS, tc.GCPauseMS)
	p.mu.Lock()
	if p.samples > 0 {
		n := float64(p.samples)
		tc.PGSamples = p.samples
		tc.PGLockWaits, tc.PGLWLockWaits, tc.PGWALWaits, tc.PGActive = p.lock/n, p.lwlock/n, p.wal/n, p.active/n
		tc.PGLockWaitShare = float64(p.lockSamples) / n
		for k, c := range p.waiters {
			tc.PGLockWaiters = append(tc.PGLockWaiters, LockWaiter{Lock: k[0], Statement: k[1], Backends: float64(c) / n})
		}
		sort.Slice(tc.PGLockWaiters, func(i, j int) bool {
			a, b := tc.PGLockWaiters[i], tc.PGLockWaiters[j]
			if a.Backends != b.Backends {
				return a.Backends > b.Backends
			}
			return a.Lock+a.Statement < b.Lock+b.Statement
		})
	}
	p.mu.Unlock()
	if tc.Exceeded {
		tc.Causes = tailCauses(tc, rep)
	}
	return tc
}

// tailCauses names what the counters support, strongest first.
func tailCauses(tc TailCause, rep *Report) []string {
	var out []string
	excess := rep.SentP99 - tc.TargetMS
	if tc.IssueSideP99MS > tc.DeliverySideP99MS {
		out = append(out, fmt.Sprintf("issue side: p99 %.1f ms from the intended issue time to the server's issued_at (issuer queue, the request, its commit) against %.1f ms from issued_at to receipt", tc.IssueSideP99MS, tc.DeliverySideP99MS))
	} else {
		out = append(out, fmt.Sprintf("delivery side: p99 %.1f ms from issued_at to receipt (wake-up, the poll's answer) against %.1f ms before issued_at", tc.DeliverySideP99MS, tc.IssueSideP99MS))
	}
	if tc.MachineBus >= 0.9 {
		out = append(out, fmt.Sprintf("CPU: the machine was %.0f%% busy (%.2f cores outside the tool and its workers): requests queued for a core", 100*tc.MachineBus, rep.CPU.Rest))
	}
	if tc.PGLockWaitShare >= 0.05 {
		c := fmt.Sprintf("lock waits: a backend waited on a row or transaction lock in %.0f%% of the samples (%.2f waiting on average)", 100*tc.PGLockWaitShare, tc.PGLockWaits)
		for i, w := range tc.PGLockWaiters[:min(3, len(tc.PGLockWaiters))] {
			sep := "; most: "
			if i > 0 {
				sep = ", "
			}
			c += fmt.Sprintf("%s%.2f on %s in %q", sep, w.Backends, w.Lock, w.Statement)
		}
		out = append(out, c)
	}
	if tc.PGWALWaits >= 0.5 {
		out = append(out, fmt.Sprintf("commit flush: %.2f backends waiting on WAL write/fsync on average", tc.PGWALWaits))
	}
	if tc.PGLWLockWaits >= 0.5 {
		out = append(out, fmt.Sprintf("lightweight locks: %.2f backends waiting on average", tc.PGLWLockWaits))
	}
	if tc.GCMaxMS >= max(1, excess/4) {
		out = append(out, fmt.Sprintf("GC: %.0f collections, the longest recent pause %.1f ms (total %.1f ms)", tc.GCs, tc.GCMaxMS, tc.GCPauseMS))
	}
	if tc.WriteExclusiveShare >= 0.25 {
		c := fmt.Sprintf("write path: exclusive batches (on SQLite every batch; on Postgres those spanning many nodes) held it %.0f%% of the window", 100*tc.WriteExclusiveShare)
		if tc.LaneGateWaitMS > 0 {
			c += fmt.Sprintf(", the per-node lanes waiting %.0f ms in all behind them", tc.LaneGateWaitMS)
		}
		out = append(out, c)
	}
	if tc.WriteBatches > 0 && tc.WriteBatchP99MS >= max(1, tc.TargetMS/5) {
		out = append(out, fmt.Sprintf("write batches: p99 %.1f ms of %.0f in the window (a transaction with its commit; what the requests queued behind a slow one wait for)", tc.WriteBatchP99MS, tc.WriteBatches))
	}
	if tc.PoolWaits > 0 {
		out = append(out, fmt.Sprintf("database pool: %.0f waits for a connection, %.0f ms in all (%.1f ms each)", tc.PoolWaits, tc.PoolWaitMS, tc.PoolWaitMS/tc.PoolWaits))
	}
	if tc.Redeliveries > 0 {
		out = append(out, fmt.Sprintf("redeliveries: %.0f commands handed out again (their lease ran out, or a resuming poll asked)", tc.Redeliveries))
	}
	if tc.LeaseSweeps > 0 && tc.RenewalsFlushed > 0 {
		out = append(out, fmt.Sprintf("batches: %.0f lease sweeps ran and %.0f lease renewals were flushed in the window", tc.LeaseSweeps, tc.RenewalsFlushed))
	}
	return out
}

func printTail(w io.Writer, tc TailCause) {
	if !tc.Exceeded {
		return
	}
	fmt.Fprintf(w, "p99 over %.0f ms because   (evidence below; strongest first)\n", tc.TargetMS)
	for _, c := range tc.Causes {
		fmt.Fprintf(w, "  - %s\n", c)
	}
	fmt.Fprintf(w, "  GC %.0f cycles, max pause %.2f ms, heap %.0f MB (all servers); postgres samples %d: lock %.2f, lwlock %.2f, WAL %.2f, active %.2f\n",
		tc.GCs, tc.GCMaxMS, tc.HeapMB, tc.PGSamples, tc.PGLockWaits, tc.PGLWLockWaits, tc.PGWALWaits, tc.PGActive)
}

// histogramQuantile answers how many observations a Prometheus histogram
// (its name_bucket{le="…"} series) took between two scrapes, and the q
// quantile of them, interpolated linearly inside its bucket as
// Prometheus's histogram_quantile does (the +Inf bucket answers the
// highest finite bound). Zero and zero when nothing was observed.
func histogramQuantile(before, after map[string]float64, name string, q float64) (count, value float64) {
	prefix := name + `_bucket{le="`
	type bucket struct{ le, n float64 }
	var bs []bucket
	for k, v := range after {
		le, ok := strings.CutPrefix(k, prefix)
		if !ok {
			continue
		}
		le = strings.TrimSuffix(le, `"}`)
		bound := math.Inf(1)
		if le != "+Inf" {
			f, err := strconv.ParseFloat(le, 64)
			if err != nil {
				continue
			}
			bound = f
		}
		bs = append(bs, bucket{bound, v - before[k]})
	}
	if len(bs) == 0 {
		return 0, 0
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	count = bs[len(bs)-1].n // the +Inf bucket counts every observation
	if count <= 0 {
		return 0, 0
	}
	rank := q * count
	lower, below := 0.0, 0.0
	for _, b := range bs {
		if b.n >= rank {
			if math.IsInf(b.le, 1) {
				return count, lower
			}
			if b.n == below {
				return count, b.le
			}
			return count, lower + (b.le-lower)*(rank-below)/(b.n-below)
		}
		lower, below = b.le, b.n
	}
	return count, lower
}
