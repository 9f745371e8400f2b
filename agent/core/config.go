package core

// # Desired configuration (DECISIONS.md §32)
//
// A poll answer may carry the node's desired configuration. The agent
// converges on it beside the poll loop, one apply at a time:
//
//  1. The status "applying revision R hash H (attempt n)" is recorded
//     (config/status.json, fsynced) before anything else.
//  2. The document is written atomically to config/current.json (removed
//     when the configuration was cleared) and {revision, hash, format} to
//     config/current.meta.json.
//  3. The apply hook, if any, runs: its argv (--config-hook, split on
//     white space, no shell) plus the document's path ("" when cleared),
//     with NODEWARD_CONFIG_REVISION, NODEWARD_CONFIG_HASH and
//     NODEWARD_CONFIG_FORMAT set, for at most ConfigHookTimeout (then its
//     process group is killed and the apply failed). Without a hook,
//     writing the file is applying.
//  4. The outcome (applied, or failed with a message ending in the hook's
//     output tail) is recorded in the status, then spooled as a "config"
//     event like any other report.
//
// A restart finds the status and reports it again; a status still
// "applying" (the agent stopped between 1 and 4) is applied once more, and
// when that second attempt is interrupted too it is reported failed instead
// of being run a third time. Hooks must therefore be idempotent. A hook
// the previous life left running (a crash or kill -9 does not reach its
// process group, and the service's KillMode=process keeps it) is killed
// first, so two runs never overlap: the hook runs with the attempt's id in
// NODEWARD_CONFIG_APPLY_ID, and the restart kills the process groups led
// by a process carrying that id (never a session leader: a daemon the hook
// started with setsid is not the hook's to kill).
//
// Deliveries are level-triggered: the server repeats one until a report
// names it. So the agent ignores a revision lower than the newest it knows,
// ignores the revision it is applying now, remembers the newest delivery
// that arrives while a hook runs and applies it afterwards, and answers a
// delivery of the revision and hash it already applied with "applied" at
// once, without the hook. A delivery of a revision it reported failed is
// re-run (the server only pushes a failed revision again when an operator
// forces it). A delivery asked for before the server had the agent's last
// report for that revision (its spooled event not yet delivered when the
// poll went out) tells nothing new and is ignored: it is an echo of what
// the server knew before, not a request.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/agent/state"
)

// hookOutputTail is how much of the hook's combined output a failure report
// carries: the server keeps at most 4 KiB of a message.
const hookOutputTail = 3 << 10

// maxConfigAttempts bounds how often one delivery of a revision is applied
// when applying it keeps being interrupted (a crash, kill -9, a hook that
// restarts the agent): the first run and one more.
const maxConfigAttempts = 2

// converger is the agent's configuration state in memory.
type converger struct {
	mu      sync.Mutex // guards the following
	status  state.ConfigStatus
	known   bool                // status was ever written
	running *api.ConfigDelivery // being applied now
	pending *api.ConfigDelivery // newest delivery waiting for the running apply
	// The last report: its event id, whether it is spooled, whether the
	// server has it and, if so, the number of the last poll sent before it
	// did (pollSeq numbers polls as they go out).
	reportID        string
	reportSpooled   bool
	reportDelivered bool
	deliveredSeq    uint64
	pollSeq         uint64
}

// nextPollSeq numbers a poll about to be sent.
func (a *Agent) nextPollSeq() uint64 {
	c := &a.conv
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pollSeq++
	return c.pollSeq
}

// eventsDelivered notes that the server has these events (or refused them
// for good).
func (a *Agent) eventsDelivered(ids []string) {
	c := &a.conv
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reportID != "" && !c.reportDelivered && slices.Contains(ids, c.reportID) {
		c.reportDelivered, c.deliveredSeq = true, c.pollSeq
	}
}

// echoLocked reports whether a poll numbered seq went out before the server
// could have had the last report.
func (c *converger) echoLocked(seq uint64) bool {
	return c.reportID != "" && (!c.reportDelivered || seq <= c.deliveredSeq)
}

// ConfigStatus answers the agent's configuration status (ok false before
// any configuration was delivered).
func (a *Agent) ConfigStatus() (st state.ConfigStatus, ok bool) {
	a.conv.mu.Lock()
	defer a.conv.mu.Unlock()
	return a.conv.status, a.conv.known
}

