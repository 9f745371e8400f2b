package handlers

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/a-h/templ"
	"github.com/go-chi/chi/v5"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/views"
)

// The console's node pages: the list, one node with its actions, and the
// invitation. Every action is the same ledger submission the API's
// wrappers make (submitNodeOp, submitCommand), as the signed-in
// administrator, under the request id minted when the form was rendered,
// so a double submit is one operation.

// consoleNodePageSize is how many nodes one list page shows.
const consoleNodePageSize = 50

// consoleNodeRoutes mounts the node pages (inside the session group).
func (h *handler) consoleNodeRoutes(r chi.Router) {
	r.With(h.consoleOnlyQuery("state", "lease", "before")).Get("/console/nodes", h.consoleNodes)
	r.Get("/console/nodes/invite", h.consoleInviteForm)
	r.Post("/console/nodes/invite", h.consoleInvite)
	r.Get("/console/nodes/{id}", h.consoleNode)
	r.Post("/console/nodes/{id}/commands", h.consoleIssueCommand)
	r.Get("/console/nodes/{id}/reinvite", h.consoleConfirmForm(views.ReinviteConfirmPage))
	r.Post("/console/nodes/{id}/reinvite", h.consoleReinvite)
	r.Get("/console/nodes/{id}/retire", h.consoleConfirmForm(views.RetireConfirmPage))
	r.Post("/console/nodes/{id}/retire", h.consoleRetire)
	h.consoleConfigRoutes(r)
}

func priceText(micros *int64) string {
	p := priceUSD(micros)
	if p == nil {
		return ""
	}
	return "$" + strconv.FormatFloat(*p, 'f', -1, 64) + "/h"
}

// factsHostname is the hostname the node's facts report, "" when none.
func factsHostname(facts json.RawMessage) string {
	var f struct {
		Hostname string `json:"hostname"`
	}
	_ = json.Unmarshal(facts, &f)
	return f.Hostname
}

func nodeRow(n fleet.Node) views.NodeRow {
	return views.NodeRow{
		ID: n.ID, RentalID: n.RentalID, Generation: n.Generation, State: string(n.State), FencingToken: n.FencingToken,
		Hostname: factsHostname(n.Facts), LastHeartbeat: n.LastHeartbeatAt, AgentVersion: n.AgentVersion,
		Disk:  views.DiskInfo{State: n.Disk.State, FreeBytes: n.Disk.FreeBytes, ObservedAt: n.Disk.ObservedAt},
		Price: priceText(n.PriceMicros),
	}
}

func (h *handler) consoleNodes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	v := views.NodesView{Now: h.Fleet.Now(), Filter: views.NodeFilter{State: q.Get("state"), Lapsing: q.Get("lease") == "lapsing"}}
	f := fleet.NodeFilter{Limit: consoleNodePageSize}
	switch {
	case v.Filter.State != "" && !fleet.State(v.Filter.State).Valid():
		v.Error = "Unknown state: choose enrolling, ready, lost or retired."
		v.Filter.State = ""
	case q.Has("lease") && !v.Filter.Lapsing:
		v.Error = "Unknown lease filter: the only one is “lease about to lapse”."
	}
	f.State = fleet.State(v.Filter.State)
	if v.Filter.Lapsing {
		// Lapsing is a ready node's state of affairs (the overview's count).
		f.State, v.Filter.State = fleet.StateReady, string(fleet.StateReady)
		before := v.Now.Add(h.Fleet.LapseWindow())
		f.LeaseBefore = &before
	}
	if s := q.Get("before"); s != "" && v.Error == "" {
		t, id, ok := decodeKeyCursor(s)
		if !ok {
			v.Error = "This page link is not valid. Start again from the newest nodes."
		}
		f.BeforeCreated, f.BeforeID, v.Paged = &t, id, true
	}
	if v.Error != "" {
		h.render(w, r, http.StatusBadRequest, views.NodesPage(h.shell(r, views.NavNodes), v))
		return
	}
	nodes, err := h.Fleet.Nodes(r.Context(), f)
	if err != nil {
		h.consoleInternal(w, r, err)
		return
	}
	for _, n := range nodes {
		v.Nodes = append(v.Nodes, nodeRow(n))
	}
	if len(nodes) == consoleNodePageSize {
		v.OlderBefore = encodeNodeCursor(nodes[len(nodes)-1])
	}
	h.render(w, r, http.StatusOK, views.NodesPage(h.shell(r, views.NavNodes), v))
}

