package runtime

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/agent/state"
)

// ProcessOptions configure the process runtime.
type ProcessOptions struct {
	// StateDir is the agent's state directory (artifacts/, images/,
	// workloads/ and volumes/ live under it).
	StateDir string
	// NoSync skips fsyncs (simulations only).
	NoSync bool
	// ShimPath and ShimArgs run the supervisor: ShimPath ShimArgs... --dir D.
	// Default: os.Executable() with ["shim"]. Tests point them at the test
	// binary.
	ShimPath string
	ShimArgs []string
	// ShimEnv is added to the supervisor's (otherwise minimal) environment.
	ShimEnv []string
	// HTTPClient downloads artifacts (default: a client with a 30 minute
	// overall timeout).
	HTTPClient *http.Client
	Logger     *slog.Logger
	Now        func() time.Time
	// PollInterval is how often Launch and Stop look for the supervisor's
	// records (default 20ms).
	PollInterval time.Duration
	// KillWait bounds the wait for an exit after SIGKILL (default 30s).
	KillWait time.Duration
	// StartWait bounds the wait for the supervisor to report the workload
	// started (default 60s).
	StartWait time.Duration
}

// Process is the real runtime: processes supervised by shims.
type Process struct {
	dir        string
	durable    bool
	shimPath   string
	shimArgs   []string
	shimEnv    []string
	httpClient *http.Client
	log        *slog.Logger
	now        func() time.Time
	poll       time.Duration
	killWait   time.Duration
	startWait  time.Duration

	mu     sync.Mutex             // guards the following
	exited map[string]Observation // final observations: exit.json never changes
}

var _ Runtime = (*Process)(nil)

// NewProcess returns the process runtime over opts.StateDir.
func NewProcess(opts ProcessOptions) (*Process, error) {
	if opts.StateDir == "" {
		return nil, errors.New("runtime: StateDir is required")
	}
	p := &Process{
		dir:        opts.StateDir,
		durable:    !opts.NoSync,
		shimPath:   opts.ShimPath,
		shimArgs:   opts.ShimArgs,
		shimEnv:    opts.ShimEnv,
		httpClient: opts.HTTPClient,
		log:        opts.Logger,
		now:        opts.Now,
		poll:       opts.PollInterval,
		killWait:   opts.KillWait,
		startWait:  opts.StartWait,
		exited:     map[string]Observation{},
	}
	if p.shimPath == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("runtime: locate own binary for the supervisor: %w", err)
		}
		p.shimPath = exe
		if p.shimArgs == nil {
			p.shimArgs = []string{"shim"}
		}
	}
	if p.httpClient == nil {
		p.httpClient = &http.Client{Timeout: 30 * time.Minute}
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.now == nil {
		p.now = time.Now
	}
	if p.poll <= 0 {
		p.poll = 20 * time.Millisecond
	}
	if p.killWait <= 0 {
		p.killWait = 30 * time.Second
	}
	if p.startWait <= 0 {
		p.startWait = 60 * time.Second
	}
	if err := state.MkdirPrivate(filepath.Join(p.dir, "workloads")); err != nil {
		return nil, err
	}
	return p, nil
}

// Supports declares what this runtime can honestly run.
func (p *Process) Supports() []string { return []string{"process"} }

