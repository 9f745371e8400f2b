package handlers

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"

	"github.com/go-chi/chi/v5"

	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/secrets"
	"github.com/nodeward/nodeward/views"
)

// consoleOperationsRoutes mounts the operations, secret audit and package
// host pages (inside the console's session group). Every read goes
// through the API's domain calls and its parsing of filters; every action
// is a ledger operation submitted by the signed-in administrator.
func (h *handler) consoleOperationsRoutes(r chi.Router) {
	r.With(h.consoleOnlyQuery(append(operationFilterNames(), "limit")...)).Get("/console/operations", h.consoleOperations)
	r.Get("/console/operations/{id}", h.consoleOperation)
	r.Post("/console/operations/{id}/cancel", h.consoleCancelOperation)
	r.With(h.consoleOnlyQuery(append(secretAuditFilterNames(), "limit", "before")...)).Get("/console/secret-audit", h.consoleSecretAudit)
	r.Get("/console/package-hosts", h.consolePackageHosts)
	r.Post("/console/package-hosts", h.consoleCreatePackageHost)
	r.Post("/console/package-hosts/{id}/revoke", h.consoleRevokePackageHost)
	r.Post("/console/package-hosts/{id}/tokens", h.consoleIssuePackageHostToken)
}

// consoleQuery is a console GET form's query: a field left empty is not a
// filter (the API refuses `name=`), so empty values are dropped before the
// API's own reading of the query. The cursor is kept apart.
func consoleQuery(r *http.Request) (query, url.Values) {
	q := queryOf(r)
	if q.err != nil {
		return q, url.Values{}
	}
	clean := url.Values{}
	for k, vs := range q.values {
		var kept []string
		for _, v := range vs {
			if v != "" {
				kept = append(kept, v)
			}
		}
		if len(kept) > 0 {
			clean[k] = kept
		}
	}
	form := url.Values{}
	for k, vs := range clean {
		if k != "before" {
			form[k] = vs
		}
	}
	return query{values: clean}, form
}

// filterError is what a refused filter shows: the API's message, and the
// field it names.
func filterError(err error) (msg, field string, ok bool) {
	var e *errcode.Error
	if !errors.As(err, &e) || (e.Code != errcode.InvalidParameter && e.Code != errcode.ValidationFailed) {
		return "", "", false
	}
	if len(e.Fields) > 0 {
		field = e.Fields[0].Field
	}
	return e.Message, field, true
}

func (h *handler) consoleOperations(w http.ResponseWriter, r *http.Request) {
	q, form := consoleQuery(r)
	v := views.OperationsView{Query: form}
	f, err := operationFilterOf(q, h.Ledger.Kinds())
	if err != nil {
		msg, field, ok := filterError(err)
		if !ok {
			h.consoleInternal(w, r, err)
			return
		}
		v.Error, v.ErrorField = msg, field
		h.render(w, r, http.StatusBadRequest, views.OperationsPage(h.shell(r, views.NavOperations), v))
		return
	}
	v.Paged = f.Before > 0
	ops, err := h.Ledger.List(r.Context(), ledgerPrincipal(r), f)
	if err != nil {
		h.consoleInternal(w, r, err)
		return
	}
	for _, o := range ops {
		row := views.OperationRow{ID: o.ID, Kind: o.Kind, State: string(o.State), RequestID: o.RequestID,
			Principal: string(o.PrincipalKind) + ": " + o.PrincipalName, Target: targetText(o.Targets),
			ParentID: o.ParentID, CreatedAt: o.CreatedAt}
		if o.Error != nil {
			row.ErrorCode = o.Error.Code
		}
		v.Operations = append(v.Operations, row)
	}
	if len(ops) == f.Limit {
		v.OlderBefore = strconv.FormatInt(ops[len(ops)-1].Cursor, 10)
	}
	h.render(w, r, http.StatusOK, views.OperationsPage(h.shell(r, views.NavOperations), v))
}

// targetText summarises an operation's targets for the listing.
func targetText(ts []ledger.Target) string {
	switch len(ts) {
	case 0:
		return ""
	case 1:
		if ts[0].ID == "" {
			return ts[0].Kind
		}
		return ts[0].Kind + " " + ts[0].ID
	}
	return strconv.Itoa(len(ts)) + " targets"
}

// prettyJSON indents a JSON document for display; "" for none.
func prettyJSON(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return string(raw)
	}
	return buf.String()
}

// consoleEventsShown is how many events the detail page lists.
const consoleEventsShown = 500

func (h *handler) operationDetail(r *http.Request, op ledger.Operation) (views.OperationDetailView, error) {
	v := views.OperationDetailView{
		ID: op.ID, RequestID: op.RequestID, Digest: op.Digest, Kind: op.Kind, Family: op.Family,
		State: string(op.State), Terminal: op.Terminal(), Channel: string(op.Channel), Attempt: op.Attempt,
		PrincipalKind: string(op.PrincipalKind), PrincipalID: op.PrincipalID, PrincipalName: op.PrincipalName,
		HostGeneration: op.PackageHostGeneration, ParentID: op.ParentID, Reason: op.Reason,
		Operation: prettyJSON(op.Operation), Result: prettyJSON(op.Result), Evidence: prettyJSON(op.Evidence),
		CancelRequestedAt: op.CancelRequestedAt, CancelReason: op.CancelReason,
		CreatedAt: op.CreatedAt, AcceptedAt: op.AcceptedAt, FinishedAt: op.FinishedAt, Deadline: op.Deadline,
	}
	v.Readable = readableResult(op)
	for _, t := range op.Targets {
		v.Targets = append(v.Targets, views.TargetRow{Kind: t.Kind, ID: t.ID})
	}
	if op.Error != nil {
		v.ErrorCode, v.ErrorMessage, v.ErrorRetryable = op.Error.Code, op.Error.Message, op.Error.Retryable
	}
	if c := op.Counts; c != nil {
		v.Counts = &views.ChildCounts{Total: c.Total, Succeeded: c.Succeeded, Failed: c.Failed, Cancelled: c.Cancelled, Pending: c.Pending}
	}
	evs, err := h.Ledger.Events(r.Context(), ledgerPrincipal(r), op.ID, 0, consoleEventsShown)
	if err != nil {
		return v, err
	}
	for _, e := range evs {
		data := ""
		if len(e.Data) > 0 && string(e.Data) != "null" && string(e.Data) != "{}" {
			data = string(e.Data)
		}
		v.Events = append(v.Events, views.EventRow{Cursor: e.Cursor, Type: e.Type, At: e.At, Data: data})
	}
	v.MoreEvents = len(evs) == consoleEventsShown
	return v, nil
}

