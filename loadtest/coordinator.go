package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/agent/client"
	"github.com/nodeward/nodeward/models"
)

// Config is one load run.
type Config struct {
	Agents          int           // simulated agents, each holding a long-poll
	AgentsPerWorker int           // agents per worker process (fds: DECISIONS §31)
	Rate            float64       // commands issued per second; 0 = as fast as Issuers allow
	Issuers         int           // concurrent issue requests at most
	Duration        time.Duration // how long commands are issued
	Wait            time.Duration // long-poll wait the agents ask for
	Heartbeat       time.Duration // per-agent heartbeat interval; 0 = none
	Drain           time.Duration // how long to wait for the last commands to settle
	// PollsTogether gives every agent's first poll the full Wait, so the
	// fleet re-polls in one wave (workerJob.SpreadPolls); by default the
	// first waits are spread and the fleet re-polls at a steady rate.
	PollsTogether bool

	// DatabaseURL selects Postgres for the server the tool starts (a
	// private schema in that database); empty is SQLite.
	DatabaseURL string
	// URL and Token target a running server instead (loopback only).
	URL, Token string
	// Replicas are further servers sharing URL's database (and Token):
	// the workers are spread over all of them, commands are issued round
	// robin through them and their metrics are summed.
	Replicas []string
	// FanOut, when > 0, issues each command as a fleet.command operation
	// over FanOut nodes (POST /api/v1/operations) instead of one node
	// command; Rate then counts operations.
	FanOut int
	// PayloadBytes pads every command's payload (an env entry of words)
	// to about this many bytes: a large fan-out payload's cost.
	PayloadBytes int
	// MaxConcurrency is each fleet.command's max_concurrency; 0 hands
	// all FanOut children out at once. Below FanOut the fan-out rolls:
	// its held children are released as others end.
	MaxConcurrency int
	// IssueWherePolled issues each command through the replica its node's
	// agent polls rather than round robin: for stand-ins that share no
	// database (the floor's processes).
	IssueWherePolled bool
	// OnWindow, when set, runs at the start (begin) and the end of the
	// issue window (the -replicas runs sample the server processes).
	OnWindow func(ctx context.Context, begin bool)
	// OnPhase, when set, runs as each step of the bring-up ends
	// ("invitations", "enrollments", "first polls held"), so the -replicas
	// runs can say what held the servers back in which step.
	OnPhase func(ctx context.Context, phase string)
	// P99Target is the issue→receipt p99 (ms) above which the report
	// names the tail's causes (0: never).
	P99Target float64
	// PGStatURL is a Postgres the server uses, sampled for wait events
	// over the window when the server is not in this process.
	PGStatURL string
	// CACertificatePEM is trusted for an https URL (the hold scenario's
	// throwaway CA).
	CACertificatePEM string
	// OnHeld, when set, runs once every agent holds its poll, before
	// anything is issued (the hold scenario samples memory there).
	OnHeld func(ctx context.Context, held int)

	PGBench    bool   // run the pgbench reference on DatabaseURL afterwards
	CPUProfile string // profile this process (server included) while issuing
	MemProfile string // heap profile of this process once every poll is held
	// AllocProfile names the allocations profile of this process (server
	// included) at the end of the issue phase; AllocProfile+".base" is the
	// one at its start, to subtract (pprof -base).
	AllocProfile string
	// WorkerCommand runs a worker; default: this executable.
	WorkerCommand []string
	Log           io.Writer // progress and the server's warnings
}

func (c *Config) defaults() error {
	if c.Agents <= 0 {
		return errors.New("agents must be at least 1")
	}
	if c.AgentsPerWorker <= 0 {
		c.AgentsPerWorker = 2500
	}
	if c.Issuers <= 0 {
		c.Issuers = 64
	}
	if c.Rate < 0 {
		return errors.New("rate must not be negative")
	}
	if c.Duration <= 0 || c.Duration > 30*time.Minute {
		return errors.New("duration must be between 0 and 30m")
	}
	if c.Wait <= 0 {
		c.Wait = 25 * time.Second
	}
	if c.Drain <= 0 {
		c.Drain = 20 * time.Second
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	if (c.URL == "") != (c.Token == "") {
		return errors.New("-url and -token go together")
	}
	if c.PGBench && c.DatabaseURL == "" {
		return errors.New("-pgbench needs a Postgres URL")
	}
	if len(c.WorkerCommand) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		c.WorkerCommand = []string{exe}
	}
	return nil
}

