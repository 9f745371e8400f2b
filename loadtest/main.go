// Command loadtest is Nodeward's delivery load tool: simulated agents hold
// long-polls while commands are issued through the admin API at a fixed
// rate, and it reports issue→receipt latency and settled commands per
// second (BENCHMARKS.md has the figures and the commands).
//
//	go run ./loadtest -agents 10000 -rate 1000 -duration 30s
//	go run ./loadtest -db postgres -agents 10000 -rate 1000 -pgbench
//	go run ./loadtest -db postgres -scenario config -agents 10000 -lagging-nodes 50000
//
// By default it starts the control plane in its own process
// (controlplane.Open and Serve: the binary's wiring) on a fresh SQLite data
// folder, or on a private schema of the Postgres database named by
// -database-url (default $NODEWARD_TEST_DATABASE_URL), dropped afterwards.
// -url and -token target a running server instead. Only loopback addresses
// are ever dialled.
//
// The agents run in worker processes (this binary re-executed), at most
// -agents-per-worker each, every worker dialling from its own loopback
// source address (127.0.0.2, 127.0.0.3, ...): a process may hold at most
// 20,000 open files (DECISIONS.md §31). Each agent is a goroutine on its
// worker's shared transport; it enrolls through /agent/v1/enroll with an
// invitation the tool made through the admin API, long-polls, and settles
// each command it receives as applied. Each agent's first poll asks for a
// wait drawn from 1 s to -wait, so the fleet re-polls at a steady
// agents/wait a second, as a running fleet does, wherever the issue
// window falls (-polls-together: every first poll lasts -wait, and the
// fleet re-polls in one wave -wait after its bring-up).
//
// Every phase is bounded: the issue phase by -duration, the drain by
// -drain, the workers by a hard deadline; nothing runs on after the tool.
//
// # Presets (-scenario)
//
// Each prints a human summary, or its report as JSON with -json; -h lists
// every flag. The Postgres runs take -database-url (default
// $NODEWARD_TEST_DATABASE_URL) and use a private schema, dropped after.
//
// deliver (the default): held agents, commands issued at -rate (0:
// saturation, as fast as -issuers go), issue→receipt latency. -fanout N
// issues fleet.command operations over N nodes each (POST
// /api/v1/operations, all N handed out at once) instead of single
// commands, -rate then counting operations. With -rate 0 the fan-outs run
// closed-loop: each of -issuers keeps one fan-out in flight, submitting
// with wait_timeout_ms (and replaying the same request to wait on) until
// it ended, then the next; settled commands/s is then the steady-state
// fan-out throughput, not a backlog still settling after the window
// (-issuers is then the fan-outs in flight: 64 × -fanout 100 is 6,400
// commands outstanding). -binary runs the real server
// binary as a process; -replicas N runs N of them on one Postgres (same
// master key, replica ids loadtest-1…N), the workers spread evenly over
// them, commands issued round robin through them, each process's cores,
// RSS, open files and held polls reported.
//
//	go run ./loadtest -db postgres -agents 10000 -rate 1000 -duration 15s
//	go run ./loadtest -db postgres -agents 10000 -rate 0 -duration 15s
//	go run ./loadtest -db postgres -agents 10000 -rate 10 -fanout 100 -duration 15s
//	go run ./loadtest -db postgres -agents 10000 -rate 0 -fanout 100 -duration 15s
//	go run ./loadtest -db postgres -replicas 3 -agents 50000 -rate 100 -duration 30s
//
// -floor runs the same deliver run against the floor instead of the
// server (cmd/barewaiter -deliver: commands in memory, no database, no
// credentials checked), -replicas N as N floor processes with each
// command issued where its node's agent polls: what this machine's HTTP
// exchanges alone allow, a ceiling for the server's figures of the same
// sitting.
//
//	go run ./loadtest -floor -agents 10000 -rate 0 -duration 15s
//	go run ./loadtest -floor -agents 10000 -rate 0 -fanout 100 -duration 15s
//
// hold: memory per held poll of the server binary against the bare waiter
// (cmd/barewaiter), then commands at -rate (default 100/s); -replicas N on
// Postgres measures each server process.
//
//	go run ./loadtest -scenario hold -agents 10000
//	go run ./loadtest -scenario hold -db postgres -replicas 3 -agents 50000 -rate 100 -duration 30s
//
// storm: the real binary under -agents held agents; a burst of -commands
// is issued and the moment the last is recorded the first replica is
// stopped (-signal kill: SIGKILL, a crash; term: SIGTERM, the drain) and
// started again on the same database and address. It reports, from the
// restart, when the replica was ready, when every agent held a poll again
// and when every command of the burst was settled, and from the agents'
// receipts by operation id the commands lost and applied twice (both must
// be 0) and those redelivered before their settlement was acknowledged.
// A timeline samples the recovery every half second (the resuming polls
// the servers took, the polls held, the commands pending and settled),
// so a slow recovery shows which of them it waited on.
//
//	go run ./loadtest -scenario storm -agents 10000 -commands 5000
//	go run ./loadtest -scenario storm -db postgres -replicas 3 -agents 10000 -commands 5000 -signal term
//
// enroll: invite -agents, then enroll them through /agent/v1/enroll with
// -concurrency enrollments in flight over the workers: enrollments/s and
// each enrollment's latency; in this process, or the binary (-binary,
// -replicas).
//
//	go run ./loadtest -scenario enroll -db postgres -agents 10000 -concurrency 64
//	go run ./loadtest -scenario enroll -db postgres -binary -agents 10000 -concurrency 64
//
// ledger: the operations engine with a no-op kind (ledger.go).
//
//	go run ./loadtest -scenario ledger -db postgres -ops 20000 -submitters 64 -ledger-workers 128
//
// When issue→receipt p99 exceeds -p99-target (default 25 ms; deliver,
// hold) the report names its causes from counters over the issue window
// (tail.go): which side of issued_at the tail is on, the machine's CPU,
// the run's own Postgres backends waiting on locks, WAL or lightweight
// locks (pg_stat_activity sampled every 100 ms, picked by the schema's
// application_name), the server's GC pauses, redeliveries and lease
// batches.
//
// The 50,000-agent runs hold 17,000 connections or fewer per server
// process at three replicas, each worker (2,500 agents at most) dialling
// one replica from its own loopback source address, so neither a server
// nor a worker nears the 20,000 open files (the report warns past 19,000).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nodeward/nodeward/internal/memorypolicy"
	"github.com/nodeward/nodeward/models/dbtest"
)

