package handlers

import (
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/views"
)

// The node page's desired configuration, capabilities and diagnostics,
// and the lagging list. Reads are the API's (fleet.Service.NodeConfig:
// sealed values masked, never decrypted into the page); every action is
// the ledger submission the API makes (node.configure, node.diagnose) as
// the signed-in administrator, under the request id minted when the form
// was rendered, so the kinds' preparers validate it — the console keeps no
// second copy of their rules.

// consoleConfigRoutes mounts the configuration and diagnose actions and
// the lagging list (inside the session group).
func (h *handler) consoleConfigRoutes(r chi.Router) {
	r.Post("/console/nodes/{id}/config", h.consoleSetConfig)
	r.Post("/console/nodes/{id}/config/clear", h.consoleClearConfig)
	r.Post("/console/nodes/{id}/diagnose", h.consoleDiagnose)
	r.With(h.consoleOnlyQuery("before")).Get("/console/config/lagging", h.consoleLagging)
}

// consoleLaggingPageSize is how many lagging nodes one page lists.
const consoleLaggingPageSize = 50

// nodeConfigPanel reads the node's configuration as the API answers it. A
// failed read is shown as unavailable (and logged) rather than failing the
// page.
func (h *handler) nodeConfigPanel(r *http.Request, id string) views.ConfigPanel {
	cv, err := h.Fleet.NodeConfig(r.Context(), id)
	if err != nil {
		logger(r).Error("node page: configuration", "node_id", id, "err", err)
		return views.ConfigPanel{Unavailable: true}
	}
	p := views.ConfigPanel{AppliedRevision: cv.AppliedRevision, Verdict: cv.Verdict, Lagging: cv.Lagging}
	if d := cv.Desired; d != nil {
		p.Desired = &views.DesiredConfig{Revision: d.Revision, Hash: d.Hash, Format: d.Format, SizeBytes: d.SizeBytes,
			UpdatedAt: d.UpdatedAt, OperationID: d.OperationID, Document: prettyJSON(d.Document),
			Cleared: len(d.Document) == 0 || string(d.Document) == "null"}
	}
	if rep := cv.Reported; rep != nil {
		p.Reported = &views.ConfigReportRow{Revision: rep.Revision, Hash: rep.Hash, State: rep.State,
			Message: rep.Message, ObservedAt: rep.ObservedAt}
	}
	return p
}

// capabilitiesOf reads the capabilities the node's facts report,
// telling a list from its absence (an older agent, read as commands.v1 and
// config.v1).
func capabilitiesOf(n fleet.Node) views.Capabilities {
	caps, known := n.Capabilities()
	c := views.Capabilities{Known: known, List: caps, Diag: !known || slices.Contains(caps, api.CapDiag)}
	if known {
		var probe struct {
			Capabilities json.RawMessage `json:"capabilities"`
		}
		_ = json.Unmarshal(n.Facts, &probe)
		c.Legacy = len(probe.Capabilities) == 0 || string(probe.Capabilities) == "null"
	}
	return c
}

// freshNodeForms mints the request ids of the node page's configuration
// and diagnose forms, and fills the format with the current one.
func freshNodeForms(v *views.NodeDetail) {
	v.ConfigForm = views.ConfigForm{RequestID: newRequestID(), ClearRequestID: newRequestID()}
	if v.Config.Desired != nil {
		v.ConfigForm.Format = v.Config.Desired.Format
	}
	v.Diagnose = views.DiagnoseForms{RequestIDs: map[string]string{}}
	for _, a := range views.DiagnoseActions {
		v.Diagnose.RequestIDs[a.Action] = newRequestID()
	}
}

// submitConfigure submits node.configure for one node: the API's path.
func (h *handler) submitConfigure(r *http.Request, nodeID, requestID string, op ledger.ConfigureOperation) (ledger.Operation, error) {
	body, err := json.Marshal(op)
	if err != nil {
		return ledger.Operation{}, err
	}
	out, _, err := h.Ledger.Submit(r.Context(), ledgerPrincipal(r), ledger.Submission{
		RequestID: requestID, Kind: ledger.KindNodeConfigure,
		Targets: []ledger.Target{{Kind: ledger.TargetNode, ID: nodeID}}, Operation: body})
	return out, err
}

// configFormFields renames node.configure's fields to the form's.
var configFormFields = map[string]string{
	"operation/format":   "format",
	"operation/document": "document",
	"operation/force":    "force",
}

// configSubmitted redirects to the node page, which says which operation
// carries the configuration.
func configSubmitted(w http.ResponseWriter, r *http.Request, nodeID string, op ledger.Operation) {
	http.Redirect(w, r, views.NodeHref(nodeID)+"?configured="+url.QueryEscape(op.ID), http.StatusSeeOther)
}

