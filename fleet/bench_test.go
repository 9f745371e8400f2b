package fleet_test

// Benchmarks of the fleet's hot paths on every dialect of the run (SQLite
// always, Postgres when NODEWARD_TEST_DATABASE_URL is set), at the
// production durability defaults (DECISIONS.md §20) and the production lease
// flush interval (50 ms). They run only with -bench; see BENCHMARKS.md for
// the commands and the figures.

import (
	"context"
	"encoding/json"
	"log/slog"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/dbtime"
	"github.com/nodeward/nodeward/keys"
	"github.com/nodeward/nodeward/metrics"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// countingStore counts the lease-renewal commits (one per RenewLeases
// batch) and the renewals they carried.
type countingStore struct {
	*models.FleetStore
	commits  atomic.Int64
	renewals atomic.Int64
}

func (s *countingStore) RenewLeases(ctx context.Context, batch []fleet.LeaseRenewal) (int, error) {
	n, err := s.FleetStore.RenewLeases(ctx, batch)
	if err == nil {
		s.commits.Add(1)
		s.renewals.Add(int64(len(batch)))
	}
	return n, err
}

type benchFleet struct {
	store *countingStore
	svc   *fleet.Service
}

// newBenchFleet runs a fleet with the production settings on db, on the
// real clock.
func newBenchFleet(b testing.TB, db *models.DB) *benchFleet {
	b.Helper()
	fs := models.NewFleetStore(db, "bench", nil)
	st := &countingStore{FleetStore: fs}
	svc := fleet.New(fleet.Options{Store: st, Keys: keys.NewRing(testKey),
		Settings: fleet.Settings{PublicURL: "https://cp.example", ReplicaID: "bench"},
		Metrics:  metrics.New(nil), Logger: slog.New(slog.DiscardHandler)})
	fs.SetOnCommit(func(n []fleet.Notification) { svc.Deliver(n, "local") })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); svc.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	return &benchFleet{store: st, svc: svc}
}

var benchSeq atomic.Int64

func benchID(prefix string) string { return prefix + strconv.FormatInt(benchSeq.Add(1), 36) }

func (f *benchFleet) invite(b testing.TB) api.Bootstrap {
	b.Helper()
	boot, err := f.svc.Invite(ctx, "admin:bench", fleet.Invite{RentalID: benchID("r"), Generation: 1})
	if err != nil {
		b.Fatal(err)
	}
	return boot
}

func (f *benchFleet) readyNode(b testing.TB) fleet.Session {
	b.Helper()
	boot := f.invite(b)
	resp, err := f.svc.Enroll(ctx, enrollReq(boot, time.Now()))
	if err != nil {
		b.Fatal(err)
	}
	return fleet.Session{NodeID: boot.NodeID, Fencing: resp.FencingToken}
}