// Report is what a run measured.
type Report struct {
	Date       string  `json:"date"`
	Database   string  `json:"database"`
	Agents     int     `json:"agents"`
	Workers    int     `json:"workers"`
	Enrolled   int     `json:"enrolled"`
	InvitesPS  float64 `json:"invites_per_s"`
	EnrollPS   float64 `json:"enrollments_per_s"`
	Held       int     `json:"long_polls_held"`
	TargetRate float64 `json:"target_rate"`
	// FanOut is the nodes per fleet.command operation (0: single node
	// commands); IssuedOps counts those operations, Issued their commands.
	FanOut    int   `json:"fan_out,omitempty"`
	IssuedOps int64 `json:"issued_operations,omitempty"`
	// EndedOps counts the fan-outs seen ended within the window when
	// saturation fan-out runs closed-loop (-fanout N -rate 0).
	EndedOps  int64   `json:"ended_operations,omitempty"`
	Seconds   float64 `json:"seconds"`
	Issued    int64   `json:"issued"`
	IssueErrs int64   `json:"issue_errors"`
	// Missed counts commands scheduled but not sent by the end of the
	// window because the issue requests fell behind.
	Missed   int64   `json:"missed"`
	IssuedPS float64 `json:"issued_per_s"`
	Received int64   `json:"received"`
	Settled  int64   `json:"settled"`
	// SettledPS counts commands settled during the issue window only.
	SettledPS float64 `json:"settled_per_s"`
	AgentErrs int64   `json:"agent_errors"`
	FirstErr  string  `json:"first_error,omitempty"`
	// Latencies in milliseconds: intended issue time → agent's receipt;
	// server's issued_at → receipt; intended issue time → settle answered.
	SentP50, SentP90, SentP99, SentMax float64
	IssuedP50, IssuedP99               float64
	SettleP50, SettleP99               float64
	Heartbeats                         int64   `json:"heartbeats"`
	HeartbeatsPS                       float64 `json:"heartbeats_per_s"`
	RenewalsFlushed                    float64 `json:"renewals_flushed"`
	// PollHandoffs counts the polls answered with commands the submitting
	// transaction claimed for them; PollDirectClaims those that claimed
	// after a wake-up by a command this replica recorded.
	PollHandoffs     float64 `json:"long_poll_handoffs"`
	PollDirectClaims float64 `json:"long_poll_direct_claims"`
	// SettleStatements counts the statements that settled the agents'
	// result requests over the issue window (Postgres), SettleRequests
	// the requests they settled.
	SettleStatements float64 `json:"settle_statements"`
	SettleRequests   float64 `json:"settle_requests"`
	// IssueStatements counts the statements that recorded several command
	// submits together (Postgres), IssueShared the submits they recorded.
	IssueStatements float64 `json:"issue_statements"`
	IssueShared     float64 `json:"issue_shared"`
	// PollsAnswered counts the long-polls the server answered over the
	// issue window; PollsEmpty those of them not carrying a first delivery
	// (answered at their deadline: the fleet re-polling). PollsTogether
	// says whether the fleet's first polls were spread (Config).
	PollsAnswered float64 `json:"polls_answered"`
	PollsEmpty    float64 `json:"polls_answered_empty"`
	PollsTogether bool    `json:"polls_together"`
	// PGCommitsPS is the Postgres database's commits/s during the window.
	PGCommitsPS float64 `json:"pg_commits_per_s,omitempty"`
	PGBenchTPS  float64 `json:"pgbench_tps,omitempty"`
	// CPU over the issue window: the machine's busy share, and the cores
	// used by this process (server and issuers when the server runs
	// here), the workers, and everything else (the database server,
	// other load on the machine).
	CPU struct {
		Cores, MachineBusy, Self, Workers, Rest float64
	}
	// Replicas are the server processes over the issue window (the
	// -binary and -replicas runs).
	Replicas []ReplicaStat `json:"replicas,omitempty"`
	// Wave is the server's fan-out and write-path counters from the
	// window's start to the drain's end (fan-outs only): a fan-out that
	// outlasts the window, one over the whole fleet above all, does most
	// of its work in the drain, which the window's figures miss.
	Wave *WaveCounters `json:"wave,omitempty"`
	// Tail is the evidence about the tail latency (causes named when
	// SentP99 exceeded the target).
	Tail TailCause `json:"tail"`
}

type worker struct {
	url   string   // the server its agents dial
	nodes []string // its agents' node ids
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
	done  workerMsg
}

