package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// runDeliverFloor runs the deliver scenario against the floor
// (cmd/barewaiter -deliver): stand-ins holding the commands in
// memory, no database, no credentials checked. The agents, issuers and
// every HTTP exchange are the real run's, so its settled rate and latency
// are what this machine's HTTP alone allows, a ceiling for the server's
// figures of the same sitting (issue 13: a target above the floor cannot
// be met here, whatever the server does). processes > 1 stands for that
// many replicas; each command is then issued to the process its node's
// agent polls (the replicas' database and notifications are what the
// floor leaves out).
func runDeliverFloor(ctx context.Context, cfg Config, processes int) (Report, error) {
	if cfg.Log == nil {
		cfg.Log = discard{}
	}
	if processes > 1 && cfg.FanOut > 0 {
		return Report{}, errors.New("-floor with -replicas issues single commands only (a fan-out spans the processes)")
	}
	dir, err := os.MkdirTemp("", "nodeward-floor-")
	if err != nil {
		return Report{}, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "barewaiter")
	if err := goBuild(ctx, bin, "./cmd/barewaiter"); err != nil {
		return Report{}, err
	}
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			_ = p.Process.Kill()
			_ = p.Wait()
		}
	}()
	var urls []string
	for range processes {
		cmd, url, err := startBare(ctx, bin, cfg.Log, "-listen", "127.0.0.1:0", "-deliver")
		if err != nil {
			return Report{}, err
		}
		procs, urls = append(procs, cmd), append(urls, url)
	}
	fmt.Fprintf(cfg.Log, "loadtest: %d floor process(es): %v\n", processes, urls)
	cfg.URL, cfg.Token, cfg.Replicas, cfg.DatabaseURL, cfg.PGBench = urls[0], "floor", urls[1:], "", false
	cfg.IssueWherePolled = processes > 1

	var mu sync.Mutex
	var stats []ReplicaStat
	var cpu0 []float64
	var t0 time.Time
	cfg.OnWindow = func(ctx context.Context, begin bool) {
		mu.Lock()
		defer mu.Unlock()
		if begin {
			t0, cpu0 = time.Now(), cpu0[:0]
			for _, p := range procs {
				cpu0 = append(cpu0, processCPU(p.Process.Pid))
			}
			return
		}
		secs := time.Since(t0).Seconds()
		stats = stats[:0]
		for i, p := range procs {
			pid := p.Process.Pid
			s := ReplicaStat{ID: "floor-" + strconv.Itoa(i+1), URL: urls[i], PID: pid, RSSKB: rssKB(pid), OpenFiles: openFiles(pid),
				Cores: (processCPU(pid) - cpu0[i]) / secs}
			if m, err := scrape(ctx, urls[i]); err == nil {
				s.Held = int(m["nodeward_open_long_polls"])
			}
			stats = append(stats, s)
		}
	}
	rep, err := Run(ctx, cfg)
	rep.Database = "floor"
	mu.Lock()
	rep.Replicas = stats
	mu.Unlock()
	return rep, err
}