// readyNodes writes n ready nodes straight through the store, 1,000 to a
// transaction: enrolling 50,000 one by one would dominate the benchmark.
func (f *benchFleet) readyNodes(b testing.TB, n int) []fleet.Session {
	b.Helper()
	now := dbtime.Norm(time.Now())
	lease := now.Add(90 * time.Second)
	out := make([]fleet.Session, 0, n)
	for len(out) < n {
		err := f.store.Tx(ctx, func(tx fleet.Tx) error {
			for i := 0; i < 1000 && len(out) < n; i++ {
				id := benchID("bulk-")
				if err := tx.InsertNode(ctx, fleet.Node{ID: id, RentalID: "rental-" + id, Generation: 1, State: fleet.StateReady,
					FencingToken: 1, CreatedAt: now, UpdatedAt: now, EnrolledAt: &now, LeaseExpiresAt: &lease,
					Disk: fleet.Disk{State: fleet.DiskNeverReported}}); err != nil {
					return err
				}
				out = append(out, fleet.Session{NodeID: id, Fencing: 1})
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	return out
}

// eachDialect runs fn as a sub-benchmark on a fresh database of every
// dialect of this run.
func eachDialect(b *testing.B, fn func(b *testing.B, db *models.DB)) {
	for _, d := range dbtest.Dialects(b) {
		b.Run(d, func(b *testing.B) { fn(b, dbtest.Open(b, d)) })
	}
}

func launchPayload(op string) json.RawMessage {
	return json.RawMessage(`{"run_id":"run-` + op + `","attempt_id":"1","command":"true"}`)
}

// BenchmarkEnroll: one enrollment (two-door check, redemption, fencing
// bump, lease, audit) per op; the invitations are made outside the timer.
func BenchmarkEnroll(b *testing.B) {
	eachDialect(b, func(b *testing.B, db *models.DB) {
		f := newBenchFleet(b, db)
		boots := make([]api.Bootstrap, b.N)
		for i := range boots {
			boots[i] = f.invite(b)
		}
		now := time.Now()
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := f.svc.Enroll(ctx, enrollReq(boots[i], now)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkInvite: one invitation (identity reservation, token mint) per op.
func BenchmarkInvite(b *testing.B) {
	eachDialect(b, func(b *testing.B, db *models.DB) {
		f := newBenchFleet(b, db)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			f.invite(b)
		}
	})
}

const workloadBatch = 50

// BenchmarkEventsWorkload: one batch of 50 fresh workload events per op
// (dedup by event id, upsert of the latest observation), one transaction.
func BenchmarkEventsWorkload(b *testing.B) {
	eachDialect(b, func(b *testing.B, db *models.DB) {
		f := newBenchFleet(b, db)
		sess := f.readyNode(b)
		obs := time.Now().UTC()
		batches := make([][]api.Event, b.N)
		for i := range batches {
			evs := make([]api.Event, workloadBatch)
			for j := range evs {
				id := benchID("ev-")
				evs[j] = api.Event{ID: id, Kind: api.EventWorkload, ObservedAt: obs, Workload: &api.WorkloadObservation{
					RunID: "run-" + strconv.Itoa(j), AttemptID: strconv.Itoa(i), State: api.WorkloadRunning, ObservedAt: obs}}
			}
			batches[i] = evs
		}
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		for i := 0; i < b.N; i++ {
			res, err := f.svc.RecordEvents(ctx, sess, batches[i])
			if err != nil {
				b.Fatal(err)
			}
			if res.Recorded != workloadBatch {
				b.Fatalf("recorded %d of %d", res.Recorded, workloadBatch)
			}
		}
		b.ReportMetric(float64(b.N*workloadBatch)/time.Since(start).Seconds(), "events/s")
	})
}

// BenchmarkEventsHeartbeat: one heartbeat with facts per op, waiting for
// its group commit. Serial, so each op waits out up to one flush interval
// (50 ms): this is a heartbeat's latency, not the store's throughput (see
// BenchmarkHeartbeatCoalescing).
func BenchmarkEventsHeartbeat(b *testing.B) {
	eachDialect(b, func(b *testing.B, db *models.DB) {
		f := newBenchFleet(b, db)
		sess := f.readyNode(b)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			fa := facts(time.Now())
			if _, err := f.svc.RecordEvents(ctx, sess, []api.Event{{ID: benchID("hb-"), Kind: api.EventHeartbeat,
				ObservedAt: time.Now(), Facts: &fa}}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkRenewLeaseUncoalesced: one lease renewal per commit, serially:
// the commit rate a heartbeat per transaction would be bounded by.
func BenchmarkRenewLeaseUncoalesced(b *testing.B) {
	eachDialect(b, func(b *testing.B, db *models.DB) {
		f := newBenchFleet(b, db)
		nodes := f.readyNodes(b, 1000)
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		for i := 0; i < b.N; i++ {
			now := time.Now()
			if _, err := f.store.FleetStore.RenewLeases(ctx, []fleet.LeaseRenewal{{NodeID: nodes[i%len(nodes)].NodeID,
				Until: now.Add(90 * time.Second), HeartbeatAt: &now}}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "commits/s")
	})
}

// Heartbeat coalescing (the 50,000-node fleet of the issue): every node
// heartbeats every 30 s, about 1,667 heartbeats a second.
const (
	fleetNodes        = 50000
	heartbeatEvery    = 30 * time.Second
	heartbeatsPerSec  = int(fleetNodes / (heartbeatEvery / time.Second)) // 1,666
	maxHeartbeatConns = 2000
)

// BenchmarkHeartbeatCoalescing drives heartbeats (with facts, waiting for
// their commit, as the agent API does) against 50,000 ready nodes.
//
//   - paced: one op is one second of the fleet's steady load (1,666
//     heartbeats spread evenly over it, each from its own goroutine).
//   - max: one op is one second of 2,000 concurrent heartbeaters, each
//     sending its next heartbeat as soon as the last is acknowledged.
//
// Both report heartbeats/s achieved, commits/s (lease-renewal
// transactions) and renewals per commit, and the heartbeat's acknowledge
// latency.
func BenchmarkHeartbeatCoalescing(b *testing.B) {
	for _, d := range dbtest.Dialects(b) {
		b.Run(d, func(b *testing.B) {
			db := dbtest.Open(b, d)
			f := newBenchFleet(b, db)
			nodes := f.readyNodes(b, fleetNodes)
			var next atomic.Int64 // the node that beats next, round robin
			beat := func() (time.Duration, error) {
				s := nodes[int(next.Add(1))%len(nodes)]
				now := time.Now()
				fa := facts(now)
				_, err := f.svc.RecordEvents(ctx, s, []api.Event{{ID: "hb", Kind: api.EventHeartbeat, ObservedAt: now, Facts: &fa}})
				return time.Since(now), err
			}
			b.Run("paced", func(b *testing.B) {
				runHeartbeats(b, f, func(deadline time.Time, lat *latencies) error {
					total := b.N * heartbeatsPerSec
					interval := time.Second / time.Duration(heartbeatsPerSec)
					start := time.Now()
					var wg sync.WaitGroup
					errs := make(chan error, 1)
					for i := 0; i < total; i++ {
						if d := time.Until(start.Add(time.Duration(i) * interval)); d > time.Millisecond {
							time.Sleep(d)
						}
						wg.Add(1)
						go func() {
							defer wg.Done()
							took, err := beat()
							if err != nil {
								select {
								case errs <- err:
								default:
								}
								return
							}
							lat.add(took)
						}()
					}
					wg.Wait()
					select {
					case err := <-errs:
						return err
					default:
						return nil
					}
				})
			})
			b.Run("max", func(b *testing.B) {
				runHeartbeats(b, f, func(_ time.Time, lat *latencies) error {
					end := time.Now().Add(time.Duration(b.N) * time.Second)
					var wg sync.WaitGroup
					errs := make(chan error, 1)
					for range maxHeartbeatConns {
						wg.Add(1)
						go func() {
							defer wg.Done()
							for time.Now().Before(end) {
								took, err := beat()
								if err != nil {
									select {
									case errs <- err:
									default:
									}
									return
								}
								lat.add(took)
							}
						}()
					}
					wg.Wait()
					select {
					case err := <-errs:
						return err
					default:
						return nil
					}
				})
			})
		})
	}
}

func runHeartbeats(b *testing.B, f *benchFleet, drive func(time.Time, *latencies) error) {
	lat := &latencies{}
	commits0, renewals0 := f.store.commits.Load(), f.store.renewals.Load()
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	if err := drive(start, lat); err != nil {
		b.Fatal(err)
	}
	el := time.Since(start).Seconds()
	b.StopTimer()
	commits := f.store.commits.Load() - commits0
	renewals := f.store.renewals.Load() - renewals0
	b.ReportMetric(float64(lat.count())/el, "heartbeats/s")
	b.ReportMetric(float64(commits)/el, "commits/s")
	if commits > 0 {
		b.ReportMetric(float64(renewals)/float64(commits), "renewals/commit")
	}
	b.ReportMetric(lat.quantile(0.5).Seconds()*1000, "p50-ms")
	b.ReportMetric(lat.quantile(0.99).Seconds()*1000, "p99-ms")
}

// latencies collects samples from many goroutines.
type latencies struct {
	mu sync.Mutex // guards d
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

func (l *latencies) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.d)
}

func (l *latencies) quantile(q float64) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return 0
	}
	s := slices.Clone(l.d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// BenchmarkCommandRoundTrip: Issue, a poll that claims it (wait 0) and the
// node's Settle, one command per op on one node: three transactions.
func BenchmarkCommandRoundTrip(b *testing.B) {
	eachDialect(b, func(b *testing.B, db *models.DB) {
		f := newBenchFleet(b, db)
		sess := f.readyNode(b)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			op := benchID("op-")
			if _, _, err := f.svc.Issue(ctx, "admin:bench", fleet.IssueCommand{NodeID: sess.NodeID, OperationID: op,
				Kind: api.KindLaunchWorkload, Payload: launchPayload(op)}); err != nil {
				b.Fatal(err)
			}
			cmds, err := f.svc.Poll(ctx, sess, 0, "")
			if err != nil || len(cmds) != 1 {
				b.Fatalf("poll: %d commands, %v", len(cmds), err)
			}
			settled, err := f.svc.Settle(ctx, sess, []api.Result{{OperationID: op, Applied: true}})
			if err != nil || settled[0].State != string(fleet.CommandApplied) {
				b.Fatalf("settle: %+v, %v", settled, err)
			}
		}
	})
}

// BenchmarkCommandRoundTripParallel: the same round trip from many nodes at
// once (one node per goroutine), reporting settled commands/s.
func BenchmarkCommandRoundTripParallel(b *testing.B) {
	eachDialect(b, func(b *testing.B, db *models.DB) {
		f := newBenchFleet(b, db)
		const nodes = 64
		sessions := make(chan fleet.Session, nodes)
		for range nodes {
			sessions <- f.readyNode(b)
		}
		b.ReportAllocs()
		b.SetParallelism(nodes / runtime.GOMAXPROCS(0))
		b.ResetTimer()
		start := time.Now()
		var settled atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			sess := <-sessions
			for pb.Next() {
				op := benchID("op-")
				if _, _, err := f.svc.Issue(ctx, "admin:bench", fleet.IssueCommand{NodeID: sess.NodeID, OperationID: op,
					Kind: api.KindLaunchWorkload, Payload: launchPayload(op)}); err != nil {
					b.Error(err)
					return
				}
				if _, err := f.svc.Poll(ctx, sess, 0, ""); err != nil {
					b.Error(err)
					return
				}
				if _, err := f.svc.Settle(ctx, sess, []api.Result{{OperationID: op, Applied: true}}); err != nil {
					b.Error(err)
					return
				}
				settled.Add(1)
			}
		})
		b.ReportMetric(float64(settled.Load())/time.Since(start).Seconds(), "settled/s")
	})
}
