package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"syscall"
	"time"
)

// presetFlags are the command line of the storm and enroll scenarios.
type presetFlags struct {
	cfg         Config
	db, dbURL   string
	replicas    int
	binary      bool
	commands    int
	signal      string
	recover     time.Duration
	backoffBase time.Duration
	backoffMax  time.Duration
	concurrency int
	asJSON      bool
}

// cliPresets runs the storm or enroll scenario from the command line.
func cliPresets(ctx context.Context, scenario string, f presetFlags, stdout, stderr io.Writer) int {
	pgURL := ""
	if f.db == "postgres" {
		pgURL = f.dbURL
	}
	if f.replicas > 1 && pgURL == "" {
		fmt.Fprintln(stderr, "loadtest: -replicas above 1 needs -db postgres")
		return 2
	}
	switch scenario {
	case "storm":
		sc := StormConfig{Agents: f.cfg.Agents, AgentsPerWorker: f.cfg.AgentsPerWorker, Commands: f.commands, FanOut: f.cfg.FanOut,
			Issuers: f.cfg.Issuers, Replicas: f.replicas, DatabaseURL: pgURL, Wait: f.cfg.Wait, Recover: f.recover, Log: f.cfg.Log,
			BackoffBase: f.backoffBase, BackoffMax: f.backoffMax}
		switch f.signal {
		case "kill":
			sc.Signal = syscall.SIGKILL
		case "term":
			sc.Signal = syscall.SIGTERM
		default:
			fmt.Fprintln(stderr, "loadtest: -signal is kill or term")
			return 2
		}
		rep, err := RunStorm(ctx, sc)
		return report(stdout, stderr, rep, err, f.asJSON, printStormReport)
	default:
		ec := EnrollConfig{Agents: f.cfg.Agents, AgentsPerWorker: f.cfg.AgentsPerWorker, Concurrency: f.concurrency,
			Binary: f.binary, Replicas: f.replicas, DatabaseURL: pgURL, Log: f.cfg.Log,
			CPUProfile: f.cfg.CPUProfile}
		rep, err := RunEnroll(ctx, ec)
		return report(stdout, stderr, rep, err, f.asJSON, printEnrollReport)
	}
}

// report prints a scenario's report (human, or JSON with -json) and
// answers the exit status.
func report[R any](stdout, stderr io.Writer, rep R, err error, asJSON bool, human func(io.Writer, R)) int {
	if err != nil {
		fmt.Fprintln(stderr, "loadtest:", err)
		return 1
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
		return 0
	}
	human(stdout, rep)
	return 0
}
