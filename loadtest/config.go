package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/agent/client"
	"github.com/nodeward/nodeward/internal/dbtime"
	"github.com/nodeward/nodeward/models"
)

// The config scenario (issue 11): simulated agents hold long-polls, then
// ONE fleet.configure of one document over all of them (selector state
// ready, max_concurrency the whole fleet); each agent reports applied
// through POST /agent/v1/events kind config as soon as a poll answer
// carries the configuration. It reports the time from the submit until
// every agent's report was acknowledged and until the parent operation
// ended, and the Postgres commits spent. Then the lagging count's cost:
// -lagging-nodes more nodes with configurations are seeded straight into
// the tables, and GET /api/v1/config/lagging (and CountLagging, which the
// metric runs) is timed against them.

// ConfigLoad is one config run.
type ConfigLoad struct {
	Config
	// LaggingNodes are seeded (nodes and node_configs rows, a tenth never
	// reported, half of the rest lagging) after the fan-out, for the
	// lagging count's cost; 0 skips that part. Needs the in-process
	// server.
	LaggingNodes int
	// LaggingSamples is how many times each lagging read is timed.
	LaggingSamples int
	// DocumentBytes pads the document to about this size (0: a few
	// bytes): what a real configuration weighs on every write of its row.
	// The pad is text that compresses about as a configuration does
	// (padText), not one repeated byte, which Postgres's TOAST stored in
	// a few kilobytes whatever the size.
	DocumentBytes int
	// ProbeRate is how many single commands a second are submitted while
	// the wave runs, round robin over the agents, each submit timed: how
	// long the wave holds the fleet's other writes back (0: none).
	ProbeRate float64
}

// ConfigReport is what a config run measured.
type ConfigReport struct {
	Date     string `json:"date"`
	Database string `json:"database"`
	Agents   int    `json:"agents"`
	Workers  int    `json:"workers"`
	Enrolled int    `json:"enrolled"`
	Held     int    `json:"long_polls_held"`
	// The parent operation as it ended.
	ParentState string `json:"parent_state"`
	Total       int    `json:"children_total"`
	Succeeded   int    `json:"children_succeeded"`
	Failed      int    `json:"children_failed"`
	// What the agents saw.
	Received  int64  `json:"configs_received"`
	Reported  int64  `json:"configs_reported"`
	AgentErrs int64  `json:"agent_errors"`
	FirstErr  string `json:"first_error,omitempty"`
	// Seconds from the submit until the last agent's report was
	// acknowledged, and until the parent operation was seen ended.
	AllAppliedSeconds  float64 `json:"all_applied_seconds"`
	ParentEndedSeconds float64 `json:"parent_ended_seconds"`
	// Postgres commits (whole database) from the submit until the parent
	// ended, and per node configured.
	PGCommits      int64   `json:"pg_commits,omitempty"`
	CommitsPerNode float64 `json:"pg_commits_per_node,omitempty"`
	// PGIdleCommitsPS is the database's commits/s over one second before
	// the submit, every agent holding its poll (the baseline: the counter
	// counts every transaction of the database, read-only ones included).
	PGIdleCommitsPS float64 `json:"pg_idle_commits_per_s,omitempty"`
	// The server's fan-out counters at the parent's end: child-end
	// notices, and the parent advances they caused (coalesced; the
	// periodic sweep's counted apart).
	ChildEndNotices float64 `json:"child_end_notices"`
	Advances        float64 `json:"advances"`
	SweepAdvances   float64 `json:"sweep_advances"`
	// The tool's resident memory (the server's, when it started it: the
	// agents run in the workers) just before the submit, and its peak
	// until the parent ended, sampled every 100 ms.
	SubmitRSSMB float64 `json:"submit_rss_mb,omitempty"`
	PeakRSSMB   float64 `json:"peak_rss_mb,omitempty"`
	// The probe's submits during the wave (ConfigLoad.ProbeRate): how
	// many, how many failed, and their latency in ms.
	ProbeSubmits int     `json:"probe_submits,omitempty"`
	ProbeErrors  int     `json:"probe_errors,omitempty"`
	ProbeP50     float64 `json:"probe_p50_ms,omitempty"`
	ProbeP99     float64 `json:"probe_p99_ms,omitempty"`
	ProbeMax     float64 `json:"probe_max_ms,omitempty"`
	// The lagging count's cost over LaggingNodes seeded nodes.
	LaggingNodes  int     `json:"lagging_nodes"`
	SeedSeconds   float64 `json:"seed_seconds,omitempty"`
	LaggingCount  int64   `json:"lagging_count"`
	NeverReported int64   `json:"never_reported"`
	LaggingGetP50 float64 `json:"lagging_get_p50_ms"`
	LaggingGetMax float64 `json:"lagging_get_max_ms"`
	CountP50      float64 `json:"count_lagging_p50_ms"`
	CountMax      float64 `json:"count_lagging_max_ms"`
	// Timeline is the parent's counts about once a second from the
	// submit: where the wave's time goes (releases, deliveries, reports).
	Timeline []ConfigTick `json:"timeline"`
	// MaxUnreported is the most nodes at a tick that had been delivered
	// the revision but whose applied report had not landed: how far the
	// wave's progress trailed its deliveries (the tool's server only).
	MaxUnreported int64 `json:"max_delivered_unapplied,omitempty"`
}