// consoleNodePageLimits bound what the node page reads of each trail.
const (
	consoleTimelineLimit   = 50
	consoleOperationsLimit = 20
	consoleRecentCommands  = 10
	consolePendingCommands = 50
	consoleWorkloadsShown  = 20
)

func (h *handler) consoleNode(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	s := h.shell(r, views.NavNodes)
	v, err := h.nodeDetail(r, id)
	if err != nil {
		h.consoleInternal(w, r, err)
		return
	}
	v.Command = views.CommandForm{RequestID: newRequestID(), Kind: "launch_workload"}
	// After an action, say what happened: looked up, never echoed from the
	// query string.
	q := r.URL.Query()
	if opID := q.Get("command"); opID != "" {
		if c, err := h.Fleet.Command(r.Context(), opID); err == nil && c.NodeID == id {
			s.Flash = views.Flash{Kind: views.FlashOK, Message: "Command " + c.OperationID + " (" + c.Kind + ") submitted; it is " + string(c.State) + "."}
		}
	}
	if opID := q.Get("configured"); opID != "" {
		if op, err := h.Ledger.Get(r.Context(), ledgerPrincipal(r), opID); err == nil && op.Kind == ledger.KindNodeConfigure && op.TargetID == id {
			s.Flash = views.Flash{Kind: views.FlashOK, Message: "Configuration submitted as operation " + op.ID + "; it is " + string(op.State) + "."}
		}
	}
	if q.Has("retired") && v.Retired() {
		s.Flash = views.Flash{Kind: views.FlashOK, Message: "Node " + v.Node.ID + " is retired."}
	}
	h.render(w, r, http.StatusOK, views.NodePage(s, v))
}

// nodeDetail reads everything the node page shows. Errors: the node's
// fleet.ErrNotFound, or a read failure.
func (h *handler) nodeDetail(r *http.Request, id string) (views.NodeDetail, error) {
	ctx := r.Context()
	n, err := h.Fleet.Node(ctx, id)
	if err != nil {
		return views.NodeDetail{}, err
	}
	now := h.Fleet.Now()
	v := views.NodeDetail{Now: now, Node: nodeRow(n), CreatedAt: n.CreatedAt, EnrolledAt: n.EnrolledAt,
		LeaseExpiresAt: n.LeaseExpiresAt, RetiredAt: n.RetiredAt, EligibleClasses: n.Purchase.EligibleClasses,
		AvailableUntil: n.Purchase.AvailableUntil, CommittedUntil: fleet.CommittedUntil(n, now),
		FactsObservedAt: n.FactsObservedAt, FactsReceivedAt: n.FactsReceivedAt, Facts: factsOf(n.Facts)}
	if b := n.Purchase.BillingIntervalSeconds; b != nil {
		v.BillingInterval = (time.Duration(*b) * time.Second).String()
	}
	v.Config = h.nodeConfigPanel(r, id)
	v.Caps = capabilitiesOf(n)
	freshNodeForms(&v)

	// Workloads only: Reconcile would also read every command the node
	// ever applied (consolebench: the busy node's page read them all).
	ws, err := h.Fleet.Workloads(ctx, id)
	if err != nil {
		return v, err
	}
	sort.SliceStable(ws, func(i, j int) bool { return ws[i].ObservedAt.After(ws[j].ObservedAt) })
	if len(ws) > consoleWorkloadsShown {
		ws = ws[:consoleWorkloadsShown]
	}
	for _, wl := range ws {
		row := views.WorkloadRow{RunID: wl.RunID, AttemptID: wl.AttemptID, State: wl.State, ExitCode: wl.ExitCode}
		if !wl.ObservedAt.IsZero() {
			o := wl.ObservedAt
			row.ObservedAt = &o
		}
		out, err := h.Fleet.WorkloadOutput(ctx, id, wl.RunID, wl.AttemptID)
		switch {
		case err == nil:
			row.HasOutput, row.StdoutTail, row.StderrTail, row.Truncated = true, out.StdoutTail, out.StderrTail, out.Truncated
		case errcode.Of(err) != errcode.NotFound:
			return v, err
		}
		v.Workloads = append(v.Workloads, row)
	}

	pending, err := h.Fleet.Commands(ctx, id, fleet.CommandPending, consolePendingCommands)
	if err != nil {
		return v, err
	}
	for _, c := range pending {
		v.Pending = append(v.Pending, commandRow(c))
	}
	// Recent commands: the node's latest command operations, newest first,
	// as their commands stand now.
	cmdOps, err := h.Ledger.List(ctx, ledgerPrincipal(r), ledger.Filter{TargetKind: ledger.TargetNode, TargetID: id,
		Family: ledger.FamilyCommands, Limit: consoleRecentCommands})
	if err != nil {
		return v, err
	}
	for _, op := range cmdOps {
		c, err := h.Fleet.Command(ctx, op.ID)
		if err != nil || c.State == fleet.CommandPending {
			continue // pruned, or listed above
		}
		v.Recent = append(v.Recent, commandRow(c))
	}

	ops, err := h.Ledger.List(ctx, ledgerPrincipal(r), ledger.Filter{TargetKind: ledger.TargetNode, TargetID: id, Limit: consoleOperationsLimit})
	if err != nil {
		return v, err
	}
	for _, op := range ops {
		row := views.NodeOperationRow{ID: op.ID, Kind: op.Kind, State: string(op.State), CreatedAt: op.CreatedAt}
		if op.Error != nil {
			row.Error = op.Error.Code + ": " + op.Error.Message
		}
		v.Operations = append(v.Operations, row)
	}

	audit, err := h.Fleet.Audit(ctx, id, 0, consoleTimelineLimit)
	if err != nil {
		return v, err
	}
	entries, err := h.timeline(r, id, consoleTimelineLimit, audit)
	if err != nil {
		return v, err
	}
	for _, e := range entries {
		row := views.TimelineRow{At: e.At, Source: e.Source, Action: e.Action, Actor: e.Actor}
		if e.OperationID != nil {
			row.OperationID = *e.OperationID
		}
		if e.Kind != nil {
			row.Kind = *e.Kind
		}
		if d := string(e.Detail); d != "null" && d != "{}" {
			row.Detail = d
		}
		v.Timeline = append(v.Timeline, row)
	}
	return v, nil
}