func (h *handler) consoleSetConfig(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	pf := r.PostForm
	f := views.ConfigForm{RequestID: formRequestID(r), Format: strings.TrimSpace(pf.Get("format")),
		Document: pf.Get("document"), Force: pf.Get("force") == "yes", Errors: map[string]string{}}
	doc := strings.TrimSpace(f.Document)
	var probe any
	switch {
	case doc == "":
		f.Errors["document"] = "Required: a JSON document."
	case json.Unmarshal([]byte(doc), &probe) != nil:
		err := json.Unmarshal([]byte(doc), &probe)
		f.Errors["document"] = "Not valid JSON (" + strings.TrimPrefix(err.Error(), "json: ") + "): check the braces, quotes and commas."
	case probe == nil:
		f.Errors["document"] = "A JSON null clears the configuration: use Clear configuration instead."
	}
	var err error
	if len(f.Errors) == 0 {
		op := ledger.ConfigureOperation{Format: f.Format, Document: json.RawMessage(doc)}
		if f.Force {
			force := true
			op.Force = &force
		}
		var out ledger.Operation
		out, err = h.submitConfigure(r, id, f.RequestID, op)
		switch {
		case err == nil:
			configSubmitted(w, r, id, out)
			return
		case errors.Is(err, ledger.ErrRequestConflict):
			f.RequestID = newRequestID()
			f.Error = "This form was already submitted with other values. Check the configuration above; submit again to set this one."
		case !refusal(err):
			h.consoleInternal(w, r, err)
			return
		default:
			fields, msg := fieldErrors(err, configFormFields, "format", "document", "force")
			for k, m := range fields {
				f.Errors[k] = m
			}
			f.Error = msg
			if msg == "" && len(fields) == 0 {
				f.Error = errorMessage(err)
			}
		}
	}
	h.nodePageAgain(w, r, id, err, func(v *views.NodeDetail) {
		clearID := v.ConfigForm.ClearRequestID
		v.ConfigForm = f
		v.ConfigForm.ClearRequestID = clearID
	})
}

func (h *handler) consoleClearConfig(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	requestID := formRequestID(r)
	errs := map[string]string{}
	var msg string
	var err error
	if r.PostForm.Get("confirm") != "yes" {
		errs["confirm"] = "Tick the box to confirm: the node removes its configuration."
	} else {
		cv, rerr := h.Fleet.NodeConfig(r.Context(), id)
		switch {
		case rerr != nil:
			h.consoleInternal(w, r, rerr)
			return
		case cv.Desired == nil:
			msg = "This node has no configuration to clear."
		default:
			var out ledger.Operation
			out, err = h.submitConfigure(r, id, requestID, ledger.ConfigureOperation{Format: cv.Desired.Format, Document: json.RawMessage("null")})
			switch {
			case err == nil:
				configSubmitted(w, r, id, out)
				return
			case errors.Is(err, ledger.ErrRequestConflict):
				requestID = newRequestID()
				msg = "This form was already submitted with other values. Check the configuration above; submit again to clear it."
			case !refusal(err):
				h.consoleInternal(w, r, err)
				return
			default:
				msg = errorMessage(err)
			}
		}
	}
	h.nodePageAgain(w, r, id, err, func(v *views.NodeDetail) {
		v.ConfigForm.ClearRequestID, v.ConfigForm.ClearErrors, v.ConfigForm.ClearError = requestID, errs, msg
	})
}

// diagnosePayload builds the operation of a diagnose form: only the
// action's own fields, converted from text (a number where the API takes
// one); every rule on their values is the kind's preparer's
// (api.ValidateDiagnose).
func diagnosePayload(action string, pf url.Values) (map[string]any, map[string]string, map[string]string) {
	op := map[string]any{"action": action}
	values, errs := map[string]string{}, map[string]string{}
	for _, a := range views.DiagnoseActions {
		if a.Action != action {
			continue
		}
		for _, p := range a.Params {
			raw := pf.Get(p.Name)
			values[p.Name] = raw
			s := strings.TrimSpace(raw)
			if s == "" {
				continue
			}
			switch {
			case p.Multi:
				var list []string
				for _, line := range strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' || r == ',' }) {
					if line = strings.TrimSpace(line); line != "" {
						list = append(list, line)
					}
				}
				op[p.Name] = list
			case p.Name == "port":
				n, err := strconv.Atoi(s)
				if err != nil {
					errs[p.Name] = "A whole number."
					continue
				}
				op[p.Name] = n
			case p.Numeric:
				n, err := parseFiniteFloat(s)
				if err != nil {
					errs[p.Name] = "A number of seconds, like 2.5."
					continue
				}
				op[p.Name] = n
			default:
				op[p.Name] = s
			}
		}
	}
	return op, values, errs
}

