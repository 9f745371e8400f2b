package handlers

import (
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/fleet"
)

// Workload output (DECISIONS §43): the agent reports what an exited attempt
// wrote last; administrators read it.

// postOutput takes an exited attempt's output tails. A retired node may
// still report them, like its exits (DoorReport).
func (h *handler) postOutput(w http.ResponseWriter, r *http.Request) {
	sess, ok := h.agentSession(w, r, fleet.DoorReport)
	if !ok {
		return
	}
	var req api.OutputRequest
	if err := decodeJSON(r, &req, false); err != nil {
		writeError(w, r, err)
		return
	}
	recorded, err := h.Fleet.RecordOutput(r.Context(), sess, req)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.OutputResponse{Recorded: recorded})
}

// outputView is the administrator's view of an attempt's output.
type outputView struct {
	StdoutTail string `json:"stdout_tail"`
	StderrTail string `json:"stderr_tail"`
	Truncated  bool   `json:"truncated"`
}

func (h *handler) getWorkloadOutput(w http.ResponseWriter, r *http.Request) {
	o, err := h.Fleet.WorkloadOutput(r.Context(), chi.URLParam(r, "id"), chi.URLParam(r, "run_id"), chi.URLParam(r, "attempt_id"))
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, outputView{StdoutTail: o.StdoutTail, StderrTail: o.StderrTail, Truncated: o.Truncated})
}