func commandRow(c fleet.Command) views.CommandRow {
	row := views.CommandRow{OperationID: c.OperationID, Kind: c.Kind, State: string(c.State), IssuedAt: c.IssuedAt,
		SettledAt: c.SettledAt, DeliveryCount: c.DeliveryCount}
	if c.FailureCode != "" || c.FailureMessage != "" {
		row.Failure = strings.TrimPrefix(c.FailureCode+": "+c.FailureMessage, ": ")
	}
	return row
}

// factsOf lists the facts' top-level fields by name: strings as they are,
// anything else as compact JSON.
func factsOf(raw json.RawMessage) []views.Fact {
	var m map[string]json.RawMessage
	if len(raw) == 0 || json.Unmarshal(raw, &m) != nil {
		return nil
	}
	out := make([]views.Fact, 0, len(m))
	for k, v := range m {
		var val any
		if json.Unmarshal(v, &val) != nil {
			continue
		}
		s, ok := val.(string)
		if !ok {
			// As JSON, but readable: templ escapes it for HTML.
			var b strings.Builder
			enc := json.NewEncoder(&b)
			enc.SetEscapeHTML(false)
			_ = enc.Encode(val)
			s = strings.TrimSpace(b.String())
		}
		out = append(out, views.Fact{Key: k, Value: s})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// fieldErrors maps a refusal's fields to form fields (rename maps an API
// field to the form's name); what names no form field is the form's error.
func fieldErrors(err error, rename map[string]string, known ...string) (map[string]string, string) {
	var e *errcode.Error
	if !errors.As(err, &e) {
		return nil, ""
	}
	fields := map[string]string{}
	var rest []string
	for _, f := range e.Fields {
		name := f.Field
		if to, ok := rename[name]; ok {
			name = to
		}
		found := false
		for _, k := range known {
			if k == name {
				found = true
			}
		}
		if found && fields[name] == "" {
			fields[name] = f.Message
		} else {
			rest = append(rest, f.Field+": "+f.Message)
		}
	}
	msg := ""
	if len(rest) > 0 || len(fields) == 0 {
		msg = e.Message
		if len(rest) > 0 {
			msg = strings.Join(rest, "; ")
		}
	}
	return fields, msg
}

// refusal reports whether err is a refusal the console shows on the form
// (a validation failure or a domain code), rather than an error page.
func refusal(err error) bool {
	switch errcode.Of(err) {
	case "", errcode.Internal, errcode.Unavailable, errcode.Draining, errcode.Overloaded, errcode.NotFound, errcode.PermissionDenied:
		return false
	}
	return true
}

func (h *handler) consoleIssueCommand(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	form := views.CommandForm{RequestID: formRequestID(r), Kind: r.PostForm.Get("kind"),
		Payload: r.PostForm.Get("payload"), OperationID: strings.TrimSpace(r.PostForm.Get("operation_id")), Errors: map[string]string{}}
	known := false
	for _, k := range views.CommandKinds {
		known = known || k == form.Kind
	}
	if !known {
		form.Errors["kind"] = "Choose one of " + strings.Join(views.CommandKinds, ", ") + "."
	}
	payload := json.RawMessage(strings.TrimSpace(form.Payload))
	var obj map[string]json.RawMessage
	if len(payload) == 0 {
		form.Errors["payload"] = "Required: a JSON object."
	} else if err := json.Unmarshal(payload, &obj); err != nil || obj == nil {
		form.Errors["payload"] = "Not a JSON object: check the braces, quotes and commas."
	}
	if form.OperationID == "" {
		form.Errors["operation_id"] = "Required: a unique id for this command."
	}
	var err error
	var op ledger.Operation
	if len(form.Errors) == 0 {
		op, _, err = h.submitCommand(r, id, "node."+form.Kind, form.OperationID, form.RequestID, payload)
		switch {
		case err == nil:
			http.Redirect(w, r, views.NodeHref(id)+"?command="+url.QueryEscape(op.ID), http.StatusSeeOther)
			return
		case errors.Is(err, ledger.ErrRequestConflict):
			// This form was submitted before with other values: a new form.
			form.RequestID = newRequestID()
			form.Error = "This form was already submitted with other values. Check the node's commands below; submit again to issue a new command."
		case !refusal(err):
			h.consoleInternal(w, r, err)
			return
		default:
			fields, msg := fieldErrors(err, map[string]string{"operation": "payload"}, "kind", "payload", "operation_id")
			for k, m := range fields {
				form.Errors[k] = m
			}
			form.Error = msg
			if msg == "" && len(fields) == 0 {
				form.Error = errorMessage(err)
			}
		}
	}
	v, derr := h.nodeDetail(r, id)
	if derr != nil {
		h.consoleInternal(w, r, derr)
		return
	}
	v.Command = form
	status := http.StatusUnprocessableEntity
	if err != nil {
		status = statusFor(r, err)
	}
	s := h.shell(r, views.NavNodes)
	if v.Retired() && form.Error != "" {
		// A retired node's page has no command form to show it on.
		s.Flash = views.Flash{Kind: views.FlashError, Message: form.Error}
	}
	h.render(w, r, status, views.NodePage(s, v))
}

// errorMessage is a coded error's message for the page.
func errorMessage(err error) string {
	var e *errcode.Error
	if errors.As(err, &e) {
		return e.Message
	}
	return "The request was refused."
}

// consoleConfirmForm serves the confirmation page of a node action
// (page); a retired node has no action left, so it goes back to the
// node's page.
func (h *handler) consoleConfirmForm(page func(views.Shell, views.Confirm) templ.Component) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n, err := h.Fleet.Node(r.Context(), chi.URLParam(r, "id"))
		if err != nil {
			h.consoleInternal(w, r, err)
			return
		}
		if n.State == fleet.StateRetired {
			http.Redirect(w, r, views.NodeHref(n.ID), http.StatusSeeOther)
			return
		}
		h.render(w, r, http.StatusOK, page(h.shell(r, views.NavNodes), views.Confirm{Node: nodeRow(n), RequestID: newRequestID()}))
	}
}