func sameConfig(x *api.ConfigDelivery, d api.ConfigDelivery) bool {
	return x != nil && x.Revision == d.Revision && x.Hash == d.Hash
}

// resumeConfig runs at start: it reports the remembered outcome again, or
// resumes an apply a previous run of the agent did not finish.
func (a *Agent) resumeConfig(ctx context.Context) {
	st, ok, err := a.store.ConfigStatus()
	if err != nil {
		a.log.Error("read configuration status; the next delivery is applied afresh", "err", err)
		return
	}
	if !ok {
		return
	}
	if st.State == state.ConfigApplying {
		if n := killHookGroups(st.ApplyID, hookKillWait); n > 0 {
			a.log.Warn("config hook of the interrupted apply was still running; killed it", "revision", st.Revision, "process_groups", n)
		}
	}
	c := &a.conv
	c.mu.Lock()
	defer c.mu.Unlock()
	c.status, c.known = st, true
	d := api.ConfigDelivery{Revision: st.Revision, Hash: st.Hash, Format: st.Format}
	switch st.State {
	case api.ConfigApplied, api.ConfigFailed:
		a.log.Info("configuration remembered; reporting it again", "revision", st.Revision, "hash", st.Hash, "state", st.State)
		a.reportLocked(st)
	case state.ConfigApplying:
		if st.Attempt >= maxConfigAttempts {
			a.log.Error("configuration apply was interrupted again; not running the hook a third time", "revision", st.Revision, "attempt", st.Attempt)
			a.finishLocked(d, st.Cleared, st.Attempt, api.ConfigFailed,
				fmt.Sprintf("applying revision %d was interrupted %d times (the agent stopped while the config hook ran); not run again: configure it again with force to retry", st.Revision, st.Attempt))
			return
		}
		// The document of an interrupted apply is on disk only if its meta
		// was written (after the document); otherwise the hook never ran
		// and the server delivers the revision again.
		meta, err := a.store.ConfigMeta()
		if err != nil || meta.Revision != st.Revision || meta.Hash != st.Hash {
			a.log.Warn("interrupted configuration apply never wrote its document; waiting for the revision to be delivered again", "revision", st.Revision)
			c.status, c.known = state.ConfigStatus{}, false
			return
		}
		doc := []byte("null")
		if !st.Cleared {
			if doc, err = os.ReadFile(a.store.ConfigPath()); err != nil {
				a.log.Warn("interrupted configuration apply: document unreadable; waiting for the revision to be delivered again", "revision", st.Revision, "err", err)
				c.status, c.known = state.ConfigStatus{}, false
				return
			}
		}
		d.Document = doc
		a.log.Warn("configuration apply was interrupted; applying it once more (hooks must be idempotent)", "revision", st.Revision, "attempt", st.Attempt+1)
		a.startApplyLocked(ctx, d, st.Attempt+1)
	}
}

// offerConfig takes a configuration a poll numbered seq answered.
func (a *Agent) offerConfig(ctx context.Context, seq uint64, d api.ConfigDelivery) {
	c := &a.conv
	c.mu.Lock()
	defer c.mu.Unlock()
	newest := int64(0)
	if c.known {
		newest = c.status.Revision
	}
	for _, x := range []*api.ConfigDelivery{c.running, c.pending} {
		if x != nil && x.Revision > newest {
			newest = x.Revision
		}
	}
	switch {
	case d.Revision < newest:
		a.log.Warn("configuration delivery older than one already written; ignored", "revision", d.Revision, "newest", newest)
		return
	case sameConfig(c.running, d), sameConfig(c.pending, d):
		return // being applied, or next
	case c.running != nil:
		a.log.Info("configuration delivered while another is being applied; it is applied next", "revision", d.Revision, "applying", c.running.Revision)
		c.pending = &d
		return
	}
	if c.known && c.status.Revision == d.Revision && c.status.Hash == d.Hash &&
		(c.status.State == api.ConfigApplied || c.status.State == api.ConfigFailed) {
		switch {
		case !c.reportSpooled:
			// The outcome could not be spooled before: try again now.
			a.reportLocked(c.status)
			return
		case c.echoLocked(seq):
			return
		case c.status.State == api.ConfigApplied:
			a.log.Info("configuration delivered again is the one applied; reporting applied without running the hook", "revision", d.Revision)
			a.reportLocked(c.status)
			return
		case c.status.State == api.ConfigFailed:
			a.log.Info("configuration that failed delivered again: applying it again", "revision", d.Revision)
		}
	}
	a.startApplyLocked(ctx, d, 1)
}