// ConfigTick is the parent operation's children by state, some seconds
// after the submit. The parent's counts move only at its advances, so,
// when the tool started the server, the tick also counts the nodes'
// configuration rows: written by a release, delivered to a poll, applied
// by the node's report.
type ConfigTick struct {
	Seconds   float64 `json:"s"`
	Pending   int     `json:"pending"`
	Succeeded int     `json:"succeeded"`
	Failed    int     `json:"failed"`
	Written   int64   `json:"written,omitempty"`
	Delivered int64   `json:"delivered,omitempty"`
	Applied   int64   `json:"applied,omitempty"`
	// The server's write batches since the submit (group commit: how
	// many, how long they ran in all, how long the exclusive lane held
	// the others back), from its metrics.
	WriteBatches     float64 `json:"write_batches"`
	WriteBatchSecs   float64 `json:"write_batch_seconds"`
	ExclusiveSeconds float64 `json:"exclusive_seconds"`
	// Queued is how many write requests waited for their batch at the
	// tick, over every lane.
	Queued float64 `json:"write_queued"`
}

// The group commit's metrics a tick reads.
const (
	metricWriteBatches     = "nodeward_write_batch_seconds_count"
	metricWriteBatchSecs   = "nodeward_write_batch_seconds_sum"
	metricExclusiveSeconds = "nodeward_write_exclusive_seconds_total"
	metricWriteQueued      = "nodeward_write_queued_requests"
)

// countConfigRows fills t's row counts from db (node_configs).
func countConfigRows(ctx context.Context, db *models.DB, t *ConfigTick) error {
	var c struct{ Written, Delivered, Applied int64 }
	err := db.WithContext(ctx).Raw(`SELECT count(*) AS written,
		count(*) FILTER (WHERE delivered_revision = revision) AS delivered,
		count(*) FILTER (WHERE applied_revision = revision) AS applied
		FROM node_configs WHERE revision > 0`).Scan(&c).Error
	t.Written, t.Delivered, t.Applied = c.Written, c.Delivered, c.Applied
	return err
}