func (h *handler) consoleRetire(w http.ResponseWriter, r *http.Request) {
	n, err := h.Fleet.Node(r.Context(), chi.URLParam(r, "id"))
	if err != nil {
		h.consoleInternal(w, r, err)
		return
	}
	v := views.Confirm{Node: nodeRow(n), RequestID: formRequestID(r), Reason: r.PostForm.Get("reason"), Errors: map[string]string{}}
	if r.PostForm.Get("confirm") != "yes" {
		v.Errors["confirm"] = "Tick the box to confirm: retiring cannot be undone."
	}
	if len(v.Reason) > 512 {
		v.Errors["reason"] = "At most 512 characters."
	}
	if len(v.Errors) == 0 {
		target := []ledger.Target{{Kind: ledger.TargetNode, ID: n.ID}}
		op, _, err := h.submitNodeOp(r, v.RequestID, ledger.KindNodeRetire, target, ledger.RetireOperation{Reason: v.Reason})
		if err == nil && op.Terminal() && op.State != ledger.StateSucceeded {
			err = operationFailure(op)
		}
		switch {
		case err == nil:
			http.Redirect(w, r, views.NodeHref(n.ID)+"?retired=1", http.StatusSeeOther)
			return
		case !refusal(err):
			h.consoleInternal(w, r, err)
			return
		default:
			v.RequestID = newRequestID()
			v.Error = errorMessage(err)
		}
	}
	h.render(w, r, http.StatusUnprocessableEntity, views.RetireConfirmPage(h.shell(r, views.NavNodes), v))
}

