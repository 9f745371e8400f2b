package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/server/controlplane"
)

// The ledger scenario measures the operations engine itself, the way
// River's submit mode measures a job queue (../shared/bench/riverpeer):
// -submitters goroutines submit -ops operations of a no-op kind, one
// submit transaction each, through the ledger service of -replicas control
// planes sharing one database, while their dispatchers run them. It
// reports submitted → succeeded operations per second (until the last one
// ended) and submit → running latency (created_at to accepted_at, both on
// the ledger's clock). The no-op kind is registered by this harness only:
// the product serves no such kind.

// LedgerConfig is one ledger run.
type LedgerConfig struct {
	Ops           int
	Submitters    int
	Replicas      int
	LedgerWorkers int
	DatabaseURL   string // empty: SQLite
	PGBench       bool
	Log           io.Writer
}

// LedgerReport is what a ledger run measured.
type LedgerReport struct {
	Date          string  `json:"date"`
	Database      string  `json:"database"`
	Replicas      int     `json:"replicas"`
	Workers       int     `json:"ledger_workers"`
	Ops           int     `json:"ops"`
	Submitters    int     `json:"submitters"`
	SubmitErrors  int64   `json:"submit_errors"`
	SubmitSeconds float64 `json:"submit_seconds"`
	SubmittedPS   float64 `json:"submitted_per_second"`
	Seconds       float64 `json:"seconds"`
	SucceededPS   float64 `json:"succeeded_per_second"`
	RunningP50    float64 `json:"submit_to_running_ms_p50"`
	RunningP99    float64 `json:"submit_to_running_ms_p99"`
	RunningMax    float64 `json:"submit_to_running_ms_max"`
	Claims        float64 `json:"claim_statements"`
	PGCommitsPS   float64 `json:"postgres_commits_per_second,omitempty"`
	PGBenchTPS    float64 `json:"pgbench_tps,omitempty"`
	CPU           CPUUse  `json:"cpu"`
}

const noopKind = "bench.noop"

func registerNoop(app *controlplane.App) {
	app.Ledger.Kinds().Register(&ledger.Kind{Name: noopKind, Family: "bench",
		Prepare: func(context.Context, *ledger.Draft) error { return nil },
		Run:     func(context.Context, ledger.Operation) (json.RawMessage, error) { return nil, nil },
	})
}