// RunConfig performs one config run.
func RunConfig(ctx context.Context, cfg ConfigLoad) (rep ConfigReport, err error) {
	if cfg.Duration == 0 {
		cfg.Duration = time.Second // the scenario issues no commands
	}
	if cfg.Drain <= 0 {
		cfg.Drain = 5 * time.Minute
	}
	if err := cfg.defaults(); err != nil {
		return rep, err
	}
	if cfg.LaggingSamples <= 0 {
		cfg.LaggingSamples = 20
	}
	if cfg.LaggingNodes > 0 && cfg.URL != "" {
		return rep, errors.New("-lagging-nodes seeds the database: it needs the server the tool starts (no -url)")
	}
	rep.Date = time.Now().UTC().Format(time.RFC3339)
	rep.Agents = cfg.Agents
	logf := func(format string, args ...any) { fmt.Fprintf(cfg.Log, "loadtest: "+format+"\n", args...) }

	baseURL, token := cfg.URL, cfg.Token
	var local *localServer
	if baseURL == "" {
		if local, err = startLocal(ctx, cfg.DatabaseURL, cfg.Log); err != nil {
			return rep, err
		}
		defer local.Close()
		baseURL, token = local.URL, local.Token
		rep.Database = local.Dialect
		logf("started the control plane in-process on %s (%s)", baseURL, local.Dialect)
	} else {
		rep.Database = "external"
	}
	u, err := client.CheckURL(baseURL, true)
	if err != nil {
		return rep, err
	}
	if !client.IsLoopbackHost(u.Hostname()) {
		return rep, fmt.Errorf("%s is not a loopback address; the load tool only sends to loopback", baseURL)
	}
	admin := newAdmin(baseURL, token, cfg.Issuers, cfg.CACertificatePEM)
	defer admin.tr.CloseIdleConnections()

	run := randomHex(4)
	up, err := bringUp(ctx, cfg.Config, admin, baseURL, run, logf)
	defer stopWorkers(up.workers)
	rep.Workers, rep.Enrolled, rep.Held = len(up.workers), up.enrolled, up.held
	if err != nil {
		return rep, err
	}

	// One fleet.configure over every ready node.
	var pgdb *models.DB
	if local != nil && local.Dialect == models.Postgres {
		pgdb = local.App.DB
	}
	var commits0 int64
	if pgdb != nil {
		// The commit counter is the whole database's: first a second of
		// the held fleet doing nothing, the baseline to read the rest by.
		_ = pgdb.Exec("SELECT pg_stat_clear_snapshot()").Error
		idle0, _ := pgCommits(ctx, pgdb)
		t0 := time.Now()
		if !sleepCtx(ctx, time.Second) {
			return rep, ctx.Err()
		}
		_ = pgdb.Exec("SELECT pg_stat_clear_snapshot()").Error
		commits0, _ = pgCommits(ctx, pgdb)
		rep.PGIdleCommitsPS = float64(commits0-idle0) / time.Since(t0).Seconds()
	}
	document := map[string]any{"run": run, "listen": ":8080", "workers": 4}
	if cfg.DocumentBytes > 0 {
		document["pad"] = padText(cfg.DocumentBytes)
	}
	body, _ := json.Marshal(map[string]any{"request_id": "lt-config-" + run, "kind": "fleet.configure",
		"targets": []any{map[string]any{"kind": "fleet"}},
		"operation": map[string]any{"format": "loadtest/v1", "document": document,
			"selector": map[string]any{"state": "ready"}, "max_concurrency": max(1, min(cfg.Agents, 10000))}})
	var parent struct {
		OperationID string `json:"operation_id"`
	}
	if cfg.CPUProfile != "" {
		if local == nil {
			return rep, errors.New("-cpuprofile profiles this process: not with -url")
		}
		stop, err := startCPUProfile(cfg.CPUProfile)
		if err != nil {
			return rep, err
		}
		defer stop()
	}
	batches0, err := admin.metricsAll(ctx)
	if err != nil {
		return rep, err
	}
	var rssDone func() int64
	if local != nil {
		rep.SubmitRSSMB = float64(rssKB(os.Getpid())) / 1024
		rssDone = peakRSS(os.Getpid(), 100*time.Millisecond)
		defer func() {
			if rssDone != nil {
				rssDone()
			}
		}()
	}
	submitted := time.Now()
	if _, err := admin.do(ctx, http.MethodPost, "/api/v1/operations", body, &parent); err != nil {
		return rep, err
	}
	logf("submitted fleet.configure %s over %d agents; waiting for it to end", parent.OperationID, up.enrolled)
	probeDone := startProbe(ctx, admin, run, up.boots, cfg.ProbeRate)
	var op struct {
		State  string `json:"state"`
		Counts *struct {
			Total     int `json:"total"`
			Succeeded int `json:"succeeded"`
			Failed    int `json:"failed"`
			Pending   int `json:"pending"`
		} `json:"counts"`
	}
	deadline := submitted.Add(cfg.Drain)
	var nextTick time.Duration
	for {
		if _, err := admin.do(ctx, http.MethodGet, "/api/v1/operations/"+parent.OperationID, nil, &op); err != nil {
			return rep, err
		}
		if at := time.Since(submitted); at >= nextTick && op.Counts != nil {
			tick := ConfigTick{Seconds: at.Seconds(), Pending: op.Counts.Pending,
				Succeeded: op.Counts.Succeeded, Failed: op.Counts.Failed}
			if local != nil {
				if err := countConfigRows(ctx, local.App.DB, &tick); err != nil {
					return rep, err
				}
			}
			m, err := admin.metricsAll(ctx)
			if err != nil {
				return rep, err
			}
			tick.WriteBatches = m[metricWriteBatches] - batches0[metricWriteBatches]
			tick.WriteBatchSecs = m[metricWriteBatchSecs] - batches0[metricWriteBatchSecs]
			tick.ExclusiveSeconds = m[metricExclusiveSeconds] - batches0[metricExclusiveSeconds]
			tick.Queued = m[metricWriteQueued]
			rep.Timeline = append(rep.Timeline, tick)
			rep.MaxUnreported = max(rep.MaxUnreported, tick.Delivered-tick.Applied)
			nextTick = at.Truncate(time.Second) + time.Second
		}
		if op.State == "succeeded" || op.State == "failed" || op.State == "cancelled" {
			rep.ParentEndedSeconds = time.Since(submitted).Seconds()
			probeDone(&rep)
			if rssDone != nil {
				rep.PeakRSSMB = float64(rssDone()) / 1024
				rssDone = nil
			}
			break
		}
		if time.Now().After(deadline) {
			return rep, fmt.Errorf("fleet.configure still %s after %s", op.State, cfg.Drain)
		}
		if !sleepCtx(ctx, 20*time.Millisecond) {
			return rep, ctx.Err()
		}
	}
	if pgdb != nil {
		_ = pgdb.Exec("SELECT pg_stat_clear_snapshot()").Error
		if c, err := pgCommits(ctx, pgdb); err == nil {
			rep.PGCommits = c - commits0
			rep.CommitsPerNode = float64(rep.PGCommits) / float64(max(1, up.enrolled))
		}
	}
	if m, err := admin.metricsAll(ctx); err == nil {
		rep.ChildEndNotices = m["nodeward_fanout_child_end_notices_total"]
		rep.Advances = m[`nodeward_fanout_advances_total{source="prompt"}`] + m[`nodeward_fanout_advances_total{source="interval"}`]
		rep.SweepAdvances = m[`nodeward_fanout_advances_total{source="sweep"}`]
	}
	rep.ParentState = op.State
	if op.Counts != nil {
		rep.Total, rep.Succeeded, rep.Failed = op.Counts.Total, op.Counts.Succeeded, op.Counts.Failed
	}
	logf("parent %s after %.2fs (%d children: %d succeeded, %d failed)", op.State, rep.ParentEndedSeconds, rep.Total, rep.Succeeded, rep.Failed)

	// Stop the workers and gather what they saw.
	for _, w := range up.workers {
		_ = w.stdin.Close()
	}
	var last int64
	for i, w := range up.workers {
		if err := w.read(&w.done); err != nil {
			return rep, fmt.Errorf("worker %d: %w", i, err)
		}
		d := w.done
		rep.Received += d.ConfigsReceived
		rep.Reported += d.ConfigsReported
		rep.AgentErrs += d.Errors
		if rep.FirstErr == "" {
			rep.FirstErr = d.FirstError
		}
		last = max(last, d.LastConfigNS)
	}
	if last > 0 {
		rep.AllAppliedSeconds = time.Unix(0, last).Sub(submitted).Seconds()
	}

	if cfg.LaggingNodes > 0 {
		if err := measureLagging(ctx, &rep, cfg, local, admin, logf); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// measureLagging seeds cfg.LaggingNodes configured nodes and times the
// lagging listing (the real endpoint) and CountLagging.
func measureLagging(ctx context.Context, rep *ConfigReport, cfg ConfigLoad, local *localServer, admin *adminClient, logf func(string, ...any)) error {
	rep.LaggingNodes = cfg.LaggingNodes
	start := time.Now()
	if err := seedConfigured(ctx, local.App.DB, local.Dialect, cfg.LaggingNodes); err != nil {
		return fmt.Errorf("seed configured nodes: %w", err)
	}
	rep.SeedSeconds = time.Since(start).Seconds()
	logf("seeded %d configured nodes in %.1fs; timing the lagging reads", cfg.LaggingNodes, rep.SeedSeconds)
	var page struct {
		Count         int64 `json:"count"`
		NeverReported int64 `json:"never_reported"`
	}
	var gets, counts []int64
	for range cfg.LaggingSamples {
		t0 := time.Now()
		if _, err := admin.do(ctx, http.MethodGet, "/api/v1/config/lagging?limit=100", nil, &page); err != nil {
			return err
		}
		gets = append(gets, time.Since(t0).Microseconds())
		t0 = time.Now()
		n, err := local.App.Fleet.CountLagging(ctx)
		if err != nil {
			return err
		}
		counts = append(counts, time.Since(t0).Microseconds())
		if n != page.Count {
			return fmt.Errorf("CountLagging %d, the listing's count %d", n, page.Count)
		}
	}
	rep.LaggingCount, rep.NeverReported = page.Count, page.NeverReported
	rep.LaggingGetP50, rep.LaggingGetMax = pct(gets, 0.5), pct(gets, 1)
	rep.CountP50, rep.CountMax = pct(counts, 0.5), pct(counts, 1)
	return nil
}

// Seeded configured nodes: every tenth never reported, of the others
// every odd one lagging (applied revision 1 of 2), the rest applied.
func seededLagging(n int) (lagging, never int64) {
	for i := 1; i <= n; i++ {
		switch {
		case i%10 == 0:
			never++
		case i%2 == 1:
			lagging++
		}
	}
	return lagging, never
}

// seedConfigured inserts n ready nodes and their node_configs rows in
// two INSERT … SELECT statements (straight into the tables: the cost
// measured is the reads', not the writes').
func seedConfigured(ctx context.Context, db *models.DB, dialect string, n int) error {
	now := dbtime.Norm(time.Now())
	lease := now.Add(24 * time.Hour)
	series, id := "generate_series(1, ?) AS s(i)", "'ltlag_' || lpad(i::text, 8, '0')"
	prefix, ts := "", "CAST(? AS TIMESTAMPTZ)"
	if dialect != models.Postgres {
		ts = "?"
		prefix = "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < ?) "
		series, id = "s", "'ltlag_' || printf('%08d', i)"
	}
	nodes := prefix + `INSERT INTO nodes (id, rental_id, generation, state, fencing_token, created_at, updated_at, enrolled_at, lease_expires_at)
		SELECT ` + id + `, 'ltlag-' || i, 1, 'ready', 1, ?, ?, ?, ? FROM ` + series
	configs := prefix + `INSERT INTO node_configs (node_id, revision, hash, format, updated_at, operation_id, settled,
			reported_revision, reported_hash, reported_state, reported_message, reported_at, reported_fencing, applied_revision, lagging)
		SELECT ` + id + `, 2, 'h2', 'loadtest/v1', ?, '',
			i % 10 <> 0 AND i % 2 = 0,
			CASE WHEN i % 10 = 0 THEN NULL WHEN i % 2 = 1 THEN 1 ELSE 2 END,
			CASE WHEN i % 10 = 0 THEN NULL WHEN i % 2 = 1 THEN 'h1' ELSE 'h2' END,
			CASE WHEN i % 10 = 0 THEN NULL ELSE 'applied' END,
			CASE WHEN i % 10 = 0 THEN NULL ELSE '' END,
			CASE WHEN i % 10 = 0 THEN NULL ELSE ` + ts + ` END,
			CASE WHEN i % 10 = 0 THEN NULL ELSE 1 END,
			CASE WHEN i % 10 = 0 THEN 0 WHEN i % 2 = 1 THEN 1 ELSE 2 END,
			i % 10 <> 0 AND i % 2 = 1
		FROM ` + series
	var nodeArgs, configArgs []any
	if dialect != models.Postgres {
		nodeArgs, configArgs = []any{n, now, now, now, lease}, []any{n, now, now}
	} else {
		nodeArgs, configArgs = []any{now, now, now, lease, n}, []any{now, now, n}
	}
	g := db.WithContext(ctx)
	if err := g.Exec(nodes, nodeArgs...).Error; err != nil {
		return err
	}
	if err := g.Exec(configs, configArgs...).Error; err != nil {
		return err
	}
	if dialect == models.Postgres {
		return g.Exec("ANALYZE nodes; ANALYZE node_configs").Error
	}
	return g.Exec("ANALYZE").Error
}

func printConfigReport(w io.Writer, r ConfigReport) {
	fmt.Fprintf(w, "date                     %s\n", r.Date)
	fmt.Fprintf(w, "database                 %s\n", r.Database)
	fmt.Fprintf(w, "agents                   %d in %d workers (%d long-polls held)\n", r.Enrolled, r.Workers, r.Held)
	fmt.Fprintf(w, "fleet.configure          %s: %d children, %d succeeded, %d failed\n", r.ParentState, r.Total, r.Succeeded, r.Failed)
	fmt.Fprintf(w, "agents                   %d configurations received, %d reported applied (agent errors %d)\n", r.Received, r.Reported, r.AgentErrs)
	if r.FirstErr != "" {
		fmt.Fprintf(w, "first agent error        %s\n", r.FirstErr)
	}
	fmt.Fprintf(w, "submit → all applied     %.2fs (last report acknowledged)\n", r.AllAppliedSeconds)
	fmt.Fprintf(w, "submit → parent ended    %.2fs\n", r.ParentEndedSeconds)
	if r.PGCommits > 0 {
		fmt.Fprintf(w, "postgres commits         %d = %.2f per node (whole database, submit → parent ended; %.0f/s idle before the submit)\n",
			r.PGCommits, r.CommitsPerNode, r.PGIdleCommitsPS)
	}
	if r.PeakRSSMB > 0 {
		fmt.Fprintf(w, "memory (this process)    %.0f MB at the submit, peak %.0f MB until the parent ended (RSS every 100 ms)\n", r.SubmitRSSMB, r.PeakRSSMB)
	}
	if r.ProbeSubmits > 0 {
		fmt.Fprintf(w, "probe submits            %d single commands during the wave (errors %d): ms p50 %.1f  p99 %.1f  max %.1f\n",
			r.ProbeSubmits, r.ProbeErrors, r.ProbeP50, r.ProbeP99, r.ProbeMax)
	}
	if r.ChildEndNotices > 0 {
		fmt.Fprintf(w, "parent advances          %.0f for %.0f child-end notices (+%.0f by the periodic sweep)\n", r.Advances, r.ChildEndNotices, r.SweepAdvances)
	}
	if len(r.Timeline) > 0 {
		fmt.Fprintf(w, "children by second       ")
		for _, t := range r.Timeline {
			fmt.Fprintf(w, " %.0fs:%d/%d", t.Seconds, t.Succeeded+t.Failed, t.Pending)
		}
		fmt.Fprintln(w, " (ended/open)")
		if r.Timeline[len(r.Timeline)-1].Written > 0 {
			fmt.Fprintf(w, "configurations by second ")
			for _, t := range r.Timeline {
				fmt.Fprintf(w, " %.0fs:%d/%d/%d", t.Seconds, t.Written, t.Delivered, t.Applied)
			}
			fmt.Fprintln(w, " (written/delivered/applied)")
			fmt.Fprintf(w, "delivered, not applied   at most %d at a tick (nodes whose report had not landed)\n", r.MaxUnreported)
		}
		fmt.Fprintf(w, "write batches by second  ")
		var prev ConfigTick
		for _, t := range r.Timeline {
			n := t.WriteBatches - prev.WriteBatches
			avg := 0.0
			if n > 0 {
				avg = 1000 * (t.WriteBatchSecs - prev.WriteBatchSecs) / n
			}
			fmt.Fprintf(w, " %.0fs:%.0f/%.0f/%.0f", t.Seconds, n, avg, 1000*(t.ExclusiveSeconds-prev.ExclusiveSeconds))
			prev = t
		}
		fmt.Fprintln(w, " (batches ended, their mean ms, ms the exclusive lane held the others back)")
		fmt.Fprintf(w, "write queue by second    ")
		for _, t := range r.Timeline {
			fmt.Fprintf(w, " %.0fs:%.0f", t.Seconds, t.Queued)
		}
		fmt.Fprintln(w, " (requests waiting for their batch at the tick)")
	}
	if r.LaggingNodes > 0 {
		fmt.Fprintf(w, "lagging seeded           %d nodes in %.1fs: count %d, never reported %d\n", r.LaggingNodes, r.SeedSeconds, r.LaggingCount, r.NeverReported)
		fmt.Fprintf(w, "GET /config/lagging ms   p50 %.2f  max %.2f\n", r.LaggingGetP50, r.LaggingGetMax)
		fmt.Fprintf(w, "CountLagging ms          p50 %.2f  max %.2f\n", r.CountP50, r.CountMax)
	}
}

// startProbe submits a single command every 1/rate seconds, round robin
// over the agents, each in its own goroutine so that one held back does
// not delay the next, until the function it answers is called; that
// waits for the submits in flight and writes their figures into rep.
// A rate of 0 probes nothing.
func startProbe(ctx context.Context, admin *adminClient, run string, boots []api.Bootstrap, rate float64) func(*ConfigReport) {
	if rate <= 0 || len(boots) == 0 {
		return func(*ConfigReport) {}
	}
	stop := make(chan struct{})
	var (
		mu     sync.Mutex
		us     []int64
		errs   int
		wg     sync.WaitGroup
		ticker = time.NewTicker(time.Duration(float64(time.Second) / rate))
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer ticker.Stop()
		for i := 0; ; i++ {
			if i > 0 { // the first at once: a short wave is probed too
				select {
				case <-stop:
					return
				case <-ctx.Done():
					return
				case <-ticker.C:
				}
			}
			op := "lt-probe-" + run + "-" + strconv.Itoa(i)
			body := `{"kind":"prepare_image","operation_id":"` + op + `","payload":{"image":"probe"}}`
			path := "/api/v1/nodes/" + boots[i%len(boots)].NodeID + "/commands"
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				_, err := admin.do(ctx, http.MethodPost, path, []byte(body), nil)
				took := time.Since(start)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs++
					return
				}
				us = append(us, took.Microseconds())
			}()
		}
	}()
	return func(rep *ConfigReport) {
		close(stop)
		wg.Wait()
		rep.ProbeSubmits, rep.ProbeErrors = len(us)+errs, errs
		rep.ProbeP50, rep.ProbeP99, rep.ProbeMax = pct(us, 0.5), pct(us, 0.99), pct(us, 1)
	}
}