func (p *Process) attemptDir(run, attempt string) string {
	return filepath.Join(p.dir, "workloads", run, "attempts", attempt)
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// lockHeld reports whether a supervisor (or the agent about to spawn one)
// holds the attempt's supervise.lock: the one reliable sign of a live
// supervisor that survives the agent's restarts and pid reuse.
func lockHeld(dir string) bool {
	f, err := os.OpenFile(filepath.Join(dir, fileLock), os.O_RDWR, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return errors.Is(err, unix.EWOULDBLOCK)
	}
	_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false
}

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Launch records the attempt, then starts its supervisor, then waits until the
// supervisor reports the workload started (or could not start). The record is
// written before the spawn so that a restarted agent can tell "never spawned"
// (record without shim.json and no lock: safe to start now) from "spawned"
// (never start again).
func (p *Process) Launch(ctx context.Context, l api.LaunchWorkload) error {
	if err := CheckID("run_id", l.RunID); err != nil {
		return err
	}
	if err := CheckID("attempt_id", l.AttemptID); err != nil {
		return err
	}
	dir := p.attemptDir(l.RunID, l.AttemptID)
	if exists(filepath.Join(dir, fileRecord)) {
		var ex exitRecord
		if state.ReadJSON(filepath.Join(dir, fileExit), &ex) == nil && ex.StartError != "" {
			return errors.New(ex.StartError)
		}
		if exists(filepath.Join(dir, fileShim)) || exists(filepath.Join(dir, fileExit)) || lockHeld(dir) {
			return ErrWorkloadExists
		}
		// Recorded but the supervisor never ran: the previous agent stopped
		// between the two steps. Starting it now is its first start.
		p.log.Info("resuming interrupted launch", "run_id", l.RunID, "attempt_id", l.AttemptID)
		return p.spawn(ctx, dir)
	}
	if l.Command == "" {
		return errors.New("launch_workload: command is required")
	}
	runDir := filepath.Join(p.dir, "workloads", l.RunID)
	workDir := filepath.Join(runDir, "work")
	rec := workloadRecord{
		RunID: l.RunID, AttemptID: l.AttemptID, Image: l.Image,
		Args: append([]string{}, l.Args...), WorkDir: workDir, CreatedAt: p.now().UTC(),
	}
	if l.Image != "" {
		d, err := p.imageDir(l.Image)
		if err != nil {
			return err
		}
		rec.ImageDir = d
	}
	pathEnv := defaultPath
	if rec.ImageDir != "" {
		pathEnv = filepath.Join(rec.ImageDir, "bin") + ":" + pathEnv
	}
	env := map[string]string{
		"PATH":                pathEnv,
		"HOME":                workDir,
		"NODEWARD_RUN_ID":     l.RunID,
		"NODEWARD_ATTEMPT_ID": l.AttemptID,
		"NODEWARD_WORK_DIR":   workDir,
	}
	if rec.ImageDir != "" {
		env["NODEWARD_IMAGE_DIR"] = rec.ImageDir
	}
	for _, v := range l.CacheVolumes {
		if err := CheckID("cache volume", v); err != nil {
			return err
		}
		vd := filepath.Join(p.dir, "volumes", v)
		if err := state.MkdirPrivate(vd); err != nil {
			return err
		}
		env["NODEWARD_CACHE_"+envName(v)] = vd
	}
	for k, v := range l.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.Contains(v, "\x00") {
			return fmt.Errorf("launch_workload: invalid environment variable %q", k)
		}
		env[k] = v
	}
	path, err := resolveCommand(l.Command, rec.ImageDir, workDir, env["PATH"])
	if err != nil {
		return err
	}
	rec.Path = path
	for k, v := range env {
		rec.Env = append(rec.Env, k+"="+v)
	}
	slices.Sort(rec.Env)
	for _, d := range []string{runDir, workDir, filepath.Dir(dir), dir} {
		if err := state.MkdirPrivate(d); err != nil {
			return err
		}
	}
	if err := state.WriteJSONAtomic(filepath.Join(dir, fileRecord), rec, p.durable); err != nil {
		return err
	}
	return p.spawn(ctx, dir)
}

// envName turns a cache volume name into an environment variable suffix.
func envName(v string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		}
		return '_'
	}, v)
}

// resolveCommand finds the executable before anything is recorded, so a
// launch naming a missing program is refused without leaving an attempt.
// A relative path with a slash is relative to the image (or the work dir); a
// bare name is looked up in the workload's PATH, not the agent's.
func resolveCommand(cmd, imageDir, workDir, pathEnv string) (string, error) {
	check := func(p string) error {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if fi.IsDir() || fi.Mode()&0o111 == 0 {
			return fmt.Errorf("%s is not an executable file", p)
		}
		return nil
	}
	if strings.Contains(cmd, "/") {
		p := cmd
		if !filepath.IsAbs(p) {
			base := workDir
			if imageDir != "" {
				base = imageDir
			}
			p = filepath.Join(base, p)
		}
		if err := check(p); err != nil {
			return "", fmt.Errorf("command %q: %w", cmd, err)
		}
		return p, nil
	}
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" {
			continue
		}
		p := filepath.Join(d, cmd)
		if check(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("command %q not found in the workload PATH %s", cmd, pathEnv)
}

