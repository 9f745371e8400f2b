package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/agent/client"
	"github.com/nodeward/nodeward/agent/core"
)

// workerEnv marks a process as an agent worker: the coordinator re-executes
// its own binary with it set, and the worker reads its job from stdin.
const workerEnv = "NODEWARD_LOADTEST_WORKER"

// sentKey is the payload env entry carrying the time the command was meant
// to be issued (Unix nanoseconds): the start of its issue→receipt latency.
const sentKey = "LT_SENT"

// padKey is the payload env entry that pads a command (-payload-bytes).
const padKey = "LT_PAD"

// workerJob is what the coordinator hands a worker on stdin, one JSON line.
type workerJob struct {
	URL      string          `json:"url"`
	SourceIP string          `json:"source_ip"`
	Agents   []api.Bootstrap `json:"agents"`
	// Wait is the long-poll wait asked of the server.
	Wait time.Duration `json:"wait"`
	// Heartbeat, when > 0, makes each agent heartbeat at that interval
	// (first beat at a random offset within it).
	Heartbeat time.Duration `json:"heartbeat"`
	// Enrollers bounds concurrent enrollments.
	Enrollers int `json:"enrollers"`
	// Bare agents do not enroll: they long-poll the bare waiter with a
	// placeholder credential (the hold scenario's floor).
	Bare bool `json:"bare,omitempty"`
	// CACertificatePEM is trusted for an https URL.
	CACertificatePEM string `json:"ca_certificate_pem,omitempty"`
	// StopBy is the hard deadline (Unix nanoseconds): the worker stops by
	// then even if the coordinator never tells it to.
	StopBy int64 `json:"stop_by"`
	// Track keeps every operation id the agents received (the storm
	// scenario): a redelivery of an operation already applied is answered
	// as a duplicate, as the real agent does, and counted; the done line
	// carries the ids whose settlement was acknowledged.
	Track bool `json:"track,omitempty"`
	// Progress, when > 0, writes a progress line at that interval after
	// the enrolled line (only coordinators that read them ask for them).
	Progress time.Duration `json:"progress,omitempty"`
	// BackoffBase and BackoffMax, when set, make a failed poll retry as
	// the agent does (agent/core: each failure doubles the ceiling up to
	// max, the delay drawn from [ceiling/2, ceiling)); unset, 50 ms
	// doubling to 2 s.
	BackoffBase time.Duration `json:"backoff_base,omitempty"`
	BackoffMax  time.Duration `json:"backoff_max,omitempty"`
	// SpreadPolls makes each agent's first poll ask for a wait drawn
	// uniformly from 1 s to Wait (whole seconds), so the fleet re-polls
	// at an even Agents/Wait a second from then on, as a fleet that has
	// run a while does. Without it every first poll lasts Wait, and since
	// the fleet enrolls within a few seconds, all of it re-polls in one
	// wave Wait after the bring-up and hardly at all in between: a window
	// placed on the wave measures a burst several times the steady rate,
	// one placed before it measures an idle fleet (issue 13: the hold
	// run's p99 of 2.1 s against 19.6 ms in-process was that placement).
	SpreadPolls bool `json:"spread_polls,omitempty"`
	// PollOnEnroll starts each agent's long-poll as soon as its own
	// enrollment answers, as the real agent does. Without it the worker
	// enrolls all its agents first (the enroll scenario, which measures
	// enrollment alone): over thousands of agents that lets the first
	// leases lapse before their first poll and then opens every poll at
	// once, a bring-up no real fleet has.
	PollOnEnroll bool `json:"poll_on_enroll,omitempty"`
}

// firstPollWait is an agent's first poll wait when the fleet's polls are
// spread: uniform in whole seconds from 1 s to wait (wait itself when it
// is under 2 s).
func firstPollWait(wait time.Duration) time.Duration {
	secs := int(wait / time.Second)
	if secs < 2 {
		return wait
	}
	return time.Duration(1+rand.IntN(secs)) * time.Second
}