// peakRSS samples a process's resident set every interval until the
// function it answers is called, which answers the peak in KiB.
func peakRSS(pid int, every time.Duration) func() int64 {
	stop, done := make(chan struct{}), make(chan int64, 1)
	go func() {
		peak := rssKB(pid)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-stop:
				done <- max(peak, rssKB(pid))
				return
			case <-t.C:
				peak = max(peak, rssKB(pid))
			}
		}
	}()
	return func() int64 {
		close(stop)
		return <-done
	}
}

// padText answers n bytes of words drawn from a small vocabulary by a
// fixed sequence, with a number now and then: text that Postgres's TOAST
// compression shrinks to about a third (250,000 bytes stored in 78,059),
// as it would a real configuration document, and the same in every run.
func padText(n int) string {
	words := strings.Fields(`server listen upstream location proxy_pass timeout retries backend
		weight health_check interval path header value enabled replicas region zone cache size max min
		limit burst tls certificate key cipher protocol route match prefix rewrite log level format`)
	var b strings.Builder
	b.Grow(n + 16)
	x := uint32(2463534242)
	for b.Len() < n {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b.WriteString(words[x%uint32(len(words))])
		b.WriteByte(' ')
		if x%7 == 0 {
			b.WriteString(strconv.FormatUint(uint64(x%100000), 10))
			b.WriteByte(' ')
		}
	}
	return b.String()[:n]
}