// diagnoseFieldErrors maps a refusal's fields (operation/paths/2) to the
// form's (paths); what names no field of the action is the form's error.
func diagnoseFieldErrors(err error, action string) (map[string]string, string) {
	var e *errcode.Error
	if !errors.As(err, &e) {
		return nil, errorMessage(err)
	}
	known := map[string]bool{}
	for _, a := range views.DiagnoseActions {
		if a.Action == action {
			for _, p := range a.Params {
				known[p.Name] = true
			}
		}
	}
	fields := map[string]string{}
	var rest []string
	for _, f := range e.Fields {
		name, _, _ := strings.Cut(strings.TrimPrefix(f.Field, "operation/"), "/")
		switch {
		case known[name] && fields[name] == "":
			fields[name] = f.Message
		case known[name]:
		default:
			rest = append(rest, f.Field+": "+f.Message)
		}
	}
	msg := strings.Join(rest, "; ")
	if msg == "" && len(fields) == 0 {
		msg = e.Message
	}
	return fields, msg
}

func (h *handler) consoleDiagnose(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	action := r.PostForm.Get("action")
	form := views.DiagnoseForms{Action: action, Errors: map[string]string{}}
	requestID := formRequestID(r)
	op, values, errs := diagnosePayload(action, r.PostForm)
	form.Values, form.Errors = values, errs
	var err error
	if len(errs) == 0 {
		var body []byte
		if body, err = json.Marshal(op); err != nil {
			h.consoleInternal(w, r, err)
			return
		}
		var out ledger.Operation
		out, _, err = h.Ledger.Submit(r.Context(), ledgerPrincipal(r), ledger.Submission{
			RequestID: requestID, Kind: ledger.KindNodeDiagnose,
			Targets: []ledger.Target{{Kind: ledger.TargetNode, ID: id}}, Operation: body})
		switch {
		case err == nil:
			http.Redirect(w, r, views.OperationHref(out.ID)+"?diagnose=1", http.StatusSeeOther)
			return
		case errors.Is(err, ledger.ErrRequestConflict):
			requestID = newRequestID()
			form.Error = "This form was already submitted with other values. Check the node's operations below; submit again to run it."
		case !refusal(err):
			h.consoleInternal(w, r, err)
			return
		case errcode.Of(err) == errcode.CapabilityMissing:
			form.Error = "Refused (capability_missing): " + errorMessage(err) + "."
		default:
			form.Errors, form.Error = diagnoseFieldErrors(err, action)
		}
	}
	h.nodePageAgain(w, r, id, err, func(v *views.NodeDetail) {
		ids := v.Diagnose.RequestIDs
		if _, ok := ids[action]; ok {
			ids[action] = requestID
		}
		form.RequestIDs = ids
		v.Diagnose = form
	})
}

// nodePageAgain renders the node page after a refused form: its status is
// the refusal's (422 for the form's own checks), and edit puts the form's
// values and errors back.
func (h *handler) nodePageAgain(w http.ResponseWriter, r *http.Request, id string, err error, edit func(*views.NodeDetail)) {
	v, derr := h.nodeDetail(r, id)
	if derr != nil {
		h.consoleInternal(w, r, derr)
		return
	}
	v.Command = views.CommandForm{RequestID: newRequestID(), Kind: "launch_workload"}
	edit(&v)
	status := http.StatusUnprocessableEntity
	if err != nil {
		status = statusFor(r, err)
	}
	s := h.shell(r, views.NavNodes)
	if v.Retired() && err != nil {
		// A retired node's page has no forms to show it on.
		s.Flash = views.Flash{Kind: views.FlashError, Message: errorMessage(err)}
	}
	h.render(w, r, status, views.NodePage(s, v))
}

func (h *handler) consoleLagging(w http.ResponseWriter, r *http.Request) {
	v := views.LaggingView{Now: h.Fleet.Now()}
	before := r.URL.Query().Get("before")
	v.Paged = before != ""
	if !laggingCursor(before) {
		v.Error = "This page link is not valid. Start again from the first page."
		h.render(w, r, http.StatusBadRequest, views.LaggingPage(h.shell(r, views.NavOverview), v))
		return
	}
	page, err := h.Fleet.LaggingConfigs(r.Context(), before, consoleLaggingPageSize)
	if err != nil {
		h.consoleInternal(w, r, err)
		return
	}
	v.Count, v.NeverReported = page.Count, page.NeverReported
	for _, n := range page.Nodes {
		row := views.LaggingRow{NodeID: n.NodeID, DesiredRevision: n.DesiredRevision, AppliedRevision: n.AppliedRevision, Verdict: n.Verdict}
		if !n.ReportedAt.IsZero() {
			at := n.ReportedAt
			row.ReportedAt = &at
		}
		v.Nodes = append(v.Nodes, row)
	}
	if page.NextBefore != nil {
		v.NextBefore = *page.NextBefore
	}
	h.render(w, r, http.StatusOK, views.LaggingPage(h.shell(r, views.NavOverview), v))
}

// parseFiniteFloat reads a form's number: ParseFloat also takes NaN and
// ±Inf, which no field means and JSON cannot carry.
func parseFiniteFloat(s string) (float64, error) {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err == nil && (math.IsNaN(f) || math.IsInf(f, 0)) {
		return 0, strconv.ErrSyntax
	}
	return f, err
}