// Run performs one load run and answers its report. Every phase is bounded
// in time; ctx ends it early.
func Run(ctx context.Context, cfg Config) (rep Report, err error) {
	if err := cfg.defaults(); err != nil {
		return rep, err
	}
	rep.Date = time.Now().UTC().Format(time.RFC3339)
	rep.Agents, rep.TargetRate = cfg.Agents, cfg.Rate
	logf := func(format string, args ...any) { fmt.Fprintf(cfg.Log, "loadtest: "+format+"\n", args...) }

	baseURL, token := cfg.URL, cfg.Token
	var local *localServer
	var pgdb *models.DB
	if baseURL == "" {
		local, err = startLocal(ctx, cfg.DatabaseURL, cfg.Log)
		if err != nil {
			return rep, err
		}
		defer local.Close()
		baseURL, token = local.URL, local.Token
		rep.Database = local.Dialect
		if local.Dialect == models.Postgres {
			pgdb = local.App.DB
		}
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
	for _, u := range cfg.Replicas {
		if pu, err := client.CheckURL(u, true); err != nil || !client.IsLoopbackHost(pu.Hostname()) {
			return rep, fmt.Errorf("%s is not a loopback address; the load tool only sends to loopback", u)
		}
		peer := newAdmin(u, token, cfg.Issuers, cfg.CACertificatePEM)
		defer peer.tr.CloseIdleConnections()
		admin.peers = append(admin.peers, peer)
	}
	rep.FanOut = cfg.FanOut

	run := randomHex(4)
	up, err := bringUp(ctx, cfg, admin, baseURL, run, logf)
	defer stopWorkers(up.workers)
	rep.InvitesPS, rep.Workers, rep.Enrolled, rep.EnrollPS, rep.Held = up.invitesPS, len(up.workers), up.enrolled, up.enrollPS, up.held
	if err != nil {
		return rep, err
	}
	boots, workers := up.boots, up.workers
	if cfg.OnHeld != nil {
		cfg.OnHeld(ctx, rep.Held)
	}
	// What the server's memory is made of while it holds every poll (the
	// Go collector's figures): live heap, stacks, and the heap goal the
	// collector lets garbage grow to.
	if m, err := admin.metrics(ctx); err == nil && m["go_goroutines"] > 0 { // the floor serves no Go metrics
		mb := func(name string) float64 { return m[name] / (1 << 20) }
		logf("server memory holding %d polls: heap in use %.1f MB, stacks %.1f MB, next GC at %.1f MB, heap from OS %.1f MB (released %.1f MB), all the Go runtime's from OS %.1f MB, %d goroutines; GC percent %.0f (memory policy %s)",
			rep.Held, mb("go_memstats_heap_inuse_bytes"), mb("go_memstats_stack_inuse_bytes"), mb("go_memstats_next_gc_bytes"),
			mb("go_memstats_heap_sys_bytes"), mb("go_memstats_heap_released_bytes"), mb("go_memstats_sys_bytes"), int(m["go_goroutines"]),
			m["nodeward_gc_percent"], map[bool]string{true: "on", false: "off"}[m["nodeward_memory_policy_active"] == 1])
	}
	if cfg.MemProfile != "" {
		if err := writeHeapProfile(cfg.MemProfile); err != nil {
			return rep, err
		}
	}
	logf("%d long-polls held; issuing for %s at %s", rep.Held, cfg.Duration, rateName(cfg.Rate))

	before, err := admin.metricsAll(ctx)
	if err != nil {
		return rep, err
	}
	var commits0 int64
	if pgdb != nil {
		_ = pgdb.Exec("SELECT pg_stat_clear_snapshot()").Error
		commits0, _ = pgCommits(ctx, pgdb)
	}
	if cfg.AllocProfile != "" {
		if err := writeAllocsProfile(cfg.AllocProfile + ".base"); err != nil {
			return rep, err
		}
	}
	stopProfile := func() {}
	if cfg.CPUProfile != "" {
		var err error
		if stopProfile, err = startCPUProfile(cfg.CPUProfile); err != nil {
			return rep, err
		}
		defer stopProfile()
	}
	busy0, total0 := machineCPU()
	self0, workers0 := processCPU(os.Getpid()), 0.0
	for _, w := range workers {
		workers0 += processCPU(w.cmd.Process.Pid)
	}
	nodes := make([]string, len(boots))
	for i, b := range boots {
		nodes[i] = b.NodeID
	}
	if cfg.OnWindow != nil {
		cfg.OnWindow(ctx, true)
	}
	statURL := cfg.PGStatURL
	if local != nil {
		statURL = local.SchemaURL
	}
	probe := startTailProbe(ctx, statURL)
	defer probe.stop()
	if cfg.IssueWherePolled {
		admin.polledAt = polledAt(admin, workers)
	}
	start := time.Now()
	var missed atomic.Int64
	admin.fanOut, admin.maxConcurrency = cfg.FanOut, cfg.MaxConcurrency
	if cfg.PayloadBytes > 0 {
		admin.pad = `,"` + padKey + `":"` + padText(cfg.PayloadBytes) + `"`
	}
	issued, issueErrs := admin.issue(ctx, run, nodes, cfg.Rate, cfg.Duration, &missed, logf)
	rep.Missed, rep.EndedOps = missed.Load(), admin.ended.Load()
	window := time.Since(start).Seconds()
	if cfg.OnWindow != nil {
		cfg.OnWindow(ctx, false)
	}
	probe.stop()
	if cfg.FanOut > 0 {
		// issue counted operations; each is FanOut commands.
		rep.IssuedOps = issued
		issued *= int64(min(cfg.FanOut, len(nodes)))
		issueErrs *= int64(min(cfg.FanOut, len(nodes)))
	}
	stopProfile()
	if cfg.AllocProfile != "" {
		if err := writeAllocsProfile(cfg.AllocProfile); err != nil {
			return rep, err
		}
	}
	busy1, total1 := machineCPU()
	rep.CPU.Cores = float64(runtime.NumCPU())
	if total1 > total0 {
		rep.CPU.MachineBusy = (busy1 - busy0) / (total1 - total0)
	}
	rep.CPU.Self = (processCPU(os.Getpid()) - self0) / window
	for _, w := range workers {
		rep.CPU.Workers += processCPU(w.cmd.Process.Pid)
	}
	rep.CPU.Workers = (rep.CPU.Workers - workers0) / window
	rep.CPU.Rest = rep.CPU.MachineBusy*rep.CPU.Cores - rep.CPU.Self - rep.CPU.Workers
	after, err := admin.metricsAll(ctx)
	if err != nil {
		return rep, err
	}
	if pgdb != nil {
		_ = pgdb.Exec("SELECT pg_stat_clear_snapshot()").Error
		if c, err := pgCommits(ctx, pgdb); err == nil {
			rep.PGCommitsPS = float64(c-commits0) / window
		}
	}
	rep.Seconds, rep.Issued, rep.IssueErrs = window, issued, issueErrs
	rep.IssuedPS = float64(issued) / window
	const settledApplied = `nodeward_commands_settled_total{state="applied"}`
	rep.SettledPS = (after[settledApplied] - before[settledApplied]) / window
	rep.RenewalsFlushed = after["nodeward_lease_renewals_flushed_total"] - before["nodeward_lease_renewals_flushed_total"]
	rep.PollHandoffs = after["nodeward_long_poll_handoffs_total"] - before["nodeward_long_poll_handoffs_total"]
	rep.PollDirectClaims = after["nodeward_long_poll_direct_claims_total"] - before["nodeward_long_poll_direct_claims_total"]
	rep.SettleStatements = after["nodeward_write_settle_statements_total"] - before["nodeward_write_settle_statements_total"]
	rep.SettleRequests = after["nodeward_write_settle_requests_total"] - before["nodeward_write_settle_requests_total"]
	rep.IssueStatements = after["nodeward_write_issue_statements_total"] - before["nodeward_write_issue_statements_total"]
	rep.IssueShared = after["nodeward_write_issue_requests_total"] - before["nodeward_write_issue_requests_total"]
	rep.PollsAnswered, rep.PollsEmpty = pollsAnswered(before, after)
	rep.PollsTogether = cfg.PollsTogether
	logf("issued %d (%.0f/s, %d errors); settled %.0f/s during the window; draining", issued, rep.IssuedPS, issueErrs, rep.SettledPS)

	// Drain: let the last commands settle.
	deadline := time.Now().Add(cfg.Drain)
	for time.Now().Before(deadline) {
		m, err := admin.metricsAll(ctx)
		if err != nil || m[settledApplied]-before[settledApplied] >= float64(issued) {
			break
		}
		if !sleepCtx(ctx, 100*time.Millisecond) {
			break
		}
	}

	if cfg.FanOut > 0 {
		if m, err := admin.metricsAll(ctx); err == nil {
			rep.Wave = waveCounters(before, m, time.Since(start))
		}
	}
	// Stop the workers and gather what they saw.
	var sent, issuedLat, settle []int64
	for _, w := range workers {
		_ = w.stdin.Close()
	}
	for i, w := range workers {
		if err := w.read(&w.done); err != nil {
			return rep, fmt.Errorf("worker %d: %w", i, err)
		}
		d := w.done
		rep.Received += d.Received
		rep.Settled += d.Settled
		rep.Heartbeats += d.Heartbeats
		rep.AgentErrs += d.Errors
		if rep.FirstErr == "" {
			rep.FirstErr = d.FirstError
		}
		sent = append(sent, d.SentLatUS...)
		issuedLat = append(issuedLat, d.IssuedLatUS...)
		settle = append(settle, d.SettleLatUS...)
	}
	rep.SentP50, rep.SentP90, rep.SentP99, rep.SentMax = pct(sent, 0.5), pct(sent, 0.9), pct(sent, 0.99), pct(sent, 1)
	rep.IssuedP50, rep.IssuedP99 = pct(issuedLat, 0.5), pct(issuedLat, 0.99)
	rep.SettleP50, rep.SettleP99 = pct(settle, 0.5), pct(settle, 0.99)
	rep.Tail = probe.finish(&rep, cfg.P99Target, before, after)
	if cfg.Heartbeat > 0 {
		rep.HeartbeatsPS = float64(rep.Heartbeats) / window
	}

	if cfg.PGBench {
		logf("running the pgbench reference")
		if rep.PGBenchTPS, err = pgbench(ctx, cfg.DatabaseURL, cfg.Log); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// polledAt maps each node to the client of the replica its agent polls.
func polledAt(admin *adminClient, workers []*worker) map[string]*adminClient {
	byURL := map[string]*adminClient{admin.url: admin}
	for _, p := range admin.peers {
		byURL[p.url] = p
	}
	out := map[string]*adminClient{}
	for _, w := range workers {
		for _, n := range w.nodes {
			out[n] = byURL[w.url]
		}
	}
	return out
}

// fleetUp is a fleet of simulated agents, enrolled and holding polls.
type fleetUp struct {
	boots               []api.Bootstrap
	workers             []*worker // stopWorkers them, even after an error
	invitesPS, enrollPS float64
	enrolled, held      int
}

// bringUp invites cfg.Agents nodes through the admin API, starts the
// workers that enroll them, and waits until every agent holds its
// long-poll.
func bringUp(ctx context.Context, cfg Config, admin *adminClient, baseURL, run string, logf func(string, ...any)) (up fleetUp, err error) {
	start := time.Now()
	if up.boots, err = admin.inviteAll(ctx, run, cfg.Agents); err != nil {
		return up, err
	}
	up.invitesPS = float64(len(up.boots)) / time.Since(start).Seconds()
	logf("invited %d nodes (%.0f/s)", len(up.boots), up.invitesPS)
	phase := func(name string) {
		if cfg.OnPhase != nil {
			cfg.OnPhase(ctx, name)
		}
	}
	phase("invitations")

	// Workers, each enrolling and then holding its share of the agents,
	// stop by themselves past the enrollments' time (counted from here:
	// 50,000 invitations alone take minutes), the window and the drain.
	start = time.Now()
	hardStop := start.Add(cfg.Duration + cfg.Drain + 20*time.Minute)
	up.workers, err = startWorkers(cfg, workerJob{URL: baseURL, CACertificatePEM: cfg.CACertificatePEM, Wait: cfg.Wait, SpreadPolls: !cfg.PollsTogether, PollOnEnroll: true,
		Heartbeat: cfg.Heartbeat, Enrollers: 16, StopBy: hardStop.UnixNano()}, up.boots, cfg.AgentsPerWorker)
	if err != nil {
		return up, err
	}
	var shed, retried int64
	for i, w := range up.workers {
		var m workerMsg
		if err := w.read(&m); err != nil {
			return up, fmt.Errorf("worker %d: %w", i, err)
		}
		if m.Failed > 0 {
			return up, fmt.Errorf("worker %d: %d enrollments failed: %s", i, m.Failed, m.Error)
		}
		up.enrolled += m.Enrolled
		shed += m.EnrollsShed
		retried += m.EnrollRetries
	}
	up.enrollPS = float64(up.enrolled) / time.Since(start).Seconds()
	logf("%d workers enrolled %d agents (%.0f/s; tried again: %d shed, %d after another failure)", len(up.workers), up.enrolled, up.enrollPS, shed, retried)
	phase("enrollments")

	// Wait until every agent holds its long-poll.
	deadline := time.Now().Add(2 * time.Minute)
	need := heldNeeded(up.enrolled, cfg.PollsTogether)
	for {
		m, err := admin.metricsAll(ctx)
		if err != nil {
			return up, err
		}
		up.held = int(m["nodeward_open_long_polls"])
		if up.held >= need {
			phase("first polls held")
			return up, nil
		}
		if time.Now().After(deadline) {
			return up, fmt.Errorf("only %d of %d long-polls held after 2m", up.held, up.enrolled)
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return up, ctx.Err()
		}
	}
}

// heldNeeded is how many held polls count as the whole fleet holding: all
// of them when the fleet's first polls last the full wait; with spread
// polls the fleet re-polls all the time, and at any instant a few agents
// are between one poll's answer and the next (1 % is allowed).
func heldNeeded(agents int, together bool) int {
	if together {
		return agents
	}
	return agents - agents/100
}

// pollsAnswered answers the long-polls the server answered between two
// scrapes (status 200), and how many of them carried no first delivery.
func pollsAnswered(before, after map[string]float64) (answered, empty float64) {
	const polls = `nodeward_http_requests_total{method="GET",route="/agent/v1/commands",status="200"}`
	const delivered = "nodeward_command_delivery_latency_seconds_count"
	answered = after[polls] - before[polls]
	return answered, max(0, answered-(after[delivered]-before[delivered]))
}

func rateName(r float64) string {
	if r == 0 {
		return "full speed"
	}
	return strconv.FormatFloat(r, 'f', -1, 64) + " commands/s"
}

// pct answers the q-quantile of µs samples in milliseconds.
func pct(us []int64, q float64) float64 {
	if len(us) == 0 {
		return 0
	}
	s := slices.Clone(us)
	slices.Sort(s)
	i := min(len(s)-1, int(q*float64(len(s))))
	return float64(s[i]) / 1000
}

// startWorkers starts one worker process per perWorker agents, each
// dialling from its own loopback source address (127.0.0.2, .3, ...).
// It answers the workers it started even on error: stopWorkers them.
func startWorkers(cfg Config, job workerJob, agents []api.Bootstrap, perWorker int) ([]*worker, error) {
	if n := len(cfg.Replicas) + 1; n > 1 {
		// As many workers on every replica, each under perWorker.
		workers := (len(agents) + perWorker - 1) / perWorker
		workers = (workers + n - 1) / n * n
		perWorker = max(1, (len(agents)+workers-1)/workers)
	}
	var workers []*worker
	for i := 0; i*perWorker < len(agents); i++ {
		j := job
		j.Agents = agents[i*perWorker : min(len(agents), (i+1)*perWorker)]
		j.SourceIP = fmt.Sprintf("127.0.%d.%d", (i+2)/250, (i+2)%250)
		if len(cfg.Replicas) > 0 {
			// Spread the workers over the replicas.
			urls := append([]string{job.URL}, cfg.Replicas...)
			j.URL = urls[i%len(urls)]
		}
		w, err := startWorker(cfg, j)
		if err != nil {
			return workers, err
		}
		w.url = j.URL
		for _, a := range j.Agents {
			w.nodes = append(w.nodes, a.NodeID)
		}
		workers = append(workers, w)
	}
	return workers, nil
}

// stopWorkers closes the workers' stdin (their signal to stop) and waits
// for them to exit.
func stopWorkers(workers []*worker) {
	for _, w := range workers {
		_ = w.stdin.Close()
	}
	for _, w := range workers {
		_ = w.cmd.Wait()
	}
}

func startWorker(cfg Config, job workerJob) (*worker, error) {
	cmd := exec.Command(cfg.WorkerCommand[0], cfg.WorkerCommand[1:]...)
	cmd.Env = append(os.Environ(), workerEnv+"=1")
	cmd.Stderr = cfg.Log
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start worker: %w", err)
	}
	line, _ := json.Marshal(job)
	if _, err := stdin.Write(append(line, '\n')); err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<30)
	return &worker{cmd: cmd, stdin: stdin, out: sc}, nil
}

func (w *worker) read(m *workerMsg) error {
	if !w.out.Scan() {
		if err := w.out.Err(); err != nil {
			return err
		}
		return errors.New("worker exited early (see its log above)")
	}
	return json.Unmarshal(w.out.Bytes(), m)
}

// adminClient issues through the admin API.
type adminClient struct {
	url, token string
	tr         *http.Transport
	hc         *http.Client
	issuers    int
	// peers are the other replicas: issue goes round robin over a and
	// them, metricsAll sums them.
	peers []*adminClient
	// fanOut > 0 issues fleet.command operations over that many nodes.
	fanOut int
	// maxConcurrency is each fan-out's (Config.MaxConcurrency).
	maxConcurrency int
	// pad is appended to each payload's env (Config.PayloadBytes).
	pad string
	// ended counts the fan-outs an issuer saw end (closed-loop only).
	ended *atomic.Int64
	// polledAt, when set, is the replica each node's agent polls: a
	// command is issued there (Config.IssueWherePolled).
	polledAt map[string]*adminClient
}

func newAdmin(url, token string, issuers int, caPEM string) *adminClient {
	tr := transportFor(caPEM)
	tr.MaxIdleConnsPerHost = issuers + 8
	return &adminClient{url: url, token: token, tr: tr, hc: &http.Client{Transport: tr, Timeout: time.Minute}, issuers: issuers,
		ended: new(atomic.Int64)}
}

func (a *adminClient) do(ctx context.Context, method, path string, body []byte, out any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, method, a.url+path, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err := a.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode/100 != 2 {
		return resp.StatusCode, fmt.Errorf("%s %s answered %d: %s", method, path, resp.StatusCode, bytes.TrimSpace(raw))
	}
	if out != nil {
		return resp.StatusCode, json.Unmarshal(raw, out)
	}
	return resp.StatusCode, nil
}

func (a *adminClient) inviteAll(ctx context.Context, run string, n int) ([]api.Bootstrap, error) {
	out := make([]api.Bootstrap, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var firstErr error
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range min(n, 16) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				body, _ := json.Marshal(map[string]any{"rental_id": "lt-" + run + "-" + strconv.Itoa(i), "generation": 1})
				if _, err := a.do(ctx, http.MethodPost, "/api/v1/nodes/invitations", body, &out[i]); err != nil {
					once.Do(func() { firstErr = err; cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	return out, firstErr
}

// issue sends commands round robin over nodes for d: at rate per second on
// a fixed schedule (each payload stamped with its scheduled time, so a
// lagging issuer shows as latency), or as fast as the issuers go when rate
// is 0. It answers how many were recorded and how many failed.
func (a *adminClient) issue(ctx context.Context, run string, nodes []string, rate float64, d time.Duration, missed *atomic.Int64, logf func(string, ...any)) (issued, failed int64) {
	var ok, bad atomic.Int64
	var firstErr sync.Once
	// Saturating fan-outs run closed-loop: issued open-loop they pile up
	// far faster than they settle and the window measures the backlog,
	// not the throughput.
	closedLoop := rate == 0 && a.fanOut > 0
	start := time.Now()
	end := start.Add(d)
	one := func(seq int64, at time.Time) {
		if time.Now().After(end) {
			// The server fell behind the schedule: what was due by the end
			// and not yet sent is dropped, so the phase ends on time.
			missed.Add(1)
			return
		}
		via := a
		if len(a.peers) > 0 {
			if i := seq % int64(len(a.peers)+1); i > 0 {
				via = a.peers[i-1]
			}
		}
		if c := a.polledAt[nodes[seq%int64(len(nodes))]]; c != nil {
			via = c
		}
		op := "lt-" + run + "-" + strconv.FormatInt(seq, 10)
		payload := `{"run_id":"` + op + `","attempt_id":"1","command":"true","env":{"` + sentKey + `":"` + strconv.FormatInt(at.UnixNano(), 10) + `"` + a.pad + `}}`
		path, body := "", ""
		if a.fanOut > 0 {
			path, body = "/api/v1/operations", fleetCommandBody(op, payload, nodes, seq, a.fanOut, a.maxConcurrency)
		} else {
			node := nodes[seq%int64(len(nodes))]
			path = "/api/v1/nodes/" + node + "/commands"
			body = `{"kind":"launch_workload","operation_id":"` + op + `","payload":` + payload + `}`
		}
		if closedLoop {
			body = fleetCommandWaitBody(body, time.Until(end))
		}
		var answer struct {
			State string `json:"state"`
		}
		if _, err := via.do(ctx, http.MethodPost, path, []byte(body), &answer); err != nil {
			bad.Add(1)
			firstErr.Do(func() { logf("issue: %v", err) })
			return
		}
		ok.Add(1)
		// Closed-loop: wait for the fan-out to end, resubmitting the same
		// request (a replay waits as a submit does), so the issuer's next
		// fan-out starts only once this one has settled.
		for closedLoop && !operationEnded(answer.State) && ctx.Err() == nil && time.Until(end) > time.Millisecond {
			body = fleetCommandWaitBody(body, time.Until(end))
			if _, err := via.do(ctx, http.MethodPost, path, []byte(body), &answer); err != nil {
				firstErr.Do(func() { logf("wait: %v", err) })
				return
			}
		}
		if closedLoop && operationEnded(answer.State) {
			a.ended.Add(1)
		}
	}
	var wg sync.WaitGroup
	var seq atomic.Int64
	if rate == 0 {
		for range a.issuers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil && time.Now().Before(end) {
					one(seq.Add(1)-1, time.Now())
				}
			}()
		}
		wg.Wait()
		return ok.Load(), bad.Load()
	}
	type job struct {
		seq int64
		at  time.Time
	}
	jobs := make(chan job, a.issuers)
	for range a.issuers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				one(j.seq, j.at)
			}
		}()
	}
	interval := time.Duration(float64(time.Second) / rate)
	for i := int64(0); ctx.Err() == nil; i++ {
		at := start.Add(time.Duration(i) * interval)
		if !at.Before(end) {
			break
		}
		if w := time.Until(at); w > time.Millisecond {
			time.Sleep(w)
		}
		jobs <- job{seq: i, at: at}
	}
	close(jobs)
	wg.Wait()
	return ok.Load(), bad.Load()
}

