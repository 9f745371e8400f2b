package fleet

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/secrets"
)

// WorkloadOutput is what one exited workload attempt wrote last: the tail of
// each stream as its node reported it (DECISIONS §43), after scrubbing.
type WorkloadOutput struct {
	NodeID     string
	RunID      string
	AttemptID  string
	StdoutTail string
	StderrTail string
	// Truncated is true when either stream was longer than its tail.
	Truncated  bool
	ReceivedAt time.Time
}

// OutputScrubber removes secret values from an attempt's output before it is
// stored. It sees the node, run and attempt so it can find what the launch
// was given.
type OutputScrubber func(ctx context.Context, o WorkloadOutput) (WorkloadOutput, error)

// scrubLaunchOutput is the default scrubber: it removes the secret values
// the attempt's launch was given (DECISIONS.md §43). secrets keeps a
// succeeded launch's values until its attempt's output is recorded, at
// most secrets.LaunchValuesKept; output arriving later is stored as is.
func (s *Service) scrubLaunchOutput(ctx context.Context, o WorkloadOutput) (WorkloadOutput, error) {
	if s.secretValues == nil {
		return o, nil
	}
	ids, err := s.store.LaunchCommands(ctx, o.NodeID, o.RunID, o.AttemptID)
	if err != nil || len(ids) == 0 {
		return o, err
	}
	values, err := s.secretValues(ctx, ids...)
	if err != nil {
		return o, err
	}
	o.StdoutTail = secrets.Scrub(o.StdoutTail, values)
	o.StderrTail = secrets.Scrub(o.StderrTail, values)
	return o, nil
}

// ErrOutputNotFound answers a read of output no node reported.
var ErrOutputNotFound = errcode.New(errcode.NotFound, "no output was reported for that workload attempt")

func validateOutput(o api.OutputRequest) error {
	var v errcode.Validation
	v.Check(idPattern.MatchString(o.RunID), "run_id", "required: 1-128 characters of letters, digits, '.', '_', ':' or '-'")
	v.Check(idPattern.MatchString(o.AttemptID), "attempt_id", "required: 1-128 characters of letters, digits, '.', '_', ':' or '-'")
	for _, t := range []struct{ field, tail string }{{"stdout_tail", o.StdoutTail}, {"stderr_tail", o.StderrTail}} {
		field, tail := t.field, t.tail
		v.Check(len(tail) <= api.MaxOutputTail, field, "at most %d bytes of UTF-8", api.MaxOutputTail)
		// Postgres text cannot hold NUL; refusing it on every dialect
		// keeps what one store accepts the same as the other. The agent
		// never sends it (it replaces NUL with U+FFFD).
		v.Check(!strings.ContainsRune(tail, 0), field, "must not contain NUL (U+0000)")
	}
	return v.Err()
}

// RecordOutput stores an exited attempt's output for the session's node.
// It is idempotent per attempt: the first report is kept and a later one
// for the same attempt changes nothing (recorded false), so an agent that
// retries after a lost answer cannot overwrite what was read. Output may
// arrive before the attempt's exit event. A retired node may still report,
// like its exits. Errors: validation_failed.
func (s *Service) RecordOutput(ctx context.Context, sess Session, o api.OutputRequest) (recorded bool, err error) {
	if err := validateOutput(o); err != nil {
		return false, err
	}
	out, err := s.scrub(ctx, WorkloadOutput{NodeID: sess.NodeID, RunID: o.RunID, AttemptID: o.AttemptID,
		StdoutTail: o.StdoutTail, StderrTail: o.StderrTail, Truncated: o.Truncated, ReceivedAt: s.clock()})
	if err != nil {
		return false, err
	}
	err = s.store.Tx(OnNode(ctx, sess.NodeID), func(tx Tx) error {
		recorded, err = tx.InsertWorkloadOutput(ctx, out)
		return err
	})
	return recorded, err
}

// WorkloadOutput answers the output an attempt's node reported.
// Errors: ErrNotFound (node), ErrOutputNotFound (none reported).
func (s *Service) WorkloadOutput(ctx context.Context, nodeID, runID, attemptID string) (WorkloadOutput, error) {
	if _, err := s.Node(ctx, nodeID); err != nil {
		return WorkloadOutput{}, err
	}
	o, err := s.store.WorkloadOutput(ctx, nodeID, runID, attemptID)
	if errors.Is(err, ErrNoRows) {
		return WorkloadOutput{}, ErrOutputNotFound
	}
	return o, err
}
