package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nodeward/nodeward/agent/api"
)

// The storm scenario restarts the real server binary under held agents
// (issue 13: "restart a replica with 10,000 agents: all back and every
// pending command redelivered ≤ 10 s after restart"). It builds and starts
// the server (one process, or -replicas on Postgres), holds -agents,
// issues a burst of -commands as fast as -issuers go, and the moment the
// last of them is recorded it stops the first replica (-signal kill: no
// drain, as a crash; term: the graceful drain) and starts it again on the
// same database and address. Commands still unsettled then are pending:
// some not yet handed out, some handed out and not yet settled. It reports
// from the restart (the new process's start): when it was ready, when
// every agent held a poll again (nodeward_open_long_polls over the
// replicas), when every command recorded in the burst was settled as the
// agents saw it; and, from the agents' receipts by operation id, commands
// lost (recorded, never settled: must be 0), applied twice (delivered
// again after their settlement was acknowledged: must be 0) and
// redelivered (delivered again before it was: at-least-once across the
// outage, expected). The agents retry their polls across the outage as
// the agent does (agent/core: 1 s doubling to 60 s, jittered, the
// ceiling held to 5 s while connections are refused or cut;
// -backoff-base, -backoff-max), resume on the poll after a failed one
// (resume=true), and retry their results until acknowledged.
//
// With -fanout N the burst is fleet.command operations over N agents each
// (-commands counts their children), so the stop also lands while fan-outs
// are being created and their commands recorded lane by lane: once every
// fan-out has ended, its children (listed by parent) are checked the same
// way, and a fan-out that did not end, or ended with fewer children than
// it named, counts its missing children as lost.

// StormConfig is one storm run.
type StormConfig struct {
	Agents          int
	AgentsPerWorker int
	Commands        int // the burst issued right before the stop
	// FanOut > 0 issues the burst as fleet.command operations over that
	// many agents each; Commands counts their children.
	FanOut      int
	Issuers     int
	Replicas    int
	DatabaseURL string // empty: SQLite
	// Signal stops the replica: SIGKILL (a crash) or SIGTERM (a drain).
	Signal syscall.Signal
	Wait   time.Duration // long-poll wait the agents ask for
	// BackoffBase and BackoffMax are the agents' poll retry (the agent's
	// defaults: 1 s doubling to 60 s, jittered).
	BackoffBase, BackoffMax time.Duration
	// Recover bounds the wait for every agent and command after the
	// restart.
	Recover       time.Duration
	Log           io.Writer
	WorkerCommand []string
}

// StormReport is what a storm run measured. Seconds are from the restart
// (the new process's start) unless named otherwise.
type StormReport struct {
	Date      string `json:"date"`
	Database  string `json:"database"`
	Agents    int    `json:"agents"`
	Workers   int    `json:"workers"`
	Replicas  int    `json:"replica_count"`
	Signal    string `json:"signal"`
	Issued    int    `json:"issued"`
	IssueErrs int    `json:"issue_errors"`
	// FanOuts is the fleet.command operations of a -fanout burst, and
	// FanOutsEnded how many had ended when the wait did (every child
	// settled or not).
	FanOuts      int `json:"fan_outs,omitempty"`
	FanOutsEnded int `json:"fan_outs_ended,omitempty"`
	// SettledAtStop and PendingAtStop split the burst when the signal was
	// sent, as the agents saw it.
	SettledAtStop int     `json:"settled_at_stop"`
	PendingAtStop int     `json:"pending_at_stop"`
	StopSeconds   float64 `json:"stop_seconds"` // signal → process exited
	ReadySeconds  float64 `json:"ready_seconds"`
	// AllHeldSeconds and AllSettledSeconds are -1 when not reached within
	// Recover.
	AllHeldSeconds    float64 `json:"all_held_seconds"`
	AllSettledSeconds float64 `json:"all_settled_seconds"`
	Lost              int     `json:"lost"`
	AppliedTwice      int64   `json:"applied_twice"`
	Redelivered       int64   `json:"redelivered"`
	// ServerRedeliveries counts commands the servers handed out again
	// (nodeward_command_redeliveries_total over the replicas; the
	// restarted one's since its restart): a command recorded as delivered
	// whose answer died with the process is handed out again to the
	// agent's resuming poll (resume=true, its first after a failed one),
	// else only after the visibility timeout (60 s, DECISIONS.md §2).
	ServerRedeliveries float64 `json:"server_redeliveries"`
	// ServerResumes counts resuming polls the servers took
	// (nodeward_long_poll_resumes_total, as above); AgentResumes those the
	// agents sent (their first poll included).
	ServerResumes float64 `json:"server_resumes"`
	AgentResumes  int64   `json:"agent_resumes"`
	AgentErrs     int64   `json:"agent_errors"`
	FirstErr      string  `json:"first_error,omitempty"`
	// Servers are the replicas from the restart to the end of the wait.
	Servers []ReplicaStat `json:"replicas"`
	// Timeline samples the recovery every half second, from the restart
	// until every agent held and every command settled: where the seconds
	// went (agents back, commands recorded, commands settled).
	Timeline []StormSample `json:"timeline,omitempty"`
}