// fleetCommandBody is the seq-th fleet.command operation: the payload
// fanned out over n nodes (the next n round robin), at most maxConcurrency
// of them handed out at once (0: all).
func fleetCommandBody(op, payload string, nodes []string, seq int64, n, maxConcurrency int) string {
	n = min(n, len(nodes))
	if maxConcurrency <= 0 || maxConcurrency > n {
		maxConcurrency = n
	}
	var b strings.Builder
	b.WriteString(`{"request_id":"` + op + `","kind":"fleet.command","targets":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"kind":"node","id":"` + nodes[(seq*int64(n)+int64(i))%int64(len(nodes))] + `"}`)
	}
	b.WriteString(`],"operation":{"kind":"node.launch_workload","payload":` + payload + `,"max_concurrency":` + strconv.Itoa(maxConcurrency) + `}}`)
	return b.String()
}

// fleetCommandWaitBody sets a fleet.command body's wait_timeout_ms to
// left, capped at the server's 60 s maximum (a body built by
// fleetCommandBody, with or without a wait already).
func fleetCommandWaitBody(body string, left time.Duration) string {
	if i := strings.Index(body, `,"wait_timeout_ms":`); i >= 0 {
		body = body[:i] + "}"
	}
	ms := min(max(left.Milliseconds(), 1), 60000)
	return strings.TrimSuffix(body, "}") + `,"wait_timeout_ms":` + strconv.FormatInt(ms, 10) + "}"
}