// workerMsg is one line a worker writes on stdout.
type workerMsg struct {
	Type string `json:"type"` // "enrolled", "progress" or "done"
	// enrolled
	Enrolled    int     `json:"enrolled,omitempty"`
	Failed      int     `json:"failed,omitempty"`
	Error       string  `json:"error,omitempty"`
	EnrollLatUS []int64 `json:"enroll_lat_us,omitempty"` // one enrollment's round trip, retries included
	// Enrollments tried again: after a 503 overloaded (shed) and after
	// any other transient failure (a timeout, a 5xx).
	EnrollsShed   int64 `json:"enrolls_shed,omitempty"`
	EnrollRetries int64 `json:"enroll_retries,omitempty"`
	// progress (and done): distinct operations whose settlement was
	// acknowledged (Track).
	SettledDistinct int64 `json:"settled_distinct,omitempty"`
	// done, with Track
	SettledIDs []string `json:"settled_ids,omitempty"`
	// Redelivered counts deliveries of an operation the agent had already
	// received but whose settlement it had not seen acknowledged (at least
	// once delivery across an outage: expected).
	Redelivered int64 `json:"redelivered,omitempty"`
	// AfterSettle counts deliveries of an operation whose settlement had
	// been acknowledged: an agent without the duplicate check would apply
	// it twice. Must be 0.
	AfterSettle int64 `json:"after_settle,omitempty"`
	// done
	Received    int64   `json:"received,omitempty"`
	Settled     int64   `json:"settled,omitempty"`
	Heartbeats  int64   `json:"heartbeats,omitempty"`
	Polls       int64   `json:"polls,omitempty"`
	Resumes     int64   `json:"resumes,omitempty"` // polls sent with resume=true
	Errors      int64   `json:"errors,omitempty"`
	FirstError  string  `json:"first_error,omitempty"`
	SentLatUS   []int64 `json:"sent_lat_us,omitempty"`   // intended issue → receipt
	IssuedLatUS []int64 `json:"issued_lat_us,omitempty"` // server issued_at → receipt
	SettleLatUS []int64 `json:"settle_lat_us,omitempty"` // intended issue → settle acknowledged
	// Desired configurations received and reported applied, and when the
	// last report was acknowledged (Unix nanoseconds).
	ConfigsReceived int64 `json:"configs_received,omitempty"`
	ConfigsReported int64 `json:"configs_reported,omitempty"`
	LastConfigNS    int64 `json:"last_config_ns,omitempty"`
}

// workerMain runs one worker process: enroll its agents, report, hold
// their long-polls and answer every command until stdin closes or StopBy.
func workerMain(stdin io.Reader, stdout io.Writer) error {
	rd := bufio.NewReader(stdin)
	line, err := rd.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("worker: read job: %w", err)
	}
	var job workerJob
	if err := json.Unmarshal(line, &job); err != nil {
		return fmt.Errorf("worker: decode job: %w", err)
	}
	u, err := client.CheckURL(job.URL, true)
	if err != nil {
		return err
	}
	if !client.IsLoopbackHost(u.Hostname()) {
		return fmt.Errorf("worker: %s is not a loopback address; the load tool only sends to loopback", job.URL)
	}
	out := json.NewEncoder(stdout)
	ctx, cancel := context.WithDeadline(context.Background(), time.Unix(0, job.StopBy))
	defer cancel()
	go func() {
		// The coordinator closes stdin to stop us (or dies, which does too).
		_, _ = io.Copy(io.Discard, rd)
		cancel()
	}()

	w := newAgentPool(job)
	var wg sync.WaitGroup
	poll := func(c *client.Client) {
		wg.Add(1)
		go func() { defer wg.Done(); w.run(ctx, c) }()
	}
	var onEnrolled func(*client.Client)
	if job.PollOnEnroll {
		onEnrolled = poll
	}
	enrolled, failed, firstErr := w.enrollAll(ctx, onEnrolled)
	msg := workerMsg{Type: "enrolled", Enrolled: len(enrolled), Failed: failed, EnrollLatUS: w.enrollLat,
		EnrollsShed: w.enrollsShed.Load(), EnrollRetries: w.enrollRetries.Load()}
	if firstErr != nil {
		msg.Error = firstErr.Error()
	}
	var outMu sync.Mutex // progress lines and the last line
	if err := out.Encode(msg); err != nil {
		return err
	}
	if job.Progress > 0 {
		go func() {
			t := time.NewTicker(job.Progress)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				outMu.Lock()
				_ = out.Encode(workerMsg{Type: "progress", SettledDistinct: w.settledDistinct.Load()})
				outMu.Unlock()
			}
		}()
	}
	if !job.PollOnEnroll {
		for _, c := range enrolled {
			poll(c)
		}
	}
	<-ctx.Done()
	wg.Wait()
	w.tr.CloseIdleConnections()
	outMu.Lock()
	defer outMu.Unlock()
	return out.Encode(w.summary())
}