func (h *handler) consoleReinvite(w http.ResponseWriter, r *http.Request) {
	n, err := h.Fleet.Node(r.Context(), chi.URLParam(r, "id"))
	if err != nil {
		h.consoleInternal(w, r, err)
		return
	}
	v := views.Confirm{Node: nodeRow(n), RequestID: formRequestID(r),
		RedeemableThrough: strings.TrimSpace(r.PostForm.Get("redeemable_through")), Errors: map[string]string{}}
	if r.PostForm.Get("confirm") != "yes" {
		v.Errors["confirm"] = "Tick the box to confirm: the outstanding bootstrap stops working."
	}
	var val errcode.Validation
	var through *time.Time
	if v.RedeemableThrough != "" {
		through = parseTime(&val, "redeemable_through", &v.RedeemableThrough)
	}
	if err := val.Err(); err != nil {
		fields, _ := fieldErrors(err, nil, "redeemable_through")
		for k, m := range fields {
			v.Errors[k] = m
		}
	}
	if len(v.Errors) == 0 {
		target := []ledger.Target{{Kind: ledger.TargetNode, ID: n.ID}}
		op, created, err := h.submitNodeOp(r, v.RequestID, ledger.KindNodeReinvite, target, ledger.ReinviteOperation{RedeemableThrough: through})
		done, err := h.bootstrapAnswerPage(w, r, op, created, err, true)
		if done {
			return
		}
		fields, msg := fieldErrors(err, nil, "redeemable_through")
		for k, m := range fields {
			v.Errors[k] = m
		}
		v.Error = msg
		if msg == "" && len(fields) == 0 {
			v.Error = errorMessage(err)
		}
		v.RequestID = newRequestID()
	}
	h.render(w, r, http.StatusUnprocessableEntity, views.ReinviteConfirmPage(h.shell(r, views.NavNodes), v))
}

// bootstrapAnswerPage answers an invite's or reinvite's submission: the
// bootstrap, once, when this submission created the operation; the
// "already shown" page for a replay (a reload re-posting the form, a
// double click). It answers false, having written nothing, with the
// refusal the form shows.
func (h *handler) bootstrapAnswerPage(w http.ResponseWriter, r *http.Request, op ledger.Operation, created bool, err error, reinvite bool) (bool, error) {
	if err == nil && !op.Terminal() {
		err = errcode.New(errcode.Unavailable, "The invitation is still being recorded; look at the node list in a moment.")
	}
	if err == nil && op.State != ledger.StateSucceeded {
		err = operationFailure(op)
	}
	if err != nil {
		if refusal(err) {
			return false, err
		}
		h.consoleInternal(w, r, err)
		return true, nil
	}
	b, err := h.bootstrapOf(r, op)
	if err != nil {
		h.consoleInternal(w, r, err)
		return true, nil
	}
	s := h.shell(r, views.NavNodes)
	if !created {
		h.render(w, r, http.StatusOK, views.AlreadyShownPage(s, views.AlreadyShown{NodeID: b.NodeID, Reinvite: reinvite}))
		return true, nil
	}
	doc, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		h.consoleInternal(w, r, err)
		return true, nil
	}
	// render sets Cache-Control: no-store; the page is this POST's answer
	// only, never at a URL a reload or the history could fetch again.
	h.render(w, r, http.StatusOK, views.BootstrapPage(s, views.Bootstrap{NodeID: b.NodeID, RentalID: b.RentalID,
		ExpiresAt: b.ExpiresAt, JSON: string(doc), Command: agentCommand(b), Reinvite: reinvite}))
	return true, nil
}