// operationEnded reports whether an operation state is terminal.
func operationEnded(state string) bool {
	return state == "succeeded" || state == "failed" || state == "cancelled"
}

// metricsAll scrapes a and its peers and sums every series.
func (a *adminClient) metricsAll(ctx context.Context) (map[string]float64, error) {
	out, err := a.metrics(ctx)
	if err != nil {
		return nil, err
	}
	for _, p := range a.peers {
		m, err := p.metrics(ctx)
		if err != nil {
			return nil, err
		}
		mergeReplicaMetrics(out, m)
	}
	return out, nil
}

// mergeReplicaMetrics adds a replica's scrape m into out: counters and
// sizes add up over the replicas, but a setting or a quantile does not (a
// sum of three GC percents or of three longest pauses describes no
// process), so for those out keeps the highest replica's.
func mergeReplicaMetrics(out, m map[string]float64) {
	for k, v := range m {
		if notAdditive(k) {
			if old, ok := out[k]; !ok || v > old {
				out[k] = v
			}
			continue
		}
		out[k] += v
	}
}

// notAdditive names the series mergeReplicaMetrics takes the highest of.
func notAdditive(k string) bool {
	return k == "nodeward_gc_percent" || k == "nodeward_memory_policy_active" ||
		strings.HasPrefix(k, "go_gc_duration_seconds{quantile=")
}