// agentPool is a worker's simulated agents: a goroutine each, one shared
// transport dialling from the worker's own loopback source address.
type agentPool struct {
	job workerJob
	hc  *http.Client
	tr  *http.Transport

	received, settled, heartbeats, polls, errors atomic.Int64
	resumes                                      atomic.Int64 // polls sent with resume=true
	// configs received in poll answers and reported applied; lastConfig
	// is when the last report was acknowledged (Unix nanoseconds).
	configsReceived, configsReported, lastConfig atomic.Int64
	settledDistinct, redelivered, afterSettle    atomic.Int64
	// enrollments answered 503 overloaded (shed) and other failures
	// retried (timeouts, 5xx): each retried as the real agent does.
	enrollsShed, enrollRetries atomic.Int64

	mu         sync.Mutex // guards the following
	firstError string
	sentLat    []int64
	issuedLat  []int64
	settleLat  []int64
	enrollLat  []int64
	// ops is every operation received (Track): true once its settlement
	// was acknowledged.
	ops map[string]bool
}

func newAgentPool(job workerJob) *agentPool {
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	if job.SourceIP != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(job.SourceIP)}
	}
	tr := &http.Transport{
		DialContext:         d.DialContext,
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: 2*len(job.Agents) + 64, // a held long-poll plus a report each
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   false,
	}
	if job.CACertificatePEM != "" {
		tr.TLSClientConfig = transportFor(job.CACertificatePEM).TLSClientConfig
	}
	return &agentPool{job: job, tr: tr, ops: map[string]bool{}, hc: &http.Client{Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (w *agentPool) fail(err error) {
	w.errors.Add(1)
	w.mu.Lock()
	if w.firstError == "" {
		w.firstError = err.Error()
	}
	w.mu.Unlock()
}

func loadFacts() api.Facts {
	free := int64(20 << 30)
	return api.Facts{Hostname: "loadtest", OS: "linux", Arch: "amd64", CPUs: 8, MemoryBytes: 32 << 30,
		DiskFreeBytes: &free, AgentVersion: "loadtest", Runtimes: []string{"process"}, ObservedAt: time.Now().UTC(),
		// What the real agent reports: a node without a list is read as an
		// older agent, whose claims cost a read for commands it cannot run.
		Capabilities: core.Capabilities}
}

// enrollAll enrolls every agent of the job, a few at a time, calling
// onEnrolled (when set) with each agent as soon as its enrollment answers.
func (w *agentPool) enrollAll(ctx context.Context, onEnrolled func(*client.Client)) ([]*client.Client, int, error) {
	n := max(1, w.job.Enrollers)
	sem := make(chan struct{}, n)
	var mu sync.Mutex
	var out []*client.Client
	var failed int
	var firstErr error
	var wg sync.WaitGroup
	for _, boot := range w.job.Agents {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := client.New(client.Options{BaseURL: w.job.URL, AllowInsecureHTTP: true, HTTPClient: w.hc, UserAgent: "nodeward-loadtest"})
			if err == nil && w.job.Bare {
				c.SetSessionToken("bare")
			} else if err == nil {
				var resp *api.EnrollResponse
				t0 := time.Now()
				resp, err = w.enroll(ctx, c, boot)
				if err == nil {
					c.SetSessionToken(resp.SessionToken)
					lat := time.Since(t0).Microseconds()
					w.mu.Lock()
					w.enrollLat = append(w.enrollLat, lat)
					w.mu.Unlock()
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed++
				if firstErr == nil {
					firstErr = err
				}
				return
			}
			out = append(out, c)
			if onEnrolled != nil {
				onEnrolled(c)
			}
		}()
	}
	wg.Wait()
	return out, failed, firstErr
}

// enroll redeems one agent's bootstrap, retrying what the real agent
// retries (agent/core enroll: a timeout, a 5xx, a 429, a 408) with its backoff —
// 1 s doubling to 30 s, each delay drawn from [ceiling/2, ceiling), at
// least the Retry-After asked — until a refusal or ctx's end. Like the
// agent, every attempt carries one nonce, so an attempt that committed with
// its answer lost is answered again on retry. The latency recorded is the
// whole of it, retries included.
func (w *agentPool) enroll(ctx context.Context, c *client.Client, boot api.Bootstrap) (*api.EnrollResponse, error) {
	req := api.EnrollRequest{NodeID: boot.NodeID, Generation: boot.Generation,
		EnrollmentToken: boot.EnrollmentToken, AgentVersion: "loadtest", Facts: loadFacts(),
		EnrollmentNonce: fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64())}
	ceiling := time.Second
	for {
		resp, err := c.Enroll(ctx, req)
		if err == nil || ctx.Err() != nil {
			return resp, err
		}
		var ce *client.Error
		if errors.As(err, &ce) && ce.Status/100 == 4 && ce.Status != http.StatusTooManyRequests && ce.Status != http.StatusRequestTimeout {
			return nil, err
		}
		if client.CodeOf(err) == client.CodeOverloaded {
			w.enrollsShed.Add(1)
		} else {
			w.enrollRetries.Add(1)
		}
		d := ceiling/2 + time.Duration(rand.Int64N(int64(ceiling/2)))
		if ce != nil && ce.RetryAfter > d {
			d = ce.RetryAfter
		}
		ceiling = min(2*ceiling, 30*time.Second)
		if !sleepCtx(ctx, d) {
			return nil, err
		}
	}
}

// lostConnectionRetryMax mirrors agent/core's: while the server's
// process is gone (client.ConnectionLost) an agent-like retry's ceiling
// stops doubling at 5 s.
const lostConnectionRetryMax = 5 * time.Second

// run is one agent: long-poll, answer what arrives, poll again. Like the
// agent (agent/core pollLoop), its first poll and the first after a failed
// one ask the server to resume, so an answer lost with a killed server is
// handed out again at once rather than after the visibility timeout.
func (w *agentPool) run(ctx context.Context, c *client.Client) {
	if w.job.Heartbeat > 0 {
		go w.heartbeat(ctx, c)
	}
	base, most, jittered := 50*time.Millisecond, 2*time.Second, false
	if w.job.BackoffBase > 0 && w.job.BackoffMax > 0 {
		base, most, jittered = w.job.BackoffBase, w.job.BackoffMax, true
	}
	backoff := base
	resume := !w.job.Bare // the bare waiter knows no such thing
	wait := w.job.Wait
	if w.job.SpreadPolls {
		wait = firstPollWait(wait)
	}
	for ctx.Err() == nil {
		w.polls.Add(1)
		if resume {
			w.resumes.Add(1)
		}
		resp, err := c.Poll(ctx, wait, client.PollOptions{Resume: resume})
		wait = w.job.Wait
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.fail(err)
			resume = !w.job.Bare
			d := backoff
			if jittered {
				if client.ConnectionLost(err) {
					d = min(d, lostConnectionRetryMax)
				}
				d = d/2 + time.Duration(rand.Int64N(int64(d-d/2)+1))
			}
			sleepCtx(ctx, d)
			backoff = min(2*backoff, most)
			continue
		}
		backoff = base
		resume = false
		if resp.Config != nil {
			w.reportConfig(ctx, c, resp.Config)
		}
		if len(resp.Commands) == 0 {
			continue
		}
		got := time.Now()
		results := make([]api.Result, len(resp.Commands))
		sent := make([]int64, len(resp.Commands))
		for i, cmd := range resp.Commands {
			w.received.Add(1)
			results[i] = api.Result{OperationID: cmd.OperationID, Applied: true}
			sent[i] = sentAt(cmd.Payload)
			w.mu.Lock()
			if w.job.Track {
				if acked, seen := w.ops[cmd.OperationID]; seen {
					// Applied already: answer as the real agent does.
					results[i].Duplicate = true
					if acked {
						w.afterSettle.Add(1)
					} else {
						w.redelivered.Add(1)
					}
					sent[i] = 0 // its latency was taken at the first receipt
				} else {
					w.ops[cmd.OperationID] = false
				}
			}
			if sent[i] > 0 {
				w.sentLat = append(w.sentLat, got.Sub(time.Unix(0, sent[i])).Microseconds())
			}
			w.issuedLat = append(w.issuedLat, got.Sub(cmd.IssuedAt).Microseconds())
			w.mu.Unlock()
		}
		res, err := w.results(ctx, c, results)
		if err != nil {
			continue
		}
		done := time.Now()
		for i, s := range res.Settled {
			if s.State != "applied" {
				w.fail(fmt.Errorf("result %s answered %+v", s.OperationID, s))
				continue
			}
			w.settled.Add(1)
			if w.job.Track {
				w.mu.Lock()
				if !w.ops[s.OperationID] {
					w.ops[s.OperationID] = true
					w.settledDistinct.Add(1)
				}
				w.mu.Unlock()
			}
			if i < len(sent) && sent[i] > 0 {
				w.mu.Lock()
				w.settleLat = append(w.settleLat, done.Sub(time.Unix(0, sent[i])).Microseconds())
				w.mu.Unlock()
			}
		}
	}
}