func main() {
	if os.Getenv(workerEnv) == "1" {
		os.Exit(runWorker())
	}
	os.Exit(cli(os.Args[1:], os.Stdout, os.Stderr))
}

func cli(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg Config
	db := fs.String("db", "sqlite", "database of the server the tool starts: sqlite or postgres")
	dbURL := fs.String("database-url", os.Getenv(dbtest.EnvURL), "Postgres URL for -db postgres and -pgbench (a private schema is created in it)")
	fs.IntVar(&cfg.Agents, "agents", 1000, "simulated agents, each holding a long-poll")
	fs.IntVar(&cfg.AgentsPerWorker, "agents-per-worker", 2500, "agents per worker process")
	fs.Float64Var(&cfg.Rate, "rate", 1000, "commands issued per second (0: as fast as -issuers allow)")
	fs.IntVar(&cfg.Issuers, "issuers", 64, "concurrent issue requests at most")
	fs.DurationVar(&cfg.Duration, "duration", 30*time.Second, "how long commands are issued")
	fs.DurationVar(&cfg.Wait, "wait", 25*time.Second, "long-poll wait the agents ask for (the agent's default is 25s)")
	fs.DurationVar(&cfg.Heartbeat, "heartbeat", 0, "per-agent heartbeat interval (0: none)")
	fs.BoolVar(&cfg.PollsTogether, "polls-together", false, "every agent's first poll lasts the full -wait, so the fleet re-polls in one wave -wait after its bring-up (by default first waits are spread from 1 s to -wait and the fleet re-polls at a steady agents/wait a second)")
	fs.DurationVar(&cfg.Drain, "drain", 20*time.Second, "how long to wait for the last commands to settle")
	fs.StringVar(&cfg.URL, "url", "", "target a running server (loopback only) instead of starting one")
	fs.StringVar(&cfg.Token, "token", "", "administrator API token for -url")
	fs.BoolVar(&cfg.PGBench, "pgbench", false, "afterwards, run the pgbench reference (DECISIONS.md §31) on the same Postgres")
	fs.StringVar(&cfg.MemProfile, "memprofile", "", "write a heap profile of this process (the server, when started here) once every poll is held")
	fs.StringVar(&cfg.AllocProfile, "allocprofile", "", "deliver: write the allocations of this process (the server, when started here) at the end of the issue phase to FILE and at its start to FILE.base; read what the phase allocated with go tool pprof -sample_index=alloc_space -base FILE.base FILE")
	fs.StringVar(&cfg.CPUProfile, "cpuprofile", "", "write a CPU profile of this process (the server, when started here) over the issue phase (enroll: the enrollment phase; config: from the submit to the parent's end)")
	scenario := fs.String("scenario", "deliver", "deliver (agents, commands), ledger (the operations engine with a no-op kind), hold (memory per held poll against the bare waiter, then commands at -rate, default 100/s), config (one fleet.configure over every agent, then the lagging count's cost), storm (restart the real binary under held agents) or enroll (enrollments/s)")
	useTLS := fs.Bool("tls", false, "hold: both servers serve HTTPS with a throwaway CA")
	settle := fs.Duration("settle", 5*time.Second, "hold: wait after every poll is held before sampling")
	sample := fs.Duration("sample", 10*time.Second, "hold: window over which RSS and CPU are sampled")
	ops := fs.Int("ops", 20000, "ledger: operations to submit")
	submitters := fs.Int("submitters", 64, "ledger: concurrent submitters")
	replicas := fs.Int("replicas", 1, "ledger, deliver, storm, enroll: control planes sharing the database (more than one needs Postgres; deliver and enroll then run the real binary)")
	fs.IntVar(&cfg.FanOut, "fanout", 0, "deliver, storm: issue fleet.command operations over this many nodes each instead of single commands (deliver: -rate counts operations; storm: -commands counts their children)")
	fs.Float64Var(&cfg.P99Target, "p99-target", 25, "deliver, hold: issue→receipt p99 in ms above which the report names the tail's causes (GC, batches, lock waits, CPU)")
	floorRun := fs.Bool("floor", false, "deliver: run against the floor (cmd/barewaiter -deliver: commands in memory, no database, no credentials) instead of the server, the same agents and issuers: the ceiling this machine's HTTP allows (-replicas N: N floor processes)")
	binary := fs.Bool("binary", false, "deliver, enroll: run the real server binary as a process instead of in this one")
	commands := fs.Int("commands", 5000, "storm: the burst issued right before the stop")
	sig := fs.String("signal", "kill", "storm: how the replica is stopped: kill (SIGKILL, a crash) or term (SIGTERM, a drain)")
	recoverIn := fs.Duration("recover", 2*time.Minute, "storm: how long to wait for every agent and command after the restart")
	backoffBase := fs.Duration("backoff-base", time.Second, "storm: the agents' first poll retry delay (the agent's default)")
	backoffMax := fs.Duration("backoff-max", time.Minute, "storm: the agents' longest poll retry delay (the agent's default; held to 5 s, as the agent does, while connections are refused or cut)")
	concurrency := fs.Int("concurrency", 64, "enroll: concurrent enrollments over all workers")
	ledgerWorkers := fs.Int("ledger-workers", 16, "ledger: operations each replica runs at once")
	fs.IntVar(&cfg.MaxConcurrency, "max-concurrency", 0, "deliver: each fleet.command's max_concurrency (0: the whole -fanout at once; less rolls it, releasing held children as others end)")
	fs.IntVar(&cfg.PayloadBytes, "payload-bytes", 0, "deliver: pad every command's payload to about this many bytes (at most 250,000: a payload is at most 256 KiB)")
	documentBytes := fs.Int("document-bytes", 0, "config: pad the configuration document to about this many bytes (at most 256 KiB in all)")
	probeRate := fs.Float64("probe-rate", 0, "config: single commands submitted per second during the wave, round robin over the agents, each submit timed: how long the wave holds the fleet's other writes back (0: none)")
	laggingNodes := fs.Int("lagging-nodes", 0, "config: configured nodes seeded afterwards to time GET /api/v1/config/lagging and CountLagging against (0: skip)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	quiet := fs.Bool("q", false, "no progress lines")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	switch *db {
	case "sqlite":
	case "postgres":
		if *dbURL == "" && cfg.URL == "" {
			fmt.Fprintln(stderr, "loadtest: -db postgres needs -database-url or NODEWARD_TEST_DATABASE_URL")
			return 2
		}
		cfg.DatabaseURL = *dbURL
	default:
		fmt.Fprintln(stderr, "loadtest: -db is sqlite or postgres")
		return 2
	}
	if cfg.PGBench {
		cfg.DatabaseURL = *dbURL
	}
	if !*quiet {
		cfg.Log = stderr
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *scenario == "deliver" && !*binary && !*floorRun && *replicas <= 1 && cfg.URL == "" {
		// The server runs in this process: its memory policy too, as
		// `serve` runs it (NODEWARD_MEMORY_POLICY=off, GOGC or GOMEMLIMIT
		// turn it off).
		go memorypolicy.Run(ctx, memorypolicy.Options{})
	}
	switch *scenario {
	case "deliver":
		if cfg.PayloadBytes < 0 || cfg.PayloadBytes > 250_000 {
			fmt.Fprintln(stderr, "loadtest: -payload-bytes must be between 0 and 250000 (a command's payload is at most 256 KiB)")
			return 2
		}
		if cfg.MaxConcurrency < 0 || cfg.MaxConcurrency > 10_000 || (cfg.MaxConcurrency > 0 && cfg.FanOut == 0) {
			fmt.Fprintln(stderr, "loadtest: -max-concurrency is 0 to 10000, with -fanout")
			return 2
		}
		if *floorRun {
			if cfg.URL != "" || *binary || cfg.PGBench {
				fmt.Fprintln(stderr, "loadtest: -floor starts its own stand-ins; not with -url, -binary or -pgbench")
				return 2
			}
			rep, err := runDeliverFloor(ctx, cfg, *replicas)
			return report(stdout, stderr, rep, err, *asJSON, printReport)
		}
		if *binary || *replicas > 1 {
			if cfg.URL != "" {
				fmt.Fprintln(stderr, "loadtest: -binary and -replicas start their own servers; not with -url")
				return 2
			}
			rep, err := runDeliverProcs(ctx, cfg, *replicas)
			return report(stdout, stderr, rep, err, *asJSON, printReport)
		}
	case "storm", "enroll":
		return cliPresets(ctx, *scenario, presetFlags{cfg: cfg, db: *db, dbURL: *dbURL, replicas: *replicas, binary: *binary,
			commands: *commands, signal: *sig, backoffBase: *backoffBase, backoffMax: *backoffMax, recover: *recoverIn, concurrency: *concurrency, asJSON: *asJSON}, stdout, stderr)
	case "hold":
		hc := HoldConfig{Agents: cfg.Agents, AgentsPerWorker: cfg.AgentsPerWorker, Wait: cfg.Wait, Settle: *settle,
			Sample: *sample, Rate: 100, Duration: cfg.Duration, TLS: *useTLS, Log: cfg.Log, Replicas: *replicas, P99Target: cfg.P99Target,
			PollsTogether: cfg.PollsTogether}
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "rate" {
				hc.Rate = cfg.Rate
			}
		})
		if *db == "postgres" {
			hc.DatabaseURL = *dbURL
		}
		hrep, err := RunHold(ctx, hc)
		return report(stdout, stderr, hrep, err, *asJSON, printHoldReport)
	case "config":
		if *laggingNodes < 0 {
			fmt.Fprintln(stderr, "loadtest: -lagging-nodes must not be negative")
			return 2
		}
		if *documentBytes < 0 || *documentBytes > 250<<10 {
			fmt.Fprintln(stderr, "loadtest: -document-bytes must be between 0 and 256000 (a document is at most 256 KiB)")
			return 2
		}
		if *probeRate < 0 || *probeRate > 1000 {
			fmt.Fprintln(stderr, "loadtest: -probe-rate must be between 0 and 1000 commands/s")
			return 2
		}
		cc := ConfigLoad{Config: cfg, LaggingNodes: *laggingNodes, DocumentBytes: *documentBytes, ProbeRate: *probeRate}
		if !visited(fs, "drain") {
			cc.Drain = 0 // the scenario's own default
		}
		if !visited(fs, "duration") {
			cc.Duration = 0
		}
		crep, err := RunConfig(ctx, cc)
		return report(stdout, stderr, crep, err, *asJSON, printConfigReport)
	case "ledger":
		lc := LedgerConfig{Ops: *ops, Submitters: *submitters, Replicas: *replicas, LedgerWorkers: *ledgerWorkers,
			PGBench: cfg.PGBench, Log: cfg.Log}
		if *db == "postgres" {
			lc.DatabaseURL = *dbURL
		}
		if lc.Ops < 1 || lc.Submitters < 1 || lc.Replicas < 1 || lc.LedgerWorkers < 1 {
			fmt.Fprintln(stderr, "loadtest: -ops, -submitters, -replicas and -ledger-workers must be positive")
			return 2
		}
		lrep, err := RunLedger(ctx, lc)
		return report(stdout, stderr, lrep, err, *asJSON, printLedgerReport)
	default:
		fmt.Fprintln(stderr, "loadtest: -scenario is deliver, ledger, hold, config, storm or enroll")
		return 2
	}
	rep, err := runCLI(ctx, cfg, *db)
	return report(stdout, stderr, rep, err, *asJSON, printReport)
}

