package handlers

import (
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
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
	var body outputBody
	if err := decodeJSON(r, &body, false); err != nil {
		writeError(w, r, err)
		return
	}
	req, err := body.request()
	if err != nil {
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

// outputBody is api.OutputRequest as decoded: every field is required and
// none may be null (DECISIONS §44), which plain strings could not tell from
// empty ones.
type outputBody struct {
	RunID      *string `json:"run_id"`
	AttemptID  *string `json:"attempt_id"`
	StdoutTail *string `json:"stdout_tail"`
	StderrTail *string `json:"stderr_tail"`
	Truncated  *bool   `json:"truncated"`
}

func (b outputBody) request() (api.OutputRequest, error) {
	var v errcode.Validation
	for _, f := range []struct {
		name    string
		present bool
	}{{"run_id", b.RunID != nil}, {"attempt_id", b.AttemptID != nil}, {"stdout_tail", b.StdoutTail != nil},
		{"stderr_tail", b.StderrTail != nil}, {"truncated", b.Truncated != nil}} {
		v.Check(f.present, f.name, "required, and not null")
	}
	if err := v.Err(); err != nil {
		return api.OutputRequest{}, err
	}
	return api.OutputRequest{RunID: *b.RunID, AttemptID: *b.AttemptID, StdoutTail: *b.StdoutTail,
		StderrTail: *b.StderrTail, Truncated: *b.Truncated}, nil
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