// reportConfig answers a delivered configuration as an agent without a
// hook would: applied, through POST /agent/v1/events kind config.
func (w *agentPool) reportConfig(ctx context.Context, c *client.Client, d *api.ConfigDelivery) {
	w.configsReceived.Add(1)
	// A report under way when the worker is told to stop is finished
	// (bounded), so the counts say what the server acknowledged.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	id := "cfg-" + strconv.FormatInt(d.Revision, 10) + "-" + d.Hash[:min(len(d.Hash), 16)]
	_, err := c.Events(rctx, []api.Event{{ID: id, Kind: api.EventConfig, ObservedAt: time.Now().UTC(),
		Config: &api.ConfigReport{Revision: d.Revision, Hash: d.Hash, State: api.ConfigApplied}}})
	if err != nil {
		w.fail(err)
		return
	}
	w.configsReported.Add(1)
	now := time.Now().UnixNano()
	for {
		last := w.lastConfig.Load()
		if now <= last || w.lastConfig.CompareAndSwap(last, now) {
			return
		}
	}
}

// results reports results, retrying with backoff for up to a minute (the
// server may be restarting; settling again is idempotent), as the agent
// keeps its results until they are acknowledged. A report under way when
// the worker is told to stop is finished (bounded) but not retried: the
// server may have settled it already, and the counts must say what it
// acknowledged.
func (w *agentPool) results(ctx context.Context, c *client.Client, results []api.Result) (*api.ResultsResponse, error) {
	backoff := 50 * time.Millisecond
	giveUp := time.Now().Add(time.Minute)
	for {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		res, err := c.Results(rctx, results)
		cancel()
		if err == nil || ctx.Err() != nil {
			return res, err
		}
		w.fail(err)
		if time.Now().After(giveUp) || !sleepCtx(ctx, backoff) {
			return nil, err
		}
		backoff = min(2*backoff, time.Second)
	}
}

