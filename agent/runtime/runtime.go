// Package runtime carries out the four node commands — prepare_artifact,
// prepare_image, launch_workload, stop_workload — and observes the workloads
// it launched. Two implementations share the Runtime interface:
//
//   - Process runs real processes: content-addressed artifact cache, images as
//     unpacked tar.gz artifacts, and each workload under a supervisor (the
//     agent binary re-executed in shim mode, see ShimMain) that waits on it and
//     writes its exit status into the state directory, so an agent restart
//     never loses an exit (DECISIONS §25).
//   - Simulated runs nothing: deterministic in-memory workloads for tests and
//     the load tool.
//
// A runtime applies effects; it does not decide whether an operation was
// already applied — that is the journal's job (package core). It does make
// each effect idempotent on its own identity (an artifact digest, an image
// name, a run/attempt pair) so that the journal's recovery can ask it again.
package runtime

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/nodeward/nodeward/agent/api"
)

// Errors a Runtime returns. Any other error from a command method is a
// refusal whose text is reported as the result's failure.
var (
	// ErrUnknownWorkload: no workload with that run and attempt id.
	ErrUnknownWorkload = errors.New("unknown workload")
	// ErrWorkloadExists: Launch found the attempt already started; the launch
	// it asked for has happened before (and will not happen again).
	ErrWorkloadExists = errors.New("workload attempt already launched")
)

// Runtime applies node commands and observes workloads. Implementations are
// safe for concurrent use; the caller serializes commands that touch the same
// artifact, image or workload.
type Runtime interface {
	// Supports lists the runtime names declared in the node's facts.
	Supports() []string
	// PrepareArtifact makes the artifact available in the local cache,
	// verified against its sha256. Idempotent. Returns a one-line account of
	// what it did (for the log), naming the digest the bytes hashed to.
	PrepareArtifact(ctx context.Context, p api.PrepareArtifact) (string, error)
	// PrepareImage makes an image ready to launch from. Idempotent. Returns a
	// one-line account of what was unpacked.
	PrepareImage(ctx context.Context, p api.PrepareImage) (string, error)
	// Launch starts one attempt. It returns once the workload was started (or
	// failed to start, as an error). ErrWorkloadExists when the attempt had
	// already been started: Launch never starts an attempt twice.
	Launch(ctx context.Context, p api.LaunchWorkload) error
	// Stop ends an attempt: SIGTERM (or the runtime's equivalent), SIGKILL
	// after the grace, and returns once it has exited. Stopping an exited
	// attempt does nothing and succeeds. ErrUnknownWorkload for an attempt
	// never launched.
	Stop(ctx context.Context, p api.StopWorkload) error
	// Observe reports the current state of every workload attempt the runtime
	// knows, including those started before an agent restart.
	Observe(ctx context.Context) ([]Observation, error)
	// Output answers the tail of what an attempt wrote to stdout and
	// stderr so far (complete once it exited). ErrUnknownWorkload for an
	// attempt never launched.
	Output(ctx context.Context, runID, attemptID string) (Output, error)
}

// Observation is what a runtime knows about one attempt.
type Observation struct {
	RunID     string
	AttemptID string
	// State is api.WorkloadCreated, api.WorkloadRunning or api.WorkloadExited.
	State string
	// ExitCode is set for an exit whose status is known: the process's exit
	// code, or 128+signal when it was killed by a signal.
	ExitCode *int
	// Signal names the signal that ended it, if any.
	Signal string
	// Lost is true when the supervisor vanished without recording an exit
	// (killed with the machine, for example): exited, code unknown.
	Lost      bool
	Failure   string // why the workload could not start, if it could not
	CreatedAt time.Time
	StartedAt time.Time
	ExitedAt  time.Time
}

// Key identifies the attempt in maps and in the agent's reported-state record.
func (o Observation) Key() string { return o.RunID + "/" + o.AttemptID }

var safeID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)

// CheckID refuses identifiers that cannot be used safely as one path element
// (run ids, attempt ids, artifact ids, cache volume names).
func CheckID(what, id string) error {
	if !safeID.MatchString(id) {
		return fmt.Errorf("%s %q is not 1-128 characters of [A-Za-z0-9._:-] starting with a letter or digit", what, id)
	}
	return nil
}

func intPtr(v int) *int { return &v }
