package main

import (
	"context"
	"fmt"
	"sync"
)

// runDeliverProcs runs the deliver scenario against the real server
// binary: replicas processes on one database (more than one needs
// Postgres), the workers spread over them, commands issued round robin
// through them; the report carries each process's CPU over the issue
// window, its RSS, open files and held polls at the window's end.
func runDeliverProcs(ctx context.Context, cfg Config, replicas int) (Report, error) {
	if cfg.Log == nil {
		cfg.Log = discard{}
	}
	cl, err := startCluster(ctx, clusterOptions{Replicas: replicas, DatabaseURL: cfg.DatabaseURL, Log: cfg.Log})
	if cl != nil {
		defer cl.Close()
	}
	if err != nil {
		return Report{}, err
	}
	urls := cl.URLs()
	fmt.Fprintf(cfg.Log, "loadtest: %d server process(es) on %s: %v\n", replicas, cl.Database, urls)
	whole := cl.begin() // the replicas since their start, told when the run fails
	cfg.PGStatURL = cl.SchemaURL
	cfg.URL, cfg.Token, cfg.Replicas, cfg.DatabaseURL, cfg.PGBench = urls[0], cl.Token, urls[1:], "", false
	step := whole
	cfg.OnPhase = func(ctx context.Context, phase string) {
		fmt.Fprintf(cfg.Log, "loadtest: the replicas during the bring-up's %s:\n", phase)
		printReplicaStats(cfg.Log, step.end(ctx))
		step = cl.begin()
	}
	var mu sync.Mutex
	var win *replicaWindow
	var stats []ReplicaStat
	cfg.OnWindow = func(ctx context.Context, begin bool) {
		mu.Lock()
		defer mu.Unlock()
		if begin {
			win = cl.begin()
			return
		}
		stats = win.end(ctx)
	}
	rep, err := Run(ctx, cfg)
	rep.Database = cl.Database
	mu.Lock()
	rep.Replicas = stats
	mu.Unlock()
	if err != nil {
		for _, r := range cl.Replicas {
			fmt.Fprintf(cfg.Log, "loadtest: replica %s log:\n%s\n", r.ID, r.LogTail(10))
		}
		fmt.Fprintf(cfg.Log, "loadtest: the replicas from their start to the failure:\n")
		printReplicaStats(cfg.Log, whole.end(ctx))
	}
	return rep, err
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
