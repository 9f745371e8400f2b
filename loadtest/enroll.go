package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// The enroll scenario (issue 13: "enroll ≥ 1,000/s on Postgres") invites
// -agents nodes through the admin API, then enrolls them through
// /agent/v1/enroll as fast as -concurrency concurrent enrollments go
// (spread over the worker processes), reporting enrollments/s and each
// enrollment's round trip. The server runs in this process by default, or
// as the real binary (-binary; -replicas on Postgres, the workers spread
// over them).

// EnrollConfig is one enroll run.
type EnrollConfig struct {
	Agents          int
	AgentsPerWorker int
	Concurrency     int  // concurrent enrollments over all workers
	Binary          bool // the real server binary instead of in-process
	Replicas        int  // server processes (Binary; more than one needs Postgres)
	DatabaseURL     string
	Log             io.Writer
	WorkerCommand   []string
	// CPUProfile profiles this process (the in-process server) over the
	// enrollment phase.
	CPUProfile string
}

// EnrollReport is what an enroll run measured.
type EnrollReport struct {
	Date        string  `json:"date"`
	Database    string  `json:"database"`
	Server      string  `json:"server"` // in-process or binary
	Agents      int     `json:"agents"`
	Workers     int     `json:"workers"`
	Concurrency int     `json:"concurrency"`
	InvitesPS   float64 `json:"invites_per_s"`
	Enrolled    int     `json:"enrolled"`
	Failed      int     `json:"failed"`
	// Enrollments tried again, as the real agent does: after a 503
	// overloaded (shed: nothing redeemed) and after another transient
	// failure (a timeout, a 5xx).
	Shed     int64         `json:"enrollments_shed"`
	Retried  int64         `json:"enrollments_retried"`
	FirstErr string        `json:"first_error,omitempty"`
	Seconds  float64       `json:"seconds"`
	EnrollPS float64       `json:"enrollments_per_s"`
	Latency  enrollLatency `json:"latency_ms"`
	Servers  []ReplicaStat `json:"replicas,omitempty"`
}

type enrollLatency struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// RunEnroll performs an enroll run.
func RunEnroll(ctx context.Context, cfg EnrollConfig) (rep EnrollReport, err error) {
	if cfg.Agents < 1 {
		return rep, errors.New("agents must be at least 1")
	}
	if cfg.AgentsPerWorker <= 0 {
		cfg.AgentsPerWorker = 2500
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 64
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	if len(cfg.WorkerCommand) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return rep, err
		}
		cfg.WorkerCommand = []string{exe}
	}
	logf := func(format string, args ...any) { fmt.Fprintf(cfg.Log, "loadtest: "+format+"\n", args...) }
	rep.Date, rep.Agents, rep.Concurrency = time.Now().UTC().Format(time.RFC3339), cfg.Agents, cfg.Concurrency

	var urls []string
	var token string
	var cl *procCluster
	if cfg.Binary || cfg.Replicas > 1 {
		rep.Server = "binary"
		cl, err = startCluster(ctx, clusterOptions{Replicas: cfg.Replicas, DatabaseURL: cfg.DatabaseURL, Log: cfg.Log})
		if cl != nil {
			defer cl.Close()
		}
		if err != nil {
			return rep, err
		}
		urls, token, rep.Database = cl.URLs(), cl.Token, cl.Database
	} else {
		rep.Server = "in-process"
		local, err := startLocal(ctx, cfg.DatabaseURL, cfg.Log)
		if err != nil {
			return rep, err
		}
		defer local.Close()
		urls, token, rep.Database = []string{local.URL}, local.Token, local.Dialect
	}
	admin := newAdmin(urls[0], token, 16, "")
	defer admin.tr.CloseIdleConnections()
	start := time.Now()
	boots, err := admin.inviteAll(ctx, randomHex(4), cfg.Agents)
	if err != nil {
		return rep, err
	}
	rep.InvitesPS = float64(len(boots)) / time.Since(start).Seconds()
	logf("invited %d nodes (%.0f/s); enrolling", len(boots), rep.InvitesPS)

	nWorkers := (cfg.Agents + cfg.AgentsPerWorker - 1) / cfg.AgentsPerWorker
	per := max(1, (cfg.Concurrency+nWorkers-1)/nWorkers)
	var cl0 *replicaWindow
	if cl != nil {
		cl0 = cl.begin()
	}
	if cfg.CPUProfile != "" {
		if cfg.Binary || cfg.Replicas > 1 {
			return rep, errors.New("-cpuprofile profiles this process: not with -binary or -replicas")
		}
		stop, err := startCPUProfile(cfg.CPUProfile)
		if err != nil {
			return rep, err
		}
		defer stop()
	}
	start = time.Now()
	ws, err := startWorkers(Config{WorkerCommand: cfg.WorkerCommand, Log: cfg.Log, Replicas: urls[1:]},
		workerJob{URL: urls[0], Wait: 25 * time.Second, Enrollers: per, StopBy: time.Now().Add(15 * time.Minute).UnixNano()},
		boots, cfg.AgentsPerWorker)
	defer stopWorkers(ws)
	if err != nil {
		return rep, err
	}
	rep.Workers = len(ws)
	var lat []int64
	for i, w := range ws {
		var m workerMsg
		if err := w.read(&m); err != nil {
			return rep, fmt.Errorf("worker %d: %w", i, err)
		}
		rep.Enrolled += m.Enrolled
		rep.Failed += m.Failed
		rep.Shed += m.EnrollsShed
		rep.Retried += m.EnrollRetries
		if rep.FirstErr == "" {
			rep.FirstErr = m.Error
		}
		lat = append(lat, m.EnrollLatUS...)
	}
	rep.Seconds = time.Since(start).Seconds()
	if cl0 != nil {
		rep.Servers = cl0.end(ctx)
	}
	rep.EnrollPS = float64(rep.Enrolled) / rep.Seconds
	rep.Latency = enrollLatency{P50: pct(lat, 0.5), P90: pct(lat, 0.9), P99: pct(lat, 0.99), Max: pct(lat, 1)}
	return rep, nil
}

func printEnrollReport(w io.Writer, r EnrollReport) {
	fmt.Fprintf(w, "date                     %s\n", r.Date)
	fmt.Fprintf(w, "server                   %s on %s\n", r.Server, r.Database)
	fmt.Fprintf(w, "invitations              %d at %.0f/s\n", r.Agents, r.InvitesPS)
	fmt.Fprintf(w, "enrolled                 %d in %.2fs = %.0f/s (%d workers, %d concurrent), %d failed\n",
		r.Enrolled, r.Seconds, r.EnrollPS, r.Workers, r.Concurrency, r.Failed)
	if r.Shed+r.Retried > 0 {
		fmt.Fprintf(w, "tried again              %d shed (503 overloaded), %d after another failure\n", r.Shed, r.Retried)
	}
	if r.FirstErr != "" {
		fmt.Fprintf(w, "first error              %s\n", r.FirstErr)
	}
	fmt.Fprintf(w, "enrollment ms            p50 %.1f  p90 %.1f  p99 %.1f  max %.1f\n", r.Latency.P50, r.Latency.P90, r.Latency.P99, r.Latency.Max)
	printReplicaStats(w, r.Servers)
}