// agentCommand is a command line that starts the agent with the bootstrap
// (README "Run an agent": NODEWARD_AGENT_BOOTSTRAP may carry the JSON
// itself).
func agentCommand(b api.Bootstrap) string {
	doc, _ := json.Marshal(b)
	cmd := "NODEWARD_AGENT_BOOTSTRAP=" + shellQuote(string(doc)) + " \\\n  nodeward-agent --state-dir /var/lib/nodeward-agent"
	if strings.HasPrefix(b.ControlPlaneURL, "http://") {
		// Plain http is refused unless allowed (and only to loopback).
		cmd += " --allow-insecure-http"
	}
	return cmd
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func (h *handler) consoleInviteForm(w http.ResponseWriter, r *http.Request) {
	h.render(w, r, http.StatusOK, views.InvitePage(h.shell(r, views.NavNodes),
		views.InviteForm{RequestID: newRequestID(), Generation: "1"}))
}

// inviteFormFields renames the invitation's API fields to the form's.
var inviteFormFields = map[string]string{
	"purchase/billing_interval_seconds": "billing_interval_seconds",
	"purchase/eligible_classes":         "eligible_classes",
	"purchase/available_until":          "available_until",
}

func (h *handler) consoleInvite(w http.ResponseWriter, r *http.Request) {
	pf := r.PostForm
	f := views.InviteForm{RequestID: formRequestID(r), RentalID: strings.TrimSpace(pf.Get("rental_id")),
		Generation: strings.TrimSpace(pf.Get("generation")), NodeID: strings.TrimSpace(pf.Get("node_id")),
		Price: strings.TrimSpace(pf.Get("shadow_price_usd_per_hour")), RedeemableThrough: strings.TrimSpace(pf.Get("redeemable_through")),
		BillingInterval: strings.TrimSpace(pf.Get("billing_interval_seconds")), EligibleClasses: strings.TrimSpace(pf.Get("eligible_classes")),
		AvailableUntil: strings.TrimSpace(pf.Get("available_until")), Errors: map[string]string{}}
	body := invitationBody{RentalID: f.RentalID}
	if f.NodeID != "" { // an empty field asks for a minted id
		body.NodeID = &f.NodeID
	}
	if g, err := strconv.ParseInt(f.Generation, 10, 64); err == nil {
		body.Generation = g
	} else {
		f.Errors["generation"] = "A whole number, 1 or more."
	}
	if f.Price != "" {
		if p, err := parseFiniteFloat(f.Price); err == nil {
			body.ShadowPriceUSD = &p
		} else {
			f.Errors["shadow_price_usd_per_hour"] = "A number of dollars, like 0.25."
		}
	}
	if f.RedeemableThrough != "" {
		body.RedeemableThrough = &f.RedeemableThrough
	}
	if f.BillingInterval != "" || f.EligibleClasses != "" || f.AvailableUntil != "" {
		p := &purchaseBody{}
		if f.BillingInterval != "" {
			if n, err := strconv.ParseInt(f.BillingInterval, 10, 64); err == nil {
				p.BillingIntervalSeconds = &n
			} else {
				f.Errors["billing_interval_seconds"] = "A whole number of seconds."
			}
		}
		for _, c := range strings.Split(f.EligibleClasses, ",") {
			if c = strings.TrimSpace(c); c != "" {
				p.EligibleClasses = append(p.EligibleClasses, c)
			}
		}
		if f.AvailableUntil != "" {
			p.AvailableUntil = &f.AvailableUntil
		}
		body.Purchase = p
	}
	known := []string{"rental_id", "generation", "node_id", "shadow_price_usd_per_hour", "redeemable_through",
		"billing_interval_seconds", "eligible_classes", "available_until"}
	in, err := body.operation()
	if err != nil {
		fields, _ := fieldErrors(err, inviteFormFields, known...)
		for k, m := range fields {
			if f.Errors[k] == "" {
				f.Errors[k] = m
			}
		}
	}
	status := http.StatusUnprocessableEntity
	if len(f.Errors) == 0 {
		op, created, err := h.submitNodeOp(r, f.RequestID, ledger.KindNodeInvite, nil, in)
		done, err := h.bootstrapAnswerPage(w, r, op, created, err, false)
		if done {
			return
		}
		f.RequestID = newRequestID()
		if errors.Is(err, ledger.ErrRequestConflict) {
			f.Error = "This form was already submitted with other values. Check the node list; submit again to send a new invitation."
		} else {
			fields, msg := fieldErrors(err, inviteFormFields, known...)
			f.Errors, f.Error = fields, msg
			if msg == "" && len(fields) == 0 {
				f.Error = errorMessage(err)
			}
		}
		status = statusFor(r, err)
	}
	h.render(w, r, status, views.InvitePage(h.shell(r, views.NavNodes), f))
}
