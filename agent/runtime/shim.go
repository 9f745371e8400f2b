package runtime

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodeward/nodeward/agent/state"
)

// Files in an attempt directory (workloads/<run>/attempts/<attempt>/). The
// agent writes record.json before it spawns the supervisor; the supervisor
// writes the rest, each atomically, in this order, so that every prefix of
// the sequence tells a restarted agent exactly how far a launch got:
//
//	record.json     what to run (agent, before spawning)
//	supervise.lock  flock held for the supervisor's whole life
//	shim.json       the supervisor started (before it starts the workload)
//	status.json     the workload started: its pid and process group
//	exit.json       the workload ended: exit code or signal, or why it never started
const (
	fileRecord = "record.json"
	fileLock   = "supervise.lock"
	fileShim   = "shim.json"
	fileStatus = "status.json"
	fileExit   = "exit.json"
	fileStop   = "stop.json"
	fileStdout = "stdout.log"
	fileStderr = "stderr.log"
	fileShimLg = "shim.log"
)

type workloadRecord struct {
	RunID     string    `json:"run_id"`
	AttemptID string    `json:"attempt_id"`
	Image     string    `json:"image,omitempty"`
	ImageDir  string    `json:"image_dir,omitempty"`
	Path      string    `json:"path"`
	Args      []string  `json:"args"`
	Env       []string  `json:"env"`
	WorkDir   string    `json:"work_dir"`
	CreatedAt time.Time `json:"created_at"`
}

type shimRecord struct {
	PID       int       `json:"pid"`
	StartedAt time.Time `json:"started_at"`
	// EnforcesStop: this supervisor keeps a stop's deadline itself (see
	// ShimMain), so the agent signals it rather than the workload. A
	// supervisor started by an older agent binary lacks it.
	EnforcesStop bool `json:"enforces_stop"`
}

type statusRecord struct {
	PID       int       `json:"pid"`
	PGID      int       `json:"pgid"`
	StartedAt time.Time `json:"started_at"`
}

type exitRecord struct {
	ExitCode   *int      `json:"exit_code,omitempty"`
	Signal     string    `json:"signal,omitempty"`
	StartError string    `json:"start_error,omitempty"`
	Lost       bool      `json:"lost,omitempty"`
	ExitedAt   time.Time `json:"exited_at"`
}

// shimLockFD is where the agent passes the supervise.lock descriptor
// (ExtraFiles[0]). The agent took the flock before spawning us; the lock
// belongs to the open file description we share, so it stays held after the
// agent closes its copy or dies, and is released only when we exit.
const shimLockFD = 3