// StormSample is the recovery at one moment after the restart, summed
// over the replicas (a replica that does not answer counts nothing).
type StormSample struct {
	Seconds float64 `json:"t"`
	// Resumed is the resuming polls the servers took since the restart
	// (an agent's first after its failed one: the agents back); Held the
	// polls held at that instant, which trails Resumed while commands are
	// being answered.
	Resumed int `json:"resumed"`
	Held    int `json:"held"`
	// Pending is the commands recorded and not settled
	// (nodeward_pending_commands); Settled the burst's commands the agents
	// have settled.
	Pending int `json:"pending"`
	Settled int `json:"settled"`
}

func (c *StormConfig) defaults() error {
	if c.Agents < 1 || c.Commands < 0 {
		return errors.New("agents must be at least 1 and commands not negative")
	}
	if c.AgentsPerWorker <= 0 {
		c.AgentsPerWorker = 2500
	}
	if c.Issuers <= 0 {
		c.Issuers = 64
	}
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.Signal == 0 {
		c.Signal = syscall.SIGKILL
	}
	if c.Wait <= 0 {
		c.Wait = 25 * time.Second
	}
	if c.BackoffBase <= 0 {
		c.BackoffBase = time.Second
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = time.Minute
	}
	if c.Recover <= 0 {
		c.Recover = 2 * time.Minute
	}
	if c.Log == nil {
		c.Log = io.Discard
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

// stormWorker follows one worker's lines: its latest progress and its
// last line.
type stormWorker struct {
	w       *worker
	settled atomic.Int64
	done    chan workerMsg // the last line (closed without one if it exits early)
}

func followWorker(w *worker) *stormWorker {
	sw := &stormWorker{w: w, done: make(chan workerMsg, 1)}
	go func() {
		defer close(sw.done)
		for {
			var m workerMsg
			if err := w.read(&m); err != nil {
				return
			}
			switch m.Type {
			case "progress":
				sw.settled.Store(m.SettledDistinct)
			case "done":
				sw.settled.Store(m.SettledDistinct)
				sw.done <- m
				return
			}
		}
	}()
	return sw
}

// RunStorm performs a storm run.
func RunStorm(ctx context.Context, cfg StormConfig) (rep StormReport, err error) {
	if err := cfg.defaults(); err != nil {
		return rep, err
	}
	logf := func(format string, args ...any) { fmt.Fprintf(cfg.Log, "loadtest: "+format+"\n", args...) }
	rep.Date, rep.Agents, rep.Replicas = time.Now().UTC().Format(time.RFC3339), cfg.Agents, cfg.Replicas
	rep.Signal = map[syscall.Signal]string{syscall.SIGKILL: "KILL", syscall.SIGTERM: "TERM"}[cfg.Signal]
	logf("building and starting %d server process(es)", cfg.Replicas)
	cl, err := startCluster(ctx, clusterOptions{Replicas: cfg.Replicas, DatabaseURL: cfg.DatabaseURL, Log: cfg.Log})
	if cl != nil {
		defer cl.Close()
	}
	if err != nil {
		return rep, err
	}
	rep.Database = cl.Database
	urls := cl.URLs()
	admin := newAdmin(urls[0], cl.Token, cfg.Issuers, "")
	defer admin.tr.CloseIdleConnections()

	run := randomHex(4)
	boots, err := admin.inviteAll(ctx, run, cfg.Agents)
	if err != nil {
		return rep, err
	}
	wcfg := Config{WorkerCommand: cfg.WorkerCommand, Log: cfg.Log, Replicas: urls[1:]}
	ws, err := startWorkers(wcfg, workerJob{URL: urls[0], Wait: cfg.Wait, Enrollers: 16, Track: true, PollOnEnroll: true,
		Progress: 100 * time.Millisecond, BackoffBase: cfg.BackoffBase, BackoffMax: cfg.BackoffMax, StopBy: time.Now().Add(cfg.Recover + 15*time.Minute).UnixNano()}, boots, cfg.AgentsPerWorker)
	defer stopWorkers(ws)
	if err != nil {
		return rep, err
	}
	rep.Workers = len(ws)
	for i, w := range ws {
		var m workerMsg
		if err := w.read(&m); err != nil {
			return rep, fmt.Errorf("worker %d: %w", i, err)
		}
		if m.Failed > 0 {
			return rep, fmt.Errorf("worker %d: %d enrollments failed: %s", i, m.Failed, m.Error)
		}
	}
	followers := make([]*stormWorker, len(ws))
	for i, w := range ws {
		followers[i] = followWorker(w)
	}
	settled := func() int {
		n := int64(0)
		for _, f := range followers {
			n += f.settled.Load()
		}
		return int(n)
	}
	if _, err := waitFor(ctx, 2*time.Minute, func() bool { return sampleServers(ctx, urls).Held >= cfg.Agents }); err != nil {
		return rep, fmt.Errorf("holding %d agents: %w", cfg.Agents, err)
	}
	logf("%d agents hold their polls; issuing a burst of %d commands", cfg.Agents, cfg.Commands)

	var issued, parents []string
	if cfg.FanOut > 0 {
		n := min(cfg.FanOut, len(boots))
		parents = stormFanOuts(ctx, admin, run, boots, cfg.Commands/n, n, cfg.Issuers, &rep.IssueErrs, logf)
		rep.FanOuts, rep.Issued = len(parents), len(parents)*n
	} else {
		issued = stormBurst(ctx, admin, run, boots, cfg.Commands, cfg.Issuers, &rep.IssueErrs, logf)
		rep.Issued = len(issued)
	}
	if rep.IssueErrs > 0 {
		for _, r := range cl.Replicas {
			logf("replica %s errors:\n%s", r.ID, r.Errors(5))
		}
	}

	target := cl.Replicas[0]
	rep.SettledAtStop = settled()
	rep.PendingAtStop = rep.Issued - rep.SettledAtStop
	t0 := time.Now()
	cl.Stop(target, cfg.Signal)
	rep.StopSeconds = time.Since(t0).Seconds()
	// PendingAtStop is as the agents last reported (every 100 ms).
	logf("%d issued, %d pending at the stop; %s took %.2fs; restarting %s", rep.Issued, rep.PendingAtStop, rep.Signal, rep.StopSeconds, target.ID)
	restart := time.Now()
	if err := cl.Spawn(target); err != nil {
		return rep, err
	}
	win := cl.begin() // CPU over the recovery, per replica
	hc := &http.Client{Transport: transportFor(""), Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()
	if err := waitReady(ctx, hc, target.URL); err != nil {
		return rep, fmt.Errorf("restart: %w; log:\n%s", err, target.LogTail(20))
	}
	rep.ReadySeconds = time.Since(restart).Seconds()
	rep.AllHeldSeconds, rep.AllSettledSeconds = -1, -1
	var nextSample time.Duration
	_, _ = waitFor(ctx, cfg.Recover-time.Since(restart), func() bool {
		since := time.Since(restart)
		sampling := since >= nextSample
		if rep.AllHeldSeconds < 0 || sampling {
			smp := sampleServers(ctx, urls)
			if rep.AllHeldSeconds < 0 && smp.Held >= cfg.Agents {
				rep.AllHeldSeconds = time.Since(restart).Seconds()
			}
			if sampling {
				smp.Seconds, smp.Settled = since.Seconds(), settled()
				rep.Timeline = append(rep.Timeline, smp)
				nextSample = since + 500*time.Millisecond
			}
		}
		if rep.AllSettledSeconds < 0 && settled() >= rep.Issued {
			rep.AllSettledSeconds = time.Since(restart).Seconds()
		}
		return rep.AllHeldSeconds >= 0 && rep.AllSettledSeconds >= 0
	})
	logf("after the restart: ready %.2fs, all held %.2fs, all settled %.2fs", rep.ReadySeconds, rep.AllHeldSeconds, rep.AllSettledSeconds)
	rep.Servers = win.end(ctx)
	if cfg.FanOut > 0 {
		// Children settle before their parent ends (its advance runs
		// after): give the parents a moment, then list every child.
		var missing int
		_, _ = waitFor(ctx, 15*time.Second, func() bool {
			ended := 0
			for _, id := range parents {
				var op struct {
					State string `json:"state"`
				}
				if _, err := admin.do(ctx, http.MethodGet, "/api/v1/operations/"+id, nil, &op); err == nil && operationEnded(op.State) {
					ended++
				}
			}
			rep.FanOuts, rep.FanOutsEnded = len(parents), ended
			return ended == len(parents)
		})
		issued, missing = stormChildren(ctx, admin, parents, min(cfg.FanOut, len(boots)))
		rep.Lost += missing
	}
	for _, u := range urls {
		if m, err := scrape(ctx, u); err == nil {
			rep.ServerRedeliveries += m["nodeward_command_redeliveries_total"]
			rep.ServerResumes += m["nodeward_long_poll_resumes_total"]
		}
	}

	for _, w := range ws {
		_ = w.stdin.Close()
	}
	acked := map[string]bool{}
	for i, f := range followers {
		m, ok := <-f.done
		if !ok {
			return rep, fmt.Errorf("worker %d exited without its summary", i)
		}
		for _, id := range m.SettledIDs {
			acked[id] = true
		}
		rep.AppliedTwice += m.AfterSettle
		rep.Redelivered += m.Redelivered
		rep.AgentErrs += m.Errors
		rep.AgentResumes += m.Resumes
		if rep.FirstErr == "" {
			rep.FirstErr = m.FirstError
		}
	}
	for _, id := range issued {
		if !acked[id] {
			rep.Lost++
		}
	}
	return rep, nil
}

// stormBurst issues n commands round robin over the agents as fast as
// issuers go, answering the operation ids recorded (2xx).
func stormBurst(ctx context.Context, admin *adminClient, run string, boots []api.Bootstrap, n, issuers int, errs *int, logf func(string, ...any)) []string {
	return stormIssue(ctx, n, issuers, errs, logf, func(i int) (string, error) {
		op := "st-" + run + "-" + strconv.Itoa(i)
		body := `{"kind":"launch_workload","operation_id":"` + op + `","payload":{"run_id":"` + op +
			`","attempt_id":"1","command":"true","env":{"` + sentKey + `":"` + strconv.FormatInt(time.Now().UnixNano(), 10) + `"}}}`
		_, err := admin.do(ctx, http.MethodPost, "/api/v1/nodes/"+boots[i%len(boots)].NodeID+"/commands", []byte(body), nil)
		return op, err
	})
}

// stormFanOuts issues n fleet.command operations over per agents each,
// round robin, as fast as issuers go, answering the ids of those recorded.
func stormFanOuts(ctx context.Context, admin *adminClient, run string, boots []api.Bootstrap, n, per, issuers int, errs *int, logf func(string, ...any)) []string {
	nodes := make([]string, len(boots))
	for i, b := range boots {
		nodes[i] = b.NodeID
	}
	return stormIssue(ctx, n, issuers, errs, logf, func(i int) (string, error) {
		op := "sf-" + run + "-" + strconv.Itoa(i)
		payload := `{"run_id":"` + op + `","attempt_id":"1","command":"true","env":{"` + sentKey + `":"` + strconv.FormatInt(time.Now().UnixNano(), 10) + `"}}`
		var answer struct {
			ID string `json:"operation_id"`
		}
		_, err := admin.do(ctx, http.MethodPost, "/api/v1/operations", []byte(fleetCommandBody(op, payload, nodes, int64(i), per, 0)), &answer)
		if err == nil && answer.ID == "" {
			err = errors.New("the answer names no operation_id")
		}
		return answer.ID, err
	})
}

// stormIssue runs issue(0..n-1) on issuers goroutines and answers the ids
// it answered without an error, counting the errors in errs.
func stormIssue(ctx context.Context, n, issuers int, errs *int, logf func(string, ...any), issue func(i int) (string, error)) []string {
	var mu sync.Mutex
	var ok []string
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	for range min(issuers, max(n, 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				id, err := issue(i)
				mu.Lock()
				if err != nil {
					*errs++
					once.Do(func() { logf("issue: %v", err) })
				} else {
					ok = append(ok, id)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return ok
}

// stormChildren lists the children of every parent (each should have per)
// and answers their ids, and how many a parent lacks.
func stormChildren(ctx context.Context, admin *adminClient, parents []string, per int) (ids []string, missing int) {
	for _, p := range parents {
		var page struct {
			Operations []struct {
				ID string `json:"operation_id"`
			} `json:"operations"`
		}
		if _, err := admin.do(ctx, http.MethodGet, "/api/v1/node-operations?parent="+p+"&limit=500", nil, &page); err != nil {
			missing += per
			continue
		}
		for _, o := range page.Operations {
			ids = append(ids, o.ID)
		}
		missing += max(per-len(page.Operations), 0)
	}
	return ids, missing
}

// waitFor polls cond every 50 ms until it holds (answering how long that
// took) or d passed.
func waitFor(ctx context.Context, d time.Duration, cond func() bool) (time.Duration, error) {
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			return time.Since(start), fmt.Errorf("not reached in %s", d.Round(time.Second))
		}
		if !sleepCtx(ctx, 50*time.Millisecond) {
			return time.Since(start), ctx.Err()
		}
	}
	return time.Since(start), nil
}

func printStormReport(w io.Writer, r StormReport) {
	fmt.Fprintf(w, "date                     %s\n", r.Date)
	fmt.Fprintf(w, "agents                   %d in %d workers, %d replica(s) on %s\n", r.Agents, r.Workers, r.Replicas, r.Database)
	fmt.Fprintf(w, "burst                    %d recorded (%d errors); %d settled, %d pending at the stop\n", r.Issued, r.IssueErrs, r.SettledAtStop, r.PendingAtStop)
	if r.FanOuts > 0 {
		fmt.Fprintf(w, "fan-outs                 %d (their children are the burst); %d ended after the restart\n", r.FanOuts, r.FanOutsEnded)
	}
	fmt.Fprintf(w, "stop                     SIG%s, %.2fs to exit\n", r.Signal, r.StopSeconds)
	fmt.Fprintf(w, "after the restart        ready %.2fs; every agent holding %s; every command settled %s\n",
		r.ReadySeconds, secondsOrNever(r.AllHeldSeconds), secondsOrNever(r.AllSettledSeconds))
	fmt.Fprintf(w, "lost / applied twice     %d / %d (must be 0 / 0); redelivered before settling %d\n", r.Lost, r.AppliedTwice, r.Redelivered)
	fmt.Fprintf(w, "server redeliveries      %.0f (a delivery lost with the process, to a resuming poll or after the visibility timeout)\n", r.ServerRedeliveries)
	fmt.Fprintf(w, "resuming polls           %.0f taken by the servers since the restart; %d sent by the agents in all\n", r.ServerResumes, r.AgentResumes)
	fmt.Fprintf(w, "agent errors             %d (the outage's refused polls count here)\n", r.AgentErrs)
	if r.FirstErr != "" {
		fmt.Fprintf(w, "first agent error        %s\n", r.FirstErr)
	}
	printReplicaStats(w, r.Servers)
	if len(r.Timeline) > 0 {
		fmt.Fprintf(w, "recovery                 t: resumed polls / held / commands pending / settled\n")
		for _, smp := range r.Timeline {
			fmt.Fprintf(w, "  %5.1fs  %6d / %6d / %6d / %6d\n", smp.Seconds, smp.Resumed, smp.Held, smp.Pending, smp.Settled)
		}
	}
}

func secondsOrNever(s float64) string {
	if s < 0 {
		return "never (within -recover)"
	}
	return strconv.FormatFloat(s, 'f', 2, 64) + "s"
}