// startApplyLocked starts the one apply worker on d; it goes on with the
// pending delivery, if any, when d is done.
func (a *Agent) startApplyLocked(ctx context.Context, d api.ConfigDelivery, attempt int) {
	c := &a.conv
	c.running = &d
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		for {
			if !a.applyConfig(ctx, d, attempt) {
				c.mu.Lock()
				c.running, c.pending = nil, nil
				c.mu.Unlock()
				return
			}
			c.mu.Lock()
			if c.pending == nil {
				c.running = nil
				c.mu.Unlock()
				return
			}
			d, attempt = *c.pending, 1
			c.pending = nil
			c.running = &d
			c.mu.Unlock()
		}
	}()
}

// applyConfig runs steps 1–4 for d. It answers false when ctx ended first:
// the status stays "applying", to be resolved on the next start.
func (a *Agent) applyConfig(ctx context.Context, d api.ConfigDelivery, attempt int) bool {
	log := a.log.With("revision", d.Revision, "hash", d.Hash, "format", d.Format)
	cleared := state.IsCleared(d.Document)
	marker := state.ConfigStatus{Revision: d.Revision, Hash: d.Hash, Format: d.Format, Cleared: cleared,
		State: state.ConfigApplying, Attempt: attempt, ApplyID: uuid.NewString(), At: a.clock.Now().UTC()}
	if err := a.store.SetConfigStatus(marker); err != nil {
		log.Error("cannot record the configuration apply; not applying it", "err", err)
		a.finish(d, cleared, attempt, api.ConfigFailed, "the agent could not record the apply in its state directory: "+err.Error())
		return true
	}
	a.conv.mu.Lock()
	a.conv.status, a.conv.known = marker, true
	a.conv.mu.Unlock()
	a.mu.Lock()
	a.stats.ConfigApplies++
	a.mu.Unlock()

	path, err := a.store.WriteConfig(d)
	if err != nil {
		log.Error("cannot write the configuration", "err", err)
		a.finish(d, cleared, attempt, api.ConfigFailed, "the agent could not write the configuration: "+err.Error())
		return true
	}
	if len(a.cfg.ConfigHook) == 0 {
		log.Info("configuration written", "path", path)
		a.finish(d, cleared, attempt, api.ConfigApplied, "")
		return true
	}
	a.mu.Lock()
	a.stats.ConfigHookRuns++
	a.mu.Unlock()
	msg, ok := a.runConfigHook(ctx, path, d, marker.ApplyID)
	if ctx.Err() != nil {
		log.Info("agent stopping: configuration apply interrupted; it is resolved on the next start")
		return false
	}
	if ok {
		log.Info("configuration applied", "path", path)
		a.finish(d, cleared, attempt, api.ConfigApplied, "")
	} else {
		// The message may carry the hook's output, hence document values:
		// it goes to the server (which scrubs secrets), never to the log.
		log.Warn("configuration hook failed; reported failed")
		a.finish(d, cleared, attempt, api.ConfigFailed, msg)
	}
	return true
}

func (a *Agent) finish(d api.ConfigDelivery, cleared bool, attempt int, outcome, msg string) {
	a.conv.mu.Lock()
	defer a.conv.mu.Unlock()
	a.finishLocked(d, cleared, attempt, outcome, msg)
}

// finishLocked records the outcome, then reports it.
func (a *Agent) finishLocked(d api.ConfigDelivery, cleared bool, attempt int, outcome, msg string) {
	st := state.ConfigStatus{Revision: d.Revision, Hash: d.Hash, Format: d.Format, Cleared: cleared,
		State: outcome, Attempt: attempt, Message: msg, At: a.clock.Now().UTC()}
	if err := a.store.SetConfigStatus(st); err != nil {
		// Reported all the same; a restart re-runs the apply from its marker.
		a.log.Error("cannot record the configuration outcome", "revision", d.Revision, "err", err)
	}
	a.conv.status, a.conv.known = st, true
	a.reportLocked(st)
}