func (h *handler) consoleOperation(w http.ResponseWriter, r *http.Request) {
	op, err := h.Ledger.Get(r.Context(), ledgerPrincipal(r), chi.URLParam(r, "id"))
	if errors.Is(err, ledger.ErrNotFound) {
		h.consoleError(w, r, consoleFrom(r.Context()), http.StatusNotFound, "No such operation",
			"There is no operation with that id. It may have been pruned after its retention.")
		return
	}
	if err != nil {
		h.consoleInternal(w, r, err)
		return
	}
	v, err := h.operationDetail(r, op)
	if err != nil {
		h.consoleInternal(w, r, err)
		return
	}
	s := h.shell(r, views.NavOperations)
	if r.URL.Query().Get("diagnose") == "1" && op.Kind == ledger.KindNodeDiagnose {
		s.Flash = views.Flash{Kind: views.FlashOK, Message: "Diagnose submitted: the evidence shows here when the node answers."}
	}
	if r.URL.Query().Get("cancelled") == "1" && op.CancelRequestedAt != nil {
		s.Flash = views.Flash{Kind: views.FlashOK, Message: "Cancellation requested."}
	}
	h.render(w, r, http.StatusOK, views.OperationPage(s, v))
}

func (h *handler) consoleCancelOperation(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	reason := r.PostForm.Get("reason")
	if !displayable(reason) {
		h.refuseCancel(w, r, id, reason, "A reason may not hold control characters, bidirectional formatting characters or invalid UTF-8.")
		return
	}
	op, err := h.Ledger.Cancel(r.Context(), ledgerPrincipal(r), id, reason)
	if errors.Is(err, ledger.ErrNotFound) {
		h.consoleError(w, r, consoleFrom(r.Context()), http.StatusNotFound, "No such operation", "There is no operation with that id.")
		return
	}
	if msg, _, ok := filterError(err); ok {
		h.refuseCancel(w, r, id, reason, msg)
		return
	}
	if err != nil {
		h.consoleInternal(w, r, err)
		return
	}
	http.Redirect(w, r, views.OperationHref(op.ID)+"?cancelled=1", http.StatusSeeOther)
}

// refuseCancel shows the operation again, 422, with the cancel form's
// error.
func (h *handler) refuseCancel(w http.ResponseWriter, r *http.Request, id, reason, msg string) {
	op, err := h.Ledger.Get(r.Context(), ledgerPrincipal(r), id)
	if err != nil {
		h.consoleInternal(w, r, err)
		return
	}
	v, err := h.operationDetail(r, op)
	if err != nil {
		h.consoleInternal(w, r, err)
		return
	}
	v.CancelFormReason, v.CancelFormError = reason, msg
	h.render(w, r, http.StatusUnprocessableEntity, views.OperationPage(h.shell(r, views.NavOperations), v))
}

// consoleSecretAuditPageSize is the secret audit's default console page.
const consoleSecretAuditPageSize = 50

func (h *handler) consoleSecretAudit(w http.ResponseWriter, r *http.Request) {
	q, form := consoleQuery(r)
	v := views.SecretAuditView{Query: form, Actions: secrets.AuditActions, Outcomes: secrets.AuditOutcomes,
		PrincipalKinds: []string{string(ledger.PrincipalAdmin), string(ledger.PrincipalPackageHost)}}
	if q.err == nil && q.values.Get("limit") == "" {
		q.values.Set("limit", strconv.Itoa(consoleSecretAuditPageSize))
	}
	f, err := secretAuditFilterOf(q)
	if err != nil {
		msg, field, ok := filterError(err)
		if !ok {
			h.consoleInternal(w, r, err)
			return
		}
		v.Error, v.ErrorField = msg, field
		h.render(w, r, http.StatusBadRequest, views.SecretAuditPage(h.shell(r, views.NavSecretAudit), v))
		return
	}
	v.Paged = f.Before > 0
	rows, err := h.Secrets.Audit(r.Context(), f)
	if err != nil {
		h.consoleInternal(w, r, err)
		return
	}
	for _, a := range rows {
		v.Entries = append(v.Entries, views.SecretAuditRow{At: a.At, Action: a.Action, Outcome: a.Outcome,
			PrincipalKind: a.Principal.Kind, PrincipalID: a.Principal.ID, HandleDigest: a.HandleDigest,
			RequestID: a.RequestID, OperationID: a.OperationID, TargetKind: a.Target.Kind, TargetID: a.Target.ID, Field: a.Field})
	}
	if len(rows) == f.Limit {
		v.OlderBefore = strconv.FormatInt(rows[len(rows)-1].Cursor, 10)
	}
	h.render(w, r, http.StatusOK, views.SecretAuditPage(h.shell(r, views.NavSecretAudit), v))
}