// metrics scrapes the server's /metrics into name{labels} → value.
func (a *adminClient) metrics(ctx context.Context) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.url+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[line[:i]] = v
		}
	}
	return out, sc.Err()
}

// writeProfile writes this process's profile of that name to path.
func writeProfile(name, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup(name).WriteTo(f, 0); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// writeAllocsProfile writes this process's allocations since it started
// (sampled, as the runtime keeps them) to path.
func writeAllocsProfile(path string) error { return writeProfile("allocs", path) }

// writeHeapProfile writes this process's live heap (after a collection, so
// it shows what the held polls keep, not garbage), and its goroutines to
// path+".goroutine".
func writeHeapProfile(path string) error {
	runtime.GC()
	if err := writeProfile("heap", path); err != nil {
		return err
	}
	// The heap profile leaves out goroutine stacks and the collector's
	// headroom: name them beside it (issue 13, memory per held poll).
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Fprintf(os.Stderr, "loadtest: memstats after GC: heap in use %d KB, live %d KB, stacks %d KB, "+
		"heap from OS %d KB (released %d KB), sys %d KB, goroutines %d\n",
		ms.HeapInuse>>10, ms.HeapAlloc>>10, ms.StackInuse>>10, ms.HeapSys>>10, ms.HeapReleased>>10, ms.Sys>>10,
		runtime.NumGoroutine())
	return writeProfile("goroutine", path+".goroutine")
}

// WaveCounters are the server's counters over a fan-out run's window and
// drain (Report.Wave).
type WaveCounters struct {
	Seconds float64 `json:"seconds"`
	// ChildEnds are the child-end notices; Advances the parent advances
	// by what asked for them (prompt, interval, continued, sweep).
	ChildEnds float64            `json:"child_end_notices"`
	Advances  map[string]float64 `json:"advances"`
	// ExclusiveSeconds is how long exclusive write batches held every
	// lane back; GateWaitSeconds what requests waited at the lanes' gate
	// meanwhile, summed.
	ExclusiveSeconds float64 `json:"exclusive_seconds"`
	GateWaitSeconds  float64 `json:"gate_wait_seconds"`
}

// waveCounters answers the counters moved between before and after, over
// a span of elapsed.
func waveCounters(before, after map[string]float64, elapsed time.Duration) *WaveCounters {
	d := func(name string) float64 { return after[name] - before[name] }
	w := &WaveCounters{Seconds: elapsed.Seconds(), ChildEnds: d("nodeward_fanout_child_end_notices_total"), Advances: map[string]float64{},
		ExclusiveSeconds: d("nodeward_write_exclusive_seconds_total"), GateWaitSeconds: d("nodeward_write_lane_gate_wait_seconds_total")}
	for _, source := range []string{"prompt", "interval", "continued", "sweep"} {
		w.Advances[source] = d(`nodeward_fanout_advances_total{source="` + source + `"}`)
	}
	return w
}