// RunLedger runs the ledger scenario.
func RunLedger(ctx context.Context, cfg LedgerConfig) (LedgerReport, error) {
	rep := LedgerReport{Date: time.Now().UTC().Format(time.RFC3339), Database: "sqlite", Replicas: cfg.Replicas,
		Workers: cfg.LedgerWorkers, Ops: cfg.Ops, Submitters: cfg.Submitters}
	if cfg.DatabaseURL != "" {
		rep.Database = "postgres"
	} else if cfg.Replicas > 1 {
		return rep, fmt.Errorf("several replicas need Postgres (SQLite is one process)")
	}
	logf := func(format string, args ...any) {
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, format+"\n", args...)
		}
	}
	var servers []*localServer
	defer func() {
		for i := len(servers) - 1; i >= 0; i-- {
			servers[i].Close()
		}
	}()
	for i := range cfg.Replicas {
		o := localOptions{BaseURL: cfg.DatabaseURL, Replica: "ledger-" + strconv.Itoa(i), LedgerWorkers: cfg.LedgerWorkers,
			Setup: registerNoop, LogTo: io.Discard}
		if i > 0 {
			o.Join = servers[0]
		}
		s, err := startLocalWith(ctx, o)
		if err != nil {
			return rep, err
		}
		servers = append(servers, s)
	}
	logf("ledger: %d replica(s) on %s, %d workers each; %d operations from %d submitters", cfg.Replicas, rep.Database,
		cfg.LedgerWorkers, cfg.Ops, cfg.Submitters)

	db := servers[0].App.DB
	commits0, _ := pgCommitsIf(ctx, db, rep.Database)
	cpu0 := sampleCPU()
	principal := ledger.Principal{Kind: ledger.PrincipalAdmin, ID: "bench", Name: "bench"}
	var next, errs atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := range cfg.Submitters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			svc := servers[w%len(servers)].App.Ledger
			for {
				i := next.Add(1)
				if i > int64(cfg.Ops) {
					return
				}
				if _, _, err := svc.Submit(ctx, principal, ledger.Submission{RequestID: "bench-" + strconv.FormatInt(i, 10), Kind: noopKind}); err != nil {
					if errs.Add(1) == 1 {
						logf("ledger: first submit error: %v", err)
					}
				}
			}
		}()
	}
	wg.Wait()
	rep.SubmitSeconds = time.Since(start).Seconds()
	rep.SubmitErrors = errs.Load()
	want := int64(cfg.Ops) - rep.SubmitErrors
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var done int64
		if err := db.WithContext(ctx).Raw(`SELECT COUNT(*) FROM operations WHERE kind = ? AND state = 'succeeded'`, noopKind).Scan(&done).Error; err != nil {
			return rep, err
		}
		if done >= want {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return rep, fmt.Errorf("only %d of %d operations succeeded in time", done, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
	rep.Seconds = time.Since(start).Seconds()
	rep.CPU = cpuSince(cpu0, nil)
	if c1, err := pgCommitsIf(ctx, db, rep.Database); err == nil && c1 > commits0 {
		rep.PGCommitsPS = float64(c1-commits0) / rep.Seconds
	}
	rep.SubmittedPS = float64(want) / rep.SubmitSeconds
	rep.SucceededPS = float64(want) / rep.Seconds
	for _, s := range servers {
		rep.Claims += counterValue(s.App.Metrics.LedgerClaims)
	}

	type row struct {
		CreatedAt  time.Time
		AcceptedAt time.Time
	}
	var rows []row
	if err := db.WithContext(ctx).Raw(`SELECT created_at, accepted_at FROM operations WHERE kind = ?`, noopKind).Scan(&rows).Error; err != nil {
		return rep, err
	}
	lat := make([]float64, 0, len(rows))
	for _, r := range rows {
		lat = append(lat, float64(r.AcceptedAt.Sub(r.CreatedAt).Microseconds())/1000)
	}
	sort.Float64s(lat)
	if n := len(lat); n > 0 {
		rep.RunningP50, rep.RunningP99, rep.RunningMax = lat[n/2], lat[min(n-1, n*99/100)], lat[n-1]
	}
	if cfg.PGBench && cfg.DatabaseURL != "" {
		logTo := cfg.Log
		if logTo == nil {
			logTo = io.Discard
		}
		tps, err := pgbench(ctx, cfg.DatabaseURL, logTo)
		if err != nil {
			return rep, err
		}
		rep.PGBenchTPS = tps
	}
	return rep, nil
}

func printLedgerReport(w io.Writer, r LedgerReport) {
	fmt.Fprintf(w, "date                     %s\n", r.Date)
	fmt.Fprintf(w, "database                 %s, %d replica(s), %d ledger workers each\n", r.Database, r.Replicas, r.Workers)
	fmt.Fprintf(w, "submitted                %d from %d submitters in %.2fs = %.0f/s, %d errors\n", r.Ops, r.Submitters, r.SubmitSeconds, r.SubmittedPS, r.SubmitErrors)
	fmt.Fprintf(w, "succeeded/s              %.0f (first submit to last end, %.2fs)\n", r.SucceededPS, r.Seconds)
	fmt.Fprintf(w, "submit→running ms        p50 %.1f  p99 %.1f  max %.1f\n", r.RunningP50, r.RunningP99, r.RunningMax)
	fmt.Fprintf(w, "claim statements         %.0f (%.1f operations per claim)\n", r.Claims, float64(r.Ops)/max(r.Claims, 1))
	fmt.Fprintf(w, "cpu (cores of %.0f)       machine %.0f%% busy; this process %.2f, rest (database, other) %.2f\n",
		r.CPU.Cores, 100*r.CPU.MachineBusy, r.CPU.Self, r.CPU.Rest)
	if r.PGCommitsPS > 0 {
		fmt.Fprintf(w, "postgres commits/s       %.0f (whole database)\n", r.PGCommitsPS)
	}
	if r.PGBenchTPS > 0 {
		fmt.Fprintf(w, "pgbench -N tps           %.0f (succeeded/s above: %.0f = %.2fx)\n", r.PGBenchTPS, r.SucceededPS, r.SucceededPS/r.PGBenchTPS)
	}
}

// CPUUse is how busy the machine was over a window, in cores.
type CPUUse struct {
	Cores       float64 `json:"cores"`
	MachineBusy float64 `json:"machine_busy"`
	Self        float64 `json:"self"`
	Rest        float64 `json:"rest"`
}

type cpuSample struct{ busy, total, self float64 }

func sampleCPU() cpuSample {
	busy, total := machineCPU()
	return cpuSample{busy: busy, total: total, self: processCPU(os.Getpid())}
}

// cpuSince answers the CPU used since s0 over the wall-clock window: the
// machine's busy share, this process's cores, and the rest (the database,
// anything else running).
func cpuSince(s0 cpuSample, _ []int) CPUUse {
	s1 := sampleCPU()
	u := CPUUse{Cores: float64(runtime.NumCPU())}
	if s1.total > s0.total {
		u.MachineBusy = (s1.busy - s0.busy) / (s1.total - s0.total)
		window := (s1.total - s0.total) / u.Cores
		u.Self = (s1.self - s0.self) / window
		u.Rest = u.MachineBusy*u.Cores - u.Self
	}
	return u
}

func pgCommitsIf(ctx context.Context, db *models.DB, dialect string) (int64, error) {
	if dialect != models.Postgres {
		return 0, nil
	}
	return pgCommits(ctx, db)
}

func counterValue(c prometheus.Counter) float64 { return testutil.ToFloat64(c) }
