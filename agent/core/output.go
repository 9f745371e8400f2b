package core

import (
	"context"
	"errors"
	"net/http"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/agent/client"
	"github.com/nodeward/nodeward/agent/runtime"
)

// flushOutputs uploads the output of every exited attempt not yet delivered
// (DECISIONS §43), read back from the runtime, which keeps each attempt's
// logs. The owed record is dropped only once the server answered: a lost
// answer means the same attempt is sent again, which the server keeps as
// first reported. An output the server refuses for good (malformed, or a
// control plane too old to serve the door), or one the runtime no longer
// has, is dropped with an error in the log, never silently, so one bad
// attempt cannot hold up the others, or a retirement, forever.
func (a *Agent) flushOutputs(ctx context.Context) error {
	for _, owed := range a.store.OwedOutputs() {
		log := a.log.With("run_id", owed.RunID, "attempt_id", owed.AttemptID)
		out, err := a.rt.Output(ctx, owed.RunID, owed.AttemptID)
		if errors.Is(err, runtime.ErrUnknownWorkload) {
			log.Error("workload output is gone from the runtime; it cannot be uploaded")
			if err := a.store.OutputDelivered(owed); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		_, err = a.client().Output(ctx, api.OutputRequest{RunID: owed.RunID, AttemptID: owed.AttemptID,
			StdoutTail: out.Stdout, StderrTail: out.Stderr, Truncated: out.Truncated})
		if refusedForGood(err) {
			log.Error("control plane refused the workload output; dropping it", "err", err)
			if err := a.store.OutputDelivered(owed); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		if err := a.store.OutputDelivered(owed); err != nil {
			return err
		}
		a.mu.Lock()
		a.stats.OutputsDelivered++
		a.mu.Unlock()
		log.Info("workload output uploaded", "truncated", out.Truncated)
	}
	return nil
}

// refusedForGood: the server will refuse this request whenever it is sent
// (404 and 405 mean a control plane without the door), so retrying it would
// only jam what follows.
func refusedForGood(err error) bool {
	var ce *client.Error
	if err == nil || !errors.As(err, &ce) || terminal(err) != nil {
		return false
	}
	switch ce.Status {
	case http.StatusBadRequest, http.StatusNotFound, http.StatusMethodNotAllowed,
		http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
		return true
	}
	return false
}