func (w *agentPool) heartbeat(ctx context.Context, c *client.Client) {
	every := w.job.Heartbeat
	first := time.Duration(rand.Int64N(int64(every)))
	if !sleepCtx(ctx, first) {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for seq := 0; ; seq++ {
		f := loadFacts()
		_, err := c.Events(ctx, []api.Event{{ID: "hb-" + strconv.Itoa(seq), Kind: api.EventHeartbeat, ObservedAt: time.Now().UTC(), Facts: &f}})
		switch {
		case err == nil:
			w.heartbeats.Add(1)
		case ctx.Err() == nil:
			w.fail(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (w *agentPool) summary() workerMsg {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := workerMsg{Type: "done", Received: w.received.Load(), Settled: w.settled.Load(), Heartbeats: w.heartbeats.Load(),
		Polls: w.polls.Load(), Resumes: w.resumes.Load(), Errors: w.errors.Load(), FirstError: w.firstError,
		SentLatUS: w.sentLat, IssuedLatUS: w.issuedLat, SettleLatUS: w.settleLat,
		ConfigsReceived: w.configsReceived.Load(), ConfigsReported: w.configsReported.Load(), LastConfigNS: w.lastConfig.Load(),
		SettledDistinct: w.settledDistinct.Load(), Redelivered: w.redelivered.Load(), AfterSettle: w.afterSettle.Load()}
	if w.job.Track {
		for id, acked := range w.ops {
			if acked {
				m.SettledIDs = append(m.SettledIDs, id)
			}
		}
	}
	return m
}

// sentAt reads the intended issue time from a load-tool payload; 0 when
// the payload is not one.
func sentAt(payload json.RawMessage) int64 {
	var p struct {
		Env map[string]string `json:"env"`
	}
	if json.Unmarshal(payload, &p) != nil {
		return 0
	}
	n, _ := strconv.ParseInt(p.Env[sentKey], 10, 64)
	return n
}

// sleepCtx sleeps d or until ctx ends; false when ctx ended.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func runWorker() int {
	if err := workerMain(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