// spawn starts the supervisor holding the attempt's lock and waits for it to
// report the workload started.
func (p *Process) spawn(ctx context.Context, dir string) error {
	lf, err := os.OpenFile(filepath.Join(dir, fileLock), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer lf.Close()
	// Observe may probe the lock for an instant; anything longer is a live
	// supervisor, which must not get a twin.
	deadline := time.Now().Add(2 * time.Second)
	for {
		err := unix.Flock(int(lf.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			return ErrWorkloadExists
		}
		if err := sleepCtx(ctx, p.poll); err != nil {
			return err
		}
	}
	shimLog, err := openLog(filepath.Join(dir, fileShimLg))
	if err != nil {
		return err
	}
	defer shimLog.Close()
	args := append(slices.Clone(p.shimArgs), "--dir", dir)
	if !p.durable {
		args = append(args, "--no-sync")
	}
	cmd := exec.Command(p.shimPath, args...)
	// A minimal environment: the agent's own (which may carry the bootstrap)
	// is none of the supervisor's business.
	cmd.Env = append([]string{"PATH=" + defaultPath}, p.shimEnv...)
	cmd.ExtraFiles = []*os.File{lf}
	cmd.Stdout, cmd.Stderr = shimLog, shimLog
	// A session of its own: a terminal's ^C or the agent's process group
	// being signalled does not reach the supervisor.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start supervisor: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		// Reap it while we live; after a restart init (or a subreaper) does.
		_ = cmd.Wait()
		close(exited)
	}()
	lf.Close()

	deadline = time.Now().Add(p.startWait)
	t := time.NewTicker(p.poll)
	defer t.Stop()
	for {
		var ex exitRecord
		if state.ReadJSON(filepath.Join(dir, fileExit), &ex) == nil {
			if ex.StartError != "" {
				return errors.New(ex.StartError)
			}
			return nil // started and already ended
		}
		if exists(filepath.Join(dir, fileStatus)) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-exited:
			if exists(filepath.Join(dir, fileStatus)) || exists(filepath.Join(dir, fileExit)) {
				continue
			}
			return fmt.Errorf("supervisor exited before starting the workload (see %s)", filepath.Join(dir, fileShimLg))
		case <-t.C:
			if time.Now().After(deadline) {
				// The supervisor is alive but slow; the attempt is recorded
				// and supervised, so the launch has happened. Its states
				// arrive as events.
				p.log.Warn("supervisor slow to report the workload started", "dir", dir)
				return nil
			}
		}
	}
}

// stopRecord is written to the attempt directory before a stop's SIGTERM.
// A stop resumed after the agent restarted (its journal says "started"),
// or a second stop of the same attempt, finds it and does not signal TERM
// again: many programs read a second SIGTERM as "abort now" and skip the
// clean shutdown the first one began. It keeps the first stop's deadline
// for SIGKILL, or the later stop's when that comes sooner.
type stopRecord struct {
	TermSentAt time.Time `json:"term_sent_at"`
	KillAt     time.Time `json:"kill_at"`
}