// visited reports whether the flag was set on the command line.
func visited(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// runCLI runs cfg; with -db sqlite and -pgbench the server stays on SQLite
// and the reference still runs on the Postgres URL.
func runCLI(ctx context.Context, cfg Config, db string) (Report, error) {
	if db == "sqlite" && cfg.PGBench {
		pgURL := cfg.DatabaseURL
		cfg.DatabaseURL, cfg.PGBench = "", false
		rep, err := Run(ctx, cfg)
		if err != nil {
			return rep, err
		}
		rep.PGBenchTPS, err = pgbench(ctx, pgURL, cfg.Log)
		return rep, err
	}
	return Run(ctx, cfg)
}

func printReport(w io.Writer, r Report) {
	fmt.Fprintf(w, "date                     %s\n", r.Date)
	fmt.Fprintf(w, "database                 %s\n", r.Database)
	fmt.Fprintf(w, "agents                   %d in %d workers (%d long-polls held)\n", r.Enrolled, r.Workers, r.Held)
	fmt.Fprintf(w, "setup                    %.0f invitations/s, %.0f enrollments/s\n", r.InvitesPS, r.EnrollPS)
	target := rateName(r.TargetRate)
	if r.FanOut > 0 && r.TargetRate > 0 {
		target += " (operations)"
	}
	fmt.Fprintf(w, "issued                   %d in %.1fs = %.0f/s (target %s), %d errors, %d not sent in time\n", r.Issued, r.Seconds, r.IssuedPS, target, r.IssueErrs, r.Missed)
	fmt.Fprintf(w, "received / settled       %d / %d (agent errors %d)\n", r.Received, r.Settled, r.AgentErrs)
	if r.FirstErr != "" {
		fmt.Fprintf(w, "first agent error        %s\n", r.FirstErr)
	}
	fmt.Fprintf(w, "settled commands/s       %.0f (during the issue window)\n", r.SettledPS)
	printPolls(w, r)
	fmt.Fprintf(w, "issue→receipt ms         p50 %.1f  p90 %.1f  p99 %.1f  max %.1f\n", r.SentP50, r.SentP90, r.SentP99, r.SentMax)
	fmt.Fprintf(w, "issued_at→receipt ms     p50 %.1f  p99 %.1f\n", r.IssuedP50, r.IssuedP99)
	fmt.Fprintf(w, "issue→settled ms         p50 %.1f  p99 %.1f\n", r.SettleP50, r.SettleP99)
	if r.Heartbeats > 0 {
		fmt.Fprintf(w, "heartbeats               %d = %.0f/s\n", r.Heartbeats, r.HeartbeatsPS)
	}
	fmt.Fprintf(w, "lease renewals flushed   %.0f\n", r.RenewalsFlushed)
	fmt.Fprintf(w, "server GC                %.0f cycles, %.2f CPU s in the window (%.1f%% of the cores), GC percent %.0f at its end (the highest server's)\n",
		r.Tail.GCs, r.Tail.GCCPUSeconds, 100*r.Tail.GCCPUSeconds/max(r.Seconds*r.CPU.Cores, 1e-9), r.Tail.GCPercent)
	fmt.Fprintf(w, "cpu (cores of %.0f)       machine %.0f%% busy; this process %.2f, workers %.2f, rest (database, other) %.2f\n",
		r.CPU.Cores, 100*r.CPU.MachineBusy, r.CPU.Self, r.CPU.Workers, r.CPU.Rest)
	if r.PGCommitsPS > 0 {
		fmt.Fprintf(w, "postgres commits/s       %.0f (whole database, during the window)\n", r.PGCommitsPS)
	}
	if r.PGBenchTPS > 0 {
		fmt.Fprintf(w, "pgbench -N tps           %.0f (settled commands/s above: %.0f)\n", r.PGBenchTPS, r.SettledPS)
	}
	if r.FanOut > 0 {
		fmt.Fprintf(w, "fan-out                  %d fleet.command operations over %d nodes each\n", r.IssuedOps, r.FanOut)
		if v := r.Wave; v != nil {
			a := v.Advances
			fmt.Fprintf(w, "wave (window and drain)  %.1f s: %.0f parent advances (%.0f prompt, %.0f interval, %.0f continued, %.0f sweep) for %.0f child ends; exclusive write batches %.1f s, lane gate waits %.1f s summed\n",
				v.Seconds, a["prompt"]+a["interval"]+a["continued"]+a["sweep"], a["prompt"], a["interval"], a["continued"], a["sweep"], v.ChildEnds,
				v.ExclusiveSeconds, v.GateWaitSeconds)
		}
		if r.TargetRate == 0 {
			fmt.Fprintf(w, "fan-outs ended           %d in the window (closed-loop, one in flight per issuer)\n", r.EndedOps)
		}
	}
	printReplicaStats(w, r.Replicas)
	printTail(w, r.Tail)
}

// printPolls prints the fleet's polls answered over the issue window: the
// re-polls the window carried beside the commands.
func printPolls(w io.Writer, r Report) {
	spread := "spread"
	if r.PollsTogether {
		spread = "together (one wave)"
	}
	fmt.Fprintf(w, "polls answered           %.0f in the window (%.0f/s), %.0f of them empty; first polls %s\n",
		r.PollsAnswered, r.PollsAnswered/max(r.Seconds, 1e-9), r.PollsEmpty, spread)
	if r.PollHandoffs+r.PollDirectClaims > 0 {
		fmt.Fprintf(w, "polls with commands      %.0f handed them by the submit, %.0f claimed after its wake-up\n", r.PollHandoffs, r.PollDirectClaims)
	}
	if r.SettleStatements > 0 {
		fmt.Fprintf(w, "settlement statements    %.0f for %.0f result requests (%.1f a statement)\n",
			r.SettleStatements, r.SettleRequests, r.SettleRequests/r.SettleStatements)
	}
	if r.IssueStatements > 0 {
		fmt.Fprintf(w, "shared submit statements %.0f for %.0f command submits (%.1f a statement)\n",
			r.IssueStatements, r.IssueShared, r.IssueShared/r.IssueStatements)
	}
}

func printHoldReport(w io.Writer, r HoldReport) {
	fmt.Fprintf(w, "date                     %s\n", r.Date)
	fmt.Fprintf(w, "agents                   %d (tls %v, server on %s)\n", r.Agents, r.TLS, r.Database)
	for _, s := range []struct {
		name string
		side HoldSide
	}{{"bare waiter", r.Bare}, {"server", r.Server}} {
		fmt.Fprintf(w, "%-24s %d held; RSS %d KB idle, %d KB holding = %.1f KB a poll; %.2f cores\n",
			s.name, s.side.Held, s.side.IdleRSSKB, s.side.HeldRSSKB, s.side.PerPollKB, s.side.Cores)
	}
	fmt.Fprintf(w, "memory ratio             %.2f× the bare waiter\n", r.Ratio)
	fmt.Fprintf(w, "commands                 %d issued at %s, %d received, %d settled\n", r.Deliver.Issued, rateName(r.Deliver.TargetRate), r.Deliver.Received, r.Deliver.Settled)
	fmt.Fprintf(w, "issue→receipt ms         p50 %.1f  p90 %.1f  p99 %.1f  max %.1f\n", r.Deliver.SentP50, r.Deliver.SentP90, r.Deliver.SentP99, r.Deliver.SentMax)
	printPolls(w, r.Deliver)
	fmt.Fprintf(w, "cpu while issuing        machine %.0f%% busy; workers %.2f cores; rest (server, database, other) %.2f\n",
		100*r.Deliver.CPU.MachineBusy, r.Deliver.CPU.Workers, r.Deliver.CPU.Rest)
	for i, s := range r.PerReplica {
		fmt.Fprintf(w, "replica %-16d %d held; RSS %d KB idle, %d KB holding = %.1f KB a poll; %.2f cores\n",
			i+1, s.Held, s.IdleRSSKB, s.HeldRSSKB, s.PerPollKB, s.Cores)
	}
	printReplicaStats(w, r.Deliver.Replicas)
	printTail(w, r.Deliver.Tail)
}