// ShimMain is the supervisor: `nodeward-agent shim --dir ATTEMPT_DIR`. It
// starts the workload described by record.json in its own process group, waits
// for it, writes its exit status durably, and exits. It ignores the signals a
// terminal or a service manager would send the agent, so stopping or
// restarting the agent leaves workloads running (with KillMode=process);
// SIGTERM sent to the supervisor itself is forwarded to the workload's group.
//
// A stop reaches the workload through the supervisor: the agent records
// the stop (stop.json: SIGTERM sent, SIGKILL due) and signals SIGTERM
// here. The supervisor forwards that stop's SIGTERM once and kills the
// group itself when SIGKILL is due, so a stop's deadline holds even when
// the agent dies or stays down inside the grace. A later SIGTERM re-reads
// the record (a later stop may bring SIGKILL forward) without forwarding
// the stop's SIGTERM again. The return value is the supervisor's own exit
// code.
func ShimMain(args []string) int {
	fs := flag.NewFlagSet("shim", flag.ContinueOnError)
	dir := fs.String("dir", "", "attempt directory")
	noSync := fs.Bool("no-sync", false, "skip fsyncs (simulations only)")
	if err := fs.Parse(args); err != nil || *dir == "" {
		fmt.Fprintln(os.Stderr, "nodeward-agent shim: --dir is required")
		return 2
	}
	durable := !*noSync
	logf := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "%s shim[%d]: %s\n", time.Now().UTC().Format(time.RFC3339Nano), os.Getpid(), fmt.Sprintf(format, a...))
	}
	// The workload must not inherit the lock: if it did, an orphaned workload
	// would look like a live supervisor.
	syscall.CloseOnExec(shimLockFD)
	if err := unix.Flock(shimLockFD, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		// Re-locking our own description succeeds; failing means the agent
		// did not hand us the lock, and a second supervisor must not run.
		logf("supervise lock not inherited: %v", err)
		return 2
	}
	signal.Ignore(syscall.SIGHUP, syscall.SIGINT, syscall.SIGPIPE)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)

	writeExit := func(e exitRecord) int {
		e.ExitedAt = time.Now().UTC()
		if err := state.WriteJSONAtomic(filepath.Join(*dir, fileExit), e, durable); err != nil {
			logf("write exit status: %v", err)
			return 1
		}
		return 0
	}
	if err := state.WriteJSONAtomic(filepath.Join(*dir, fileShim), shimRecord{PID: os.Getpid(), StartedAt: time.Now().UTC(), EnforcesStop: true}, durable); err != nil {
		logf("write shim record: %v", err)
		return 1
	}
	var rec workloadRecord
	if err := state.ReadJSON(filepath.Join(*dir, fileRecord), &rec); err != nil {
		return writeExit(exitRecord{StartError: fmt.Sprintf("read workload record: %v", err)})
	}
	stdout, err := openLog(filepath.Join(*dir, fileStdout))
	if err != nil {
		return writeExit(exitRecord{StartError: err.Error()})
	}
	defer stdout.Close()
	stderr, err := openLog(filepath.Join(*dir, fileStderr))
	if err != nil {
		return writeExit(exitRecord{StartError: err.Error()})
	}
	defer stderr.Close()

	cmd := exec.Command(rec.Path, rec.Args...)
	cmd.Args[0] = rec.Path
	cmd.Dir = rec.WorkDir
	cmd.Env = rec.Env
	cmd.Stdout, cmd.Stderr = stdout, stderr
	// Its own process group, so a stop reaches everything it spawned, and
	// the group does not outlive the main process (see below).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf("start %s: %v", rec.Path, err)
		return writeExit(exitRecord{StartError: fmt.Sprintf("start %s: %v", rec.Path, err)})
	}
	pid := cmd.Process.Pid
	if err := state.WriteJSONAtomic(filepath.Join(*dir, fileStatus), statusRecord{PID: pid, PGID: pid, StartedAt: time.Now().UTC()}, durable); err != nil {
		// Without a status record nobody could stop it: do not let it run
		// unsupervised.
		logf("write status: %v; killing workload", err)
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var werr error
	var killAt time.Time // the recorded stop's SIGKILL deadline; zero: none
	stopTermSent := false
	kill := time.NewTimer(time.Hour)
	kill.Stop()
wait:
	for {
		select {
		case <-sigs:
			var stop stopRecord
			if state.ReadJSON(filepath.Join(*dir, fileStop), &stop) != nil || stop.KillAt.IsZero() {
				// Not a recorded stop (someone signalled us by hand):
				// forwarded, as it always was.
				_ = syscall.Kill(-pid, syscall.SIGTERM)
				continue
			}
			if !stopTermSent {
				stopTermSent = true
				_ = syscall.Kill(-pid, syscall.SIGTERM)
			}
			if killAt.IsZero() || stop.KillAt.Before(killAt) {
				killAt = stop.KillAt
				kill.Reset(max(time.Until(killAt), 0))
				logf("stop recorded: SIGKILL due at %s", killAt.UTC().Format(time.RFC3339Nano))
			}
		case <-kill.C:
			logf("stop's grace over: killing the workload's group")
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		case werr = <-done:
			break wait
		}
	}
	kill.Stop()
	// Like a container whose init exits: whatever the workload left behind in
	// its group goes with it, so a finished attempt holds no processes.
	_ = syscall.Kill(-pid, syscall.SIGKILL)

	var e exitRecord
	var ee *exec.ExitError
	switch {
	case werr == nil:
		e.ExitCode = intPtr(0)
	case errors.As(werr, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			e.ExitCode = intPtr(128 + int(ws.Signal()))
			e.Signal = unix.SignalName(ws.Signal())
		} else {
			e.ExitCode = intPtr(ee.ExitCode())
		}
	default:
		e.Lost = true
		logf("wait: %v", werr)
	}
	return writeExit(e)
}

func openLog(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	return f, nil
}