// reportLocked spools a report of st with a fresh event id: the server
// deduplicates by id, and a report made again (after a restart or a
// re-enrollment) must count as the node's latest. A report that cannot be
// spooled (the spool full of events that are never dropped) stays owed: the
// next delivery of the revision tries again, loudly.
func (a *Agent) reportLocked(st state.ConfigStatus) {
	c := &a.conv
	now := a.clock.Now().UTC()
	ev := api.Event{ID: uuid.NewString(), Kind: api.EventConfig, ObservedAt: now,
		Config: &api.ConfigReport{Revision: st.Revision, Hash: st.Hash, State: st.State, Message: st.Message}}
	c.reportID, c.reportDelivered, c.deliveredSeq = ev.ID, false, 0
	if err := a.store.AppendEvent(ev); err != nil {
		c.reportSpooled = false
		a.log.Error("cannot spool the configuration report; it is owed until the revision is delivered again", "revision", st.Revision, "state", st.State, "err", err)
		return
	}
	c.reportSpooled = true
	a.mu.Lock()
	a.stats.ConfigReports++
	a.mu.Unlock()
	a.flushSoon()
}

// runConfigHook runs the apply hook for the document at path ("" when
// cleared). ok is true when it exited 0; otherwise msg says why, ending in
// the tail of its combined output.
func (a *Agent) runConfigHook(ctx context.Context, path string, d api.ConfigDelivery, applyID string) (msg string, ok bool) {
	timeout := a.cfg.ConfigHookTimeout
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var timedOut atomic.Bool
	t := a.clock.NewTimer(timeout)
	defer t.Stop()
	go func() {
		select {
		case <-t.C():
			timedOut.Store(true)
			cancel()
		case <-hctx.Done():
		}
	}()

	argv := a.cfg.ConfigHook
	cmd := exec.CommandContext(hctx, argv[0], append(slices.Clone(argv[1:]), path)...)
	cmd.Env = hookEnv(d, applyID)
	out := &tailBuffer{max: hookOutputTail}
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group, killed whole: a script's children must not
	// outlive the deadline (nor hold its output open).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		if errors.Is(err, syscall.ESRCH) {
			return os.ErrProcessDone // gone already: its own exit status stands
		}
		return err
	}
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Start()
	if err == nil {
		a.log.Debug("config hook started", "revision", d.Revision, "pid", cmd.Process.Pid)
		err = cmd.Wait()
	}
	tail := func() string {
		if s := out.String(); s != "" {
			return "; output (tail): " + s
		}
		return ""
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
		return "", true
	case timedOut.Load():
		return fmt.Sprintf("config hook timed out after %s and was killed%s", timeout, tail()), false
	case ctx.Err() != nil:
		return "config hook interrupted: the agent is stopping", false
	case errors.As(err, &ee):
		return fmt.Sprintf("config hook failed (%s)%s", ee.ProcessState, tail()), false
	default:
		return fmt.Sprintf("config hook could not run: %v%s", err, tail()), false
	}
}

// hookEnv is the agent's environment without its own settings (a bootstrap
// passed in the environment carries an enrollment token) plus the revision
// being applied and the attempt's id.
func hookEnv(d api.ConfigDelivery, applyID string) []string {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "NODEWARD_AGENT_") || strings.HasPrefix(kv, "NODEWARD_CONFIG_")
	})
	return append(env,
		"NODEWARD_CONFIG_REVISION="+strconv.FormatInt(d.Revision, 10),
		"NODEWARD_CONFIG_HASH="+d.Hash,
		"NODEWARD_CONFIG_FORMAT="+d.Format,
		hookApplyEnv+applyID,
	)
}

// tailBuffer keeps the last max bytes written to it. exec calls Write from
// one goroutine at a time when Stdout and Stderr are the same writer.
type tailBuffer struct {
	max int
	b   []byte
	cut bool
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
		t.cut = true
	}
	return len(p), nil
}

// String is the tail as text, starting at a whole character.
func (t *tailBuffer) String() string {
	b := t.b
	if t.cut {
		for len(b) > 0 && !utf8.RuneStart(b[0]) {
			b = b[1:]
		}
	}
	s := strings.ToValidUTF8(strings.TrimSpace(string(b)), "\uFFFD")
	if t.cut && s != "" {
		s = "…" + s
	}
	return s
}