// Stop sends SIGTERM to the attempt's process group, SIGKILL after the grace,
// and returns once the exit is recorded. SIGTERM is sent at most once per
// attempt (stopRecord).
func (p *Process) Stop(ctx context.Context, s api.StopWorkload) error {
	if err := CheckID("run_id", s.RunID); err != nil {
		return err
	}
	if err := CheckID("attempt_id", s.AttemptID); err != nil {
		return err
	}
	dir := p.attemptDir(s.RunID, s.AttemptID)
	if !exists(filepath.Join(dir, fileRecord)) {
		return ErrUnknownWorkload
	}
	grace := max(time.Duration(s.GraceSeconds)*time.Second, 0)
	var st statusRecord
	for {
		if exists(filepath.Join(dir, fileExit)) {
			return nil
		}
		if state.ReadJSON(filepath.Join(dir, fileStatus), &st) == nil {
			break
		}
		if !lockHeld(dir) {
			// Never started and nobody is starting it: make sure nobody
			// will (a resumed launch sees the exit and refuses).
			return state.WriteJSONAtomic(filepath.Join(dir, fileExit), exitRecord{StartError: "stopped before it started", ExitedAt: p.now().UTC()}, p.durable)
		}
		if err := sleepCtx(ctx, p.poll); err != nil {
			return err
		}
	}
	now := p.now()
	killAt := now.Add(grace)
	// A supervisor that keeps the deadline itself is signalled instead of
	// the workload (ShimMain): the stop then holds if this agent dies.
	var shim shimRecord
	viaShim := state.ReadJSON(filepath.Join(dir, fileShim), &shim) == nil && shim.EnforcesStop && shim.PID > 0 && lockHeld(dir)
	var prior stopRecord
	if state.ReadJSON(filepath.Join(dir, fileStop), &prior) == nil {
		switch {
		case prior.KillAt.Before(killAt):
			killAt = prior.KillAt
		case viaShim:
			// A shorter grace brings SIGKILL forward, for the supervisor
			// too.
			if err := state.WriteJSONAtomic(filepath.Join(dir, fileStop), stopRecord{TermSentAt: prior.TermSentAt, KillAt: killAt.UTC()}, p.durable); err != nil {
				return err
			}
		}
		if viaShim {
			// Told again: it re-reads the record and forwards the stop's
			// SIGTERM only if it never did (this agent may have died
			// between recording the stop and signalling it).
			_ = syscall.Kill(shim.PID, syscall.SIGTERM)
		}
		p.log.Info("resuming the stop of a workload already sent SIGTERM", "run_id", s.RunID, "attempt_id", s.AttemptID,
			"pgid", st.PGID, "term_sent_at", prior.TermSentAt, "kill_at", killAt)
	} else {
		// Recorded first: a crash right after it costs this attempt its
		// SIGTERM (SIGKILL still comes at the deadline), never a second one.
		if err := state.WriteJSONAtomic(filepath.Join(dir, fileStop), stopRecord{TermSentAt: now.UTC(), KillAt: killAt.UTC()}, p.durable); err != nil {
			return err
		}
		p.log.Info("stopping workload", "run_id", s.RunID, "attempt_id", s.AttemptID, "pgid", st.PGID, "grace", grace)
		if viaShim {
			_ = syscall.Kill(shim.PID, syscall.SIGTERM)
		} else {
			_ = syscall.Kill(-st.PGID, syscall.SIGTERM)
		}
	}
	// Wall-clock time across an agent restart: a clock stepped back
	// cannot stretch the wait past this stop's own grace.
	wait := min(max(killAt.Sub(p.now()), 0), grace)
	if done, err := p.waitExit(ctx, dir, st.PGID, wait); done || err != nil {
		return err
	}
	p.log.Info("grace over, killing workload", "run_id", s.RunID, "attempt_id", s.AttemptID, "pgid", st.PGID)
	_ = syscall.Kill(-st.PGID, syscall.SIGKILL)
	if done, err := p.waitExit(ctx, dir, st.PGID, p.killWait); done || err != nil {
		return err
	}
	return fmt.Errorf("workload %s/%s still running %s after SIGKILL", s.RunID, s.AttemptID, p.killWait)
}

// waitExit waits up to d for the attempt's exit record. When the supervisor
// is gone (lost with the machine's previous life) nobody will write one: the
// group's disappearance is the exit, recorded as lost.
func (p *Process) waitExit(ctx context.Context, dir string, pgid int, d time.Duration) (bool, error) {
	deadline := time.Now().Add(d)
	for {
		if exists(filepath.Join(dir, fileExit)) {
			return true, nil
		}
		if !lockHeld(dir) && !groupAlive(pgid) {
			if exists(filepath.Join(dir, fileExit)) {
				return true, nil
			}
			err := state.WriteJSONAtomic(filepath.Join(dir, fileExit), exitRecord{Lost: true, ExitedAt: p.now().UTC()}, p.durable)
			return true, err
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		if err := sleepCtx(ctx, p.poll); err != nil {
			return false, err
		}
	}
}

func groupAlive(pgid int) bool {
	if pgid <= 0 {
		return false
	}
	err := syscall.Kill(-pgid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Observe reads every attempt directory. It is how a restarted agent re-adopts
// workloads: the records, not the agent's memory, are the truth.
func (p *Process) Observe(ctx context.Context) ([]Observation, error) {
	runs, err := os.ReadDir(filepath.Join(p.dir, "workloads"))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var out []Observation
	for _, r := range runs {
		if !r.IsDir() {
			continue
		}
		atts, err := os.ReadDir(filepath.Join(p.dir, "workloads", r.Name(), "attempts"))
		if err != nil {
			continue
		}
		for _, a := range atts {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			if !a.IsDir() {
				continue
			}
			key := r.Name() + "/" + a.Name()
			p.mu.Lock()
			o, done := p.exited[key]
			p.mu.Unlock()
			if !done {
				var err error
				if o, err = p.observe(filepath.Join(p.dir, "workloads", r.Name(), "attempts", a.Name())); err != nil {
					continue
				}
				// Only a recorded exit is final; a "lost" verdict is
				// re-derived each time in case the record turns up.
				if o.State == api.WorkloadExited && exists(filepath.Join(p.dir, "workloads", r.Name(), "attempts", a.Name(), fileExit)) {
					p.mu.Lock()
					p.exited[key] = o
					p.mu.Unlock()
				}
			}
			out = append(out, o)
		}
	}
	return out, nil
}

func (p *Process) observe(dir string) (Observation, error) {
	var rec workloadRecord
	if err := state.ReadJSON(filepath.Join(dir, fileRecord), &rec); err != nil {
		return Observation{}, err
	}
	o := Observation{RunID: rec.RunID, AttemptID: rec.AttemptID, State: api.WorkloadCreated, CreatedAt: rec.CreatedAt}
	// The lock is probed before the records are read: a supervisor writes
	// exit.json before it lets go of the lock, so "not held" followed by "no
	// exit.json" really means no supervisor will write one.
	held := lockHeld(dir)
	var st statusRecord
	hasStatus := state.ReadJSON(filepath.Join(dir, fileStatus), &st) == nil
	if hasStatus {
		o.StartedAt = st.StartedAt
	}
	var ex exitRecord
	if state.ReadJSON(filepath.Join(dir, fileExit), &ex) == nil {
		o.State = api.WorkloadExited
		o.ExitCode, o.Signal, o.Failure, o.Lost, o.ExitedAt = ex.ExitCode, ex.Signal, ex.StartError, ex.Lost, ex.ExitedAt
		return o, nil
	}
	switch {
	case hasStatus && held:
		o.State = api.WorkloadRunning
	case hasStatus && groupAlive(st.PGID):
		// The supervisor is gone but the workload is not: it runs,
		// unsupervised; its exit will be seen as the group's end.
		o.State = api.WorkloadRunning
	case hasStatus, exists(filepath.Join(dir, fileShim)) && !held:
		o.State, o.Lost, o.ExitedAt = api.WorkloadExited, true, p.now().UTC()
	}
	return o, nil
}

// Output reads the tails of the attempt's stdout.log and stderr.log, which
// its supervisor writes (and keeps after the attempt exits).
func (p *Process) Output(_ context.Context, runID, attemptID string) (Output, error) {
	if CheckID("run_id", runID) != nil || CheckID("attempt_id", attemptID) != nil {
		return Output{}, ErrUnknownWorkload
	}
	dir := p.attemptDir(runID, attemptID)
	if !exists(filepath.Join(dir, fileRecord)) {
		return Output{}, ErrUnknownWorkload
	}
	var out Output
	var cutOut, cutErr bool
	var err error
	if out.Stdout, cutOut, err = readTail(filepath.Join(dir, fileStdout)); err != nil {
		return Output{}, err
	}
	if out.Stderr, cutErr, err = readTail(filepath.Join(dir, fileStderr)); err != nil {
		return Output{}, err
	}
	out.Truncated = cutOut || cutErr
	return out, nil
}
