package handlers

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/ledger"
)

func actor(r *http.Request) string {
	p, _ := principalFrom(r.Context())
	return "admin:" + p.Username
}

// parseTime parses an optional RFC 3339 field, naming it when malformed.
func parseTime(v *errcode.Validation, field string, s *string) *time.Time {
	if s == nil {
		return nil
	}
	t, err := time.Parse(time.RFC3339, *s)
	if err != nil {
		v.Add(field, "must be an RFC 3339 time, like 2026-01-02T15:04:05Z")
		return nil
	}
	t = t.UTC()
	return &t
}

// The node wrappers submit their ledger kinds and wait to the end (they
// are local and quick), answering as before the ledger (DECISIONS.md §35).
// The Idempotency-Key header, when given, is the request id: a replay
// answers the same result, with the identical enrollment token minted again
// for an administrator.

// submitAndWait submits a wrapper's operation and waits for its end. It
// answers false after writing the answer itself: an error, the operation's
// own failure as problem+json, or 202 with the operation when it has not
// ended within the wait.
func (h *handler) submitAndWait(w http.ResponseWriter, r *http.Request, kind string, targets []ledger.Target, operation any) (ledger.Operation, bool, bool) {
	requestID, err := idempotencyKey(r)
	if err != nil {
		writeError(w, r, err)
		return ledger.Operation{}, false, false
	}
	op, created, err := h.submitNodeOp(r, requestID, kind, targets, operation)
	switch {
	case err != nil:
		writeError(w, r, err)
		return op, created, false
	case !op.Terminal():
		w.Header().Set("Location", "/api/v1/operations/"+op.ID)
		writeJSON(w, http.StatusAccepted, viewOperation(op))
		return op, created, false
	case op.State != ledger.StateSucceeded:
		writeError(w, r, operationFailure(op))
		return op, created, false
	}
	return op, created, true
}

// submitNodeOp submits a node wrapper's operation (invite, reinvite,
// retire) as the request's principal under requestID and waits for its
// end: the one path the API's wrappers and the console's forms share.
func (h *handler) submitNodeOp(r *http.Request, requestID, kind string, targets []ledger.Target, operation any) (ledger.Operation, bool, error) {
	body, err := json.Marshal(operation)
	if err != nil {
		return ledger.Operation{}, false, err
	}
	op, created, err := h.Ledger.Submit(r.Context(), ledgerPrincipal(r), ledger.Submission{
		RequestID: requestID, Kind: kind, Targets: targets, Operation: body, Wait: h.Ledger.Settings().MaxWait,
		// The bootstrap shown in the answer spends its reveal handle
		// (DECISIONS.md §37); an administrator's replay re-mints it (§35).
		InlineSecrets: true})
	return op, created, rebaseFields(err, "operation", "")
}

// rebaseFields answers err with the field paths below from (the ledger's
// "operation/…") moved below to ("" for the top of the body): a wrapper's
// body is the operation, or holds it under another name, and its callers
// are told paths into what they sent.
func rebaseFields(err error, from, to string) error {
	var e *errcode.Error
	if !errors.As(err, &e) || len(e.Fields) == 0 {
		return err
	}
	move := func(field string) string {
		rest, ok := strings.CutPrefix(field, from+"/")
		switch {
		case !ok && field != from:
			return field
		case to == "":
			return rest
		case rest == "":
			return to
		}
		return to + "/" + rest
	}
	out := *e
	out.Fields = make([]errcode.FieldError, len(e.Fields))
	for i, f := range e.Fields {
		out.Fields[i] = errcode.FieldError{Field: move(f.Field), Message: f.Message}
	}
	if old := e.Fields[0].Field + ": "; strings.HasPrefix(e.Message, old) {
		out.Message = out.Fields[0].Field + ": " + strings.TrimPrefix(e.Message, old)
	}
	return &out
}

// operationFailure is an ended operation's error as the wrapper answers it.
func operationFailure(op ledger.Operation) error {
	if op.Error == nil {
		return errcode.Errorf(errcode.Conflict, "operation %s ended %s", op.ID, op.State)
	}
	return errcode.New(errcode.Code(op.Error.Code), op.Error.Message)
}

// bootstrapAnswer re-reads the bootstrap an invite or reinvite recorded,
// with its enrollment token minted again (the identical token).
func (h *handler) bootstrapAnswer(w http.ResponseWriter, r *http.Request, op ledger.Operation, status int) {
	b, err := h.bootstrapOf(r, op)
	if err != nil {
		writeError(w, r, err)
		return
	}
	w.Header().Set("Location", "/api/v1/nodes/"+b.NodeID)
	writeJSON(w, status, b)
}

// bootstrapOf is the bootstrap a succeeded invite or reinvite recorded,
// its enrollment token minted again (the identical token). A submit that
// waited to the end already holds the token (revealed inline, from the
// invitation it re-read then): it answers with that one, reading nothing
// again (two round trips and a commit less per invitation).
func (h *handler) bootstrapOf(r *http.Request, op ledger.Operation) (api.Bootstrap, error) {
	var res ledger.BootstrapResult
	if err := json.Unmarshal(op.Result, &res); err != nil {
		return api.Bootstrap{}, err
	}
	if tok := op.Secrets[ledger.FieldEnrollmentToken]; tok != "" {
		return h.Fleet.BootstrapOf(res.NodeID, res.RentalID, res.Generation, res.InvitationID, res.ExpiresAt.UTC(), tok), nil
	}
	b, err := h.Fleet.RemintBootstrap(r.Context(), res.InvitationID)
	if err != nil {
		return b, err
	}
	return b, h.Secrets.AuditShownAgain(r.Context(), sealPrincipal(r), op.RequestID, op.ID, ledger.FieldEnrollmentToken)
}

func replayStatus(created bool, fresh int) int {
	if created {
		return fresh
	}
	return http.StatusOK
}

type invitationBody struct {
	// NodeID is a pointer so that "" (refused) is told from absent (minted).
	NodeID            *string       `json:"node_id"`
	RentalID          string        `json:"rental_id"`
	Generation        int64         `json:"generation"`
	ShadowPriceUSD    *float64      `json:"shadow_price_usd_per_hour"`
	RedeemableThrough *string       `json:"redeemable_through"`
	Purchase          *purchaseBody `json:"purchase"`
}

type purchaseBody struct {
	BillingIntervalSeconds *int64   `json:"billing_interval_seconds"`
	EligibleClasses        []string `json:"eligible_classes"`
	AvailableUntil         *string  `json:"available_until"`
}

// operation is the node.invite operation the body asks for; a malformed
// time is a validation error naming its field.
func (body invitationBody) operation() (ledger.InviteOperation, error) {
	var v errcode.Validation
	var nodeID string
	if body.NodeID != nil {
		nodeID = *body.NodeID
		v.Check(nodeID != "", "node_id", "1-128 characters of letters, digits, '.', '_', ':' or '-' (leave it out to have one minted)")
	}
	in := ledger.InviteOperation{NodeID: nodeID, RentalID: body.RentalID, Generation: body.Generation,
		ShadowPriceUSD: body.ShadowPriceUSD, RedeemableThrough: parseTime(&v, "redeemable_through", body.RedeemableThrough)}
	if p := body.Purchase; p != nil {
		in.Purchase = &ledger.PurchaseOperation{BillingIntervalSeconds: p.BillingIntervalSeconds, EligibleClasses: p.EligibleClasses,
			AvailableUntil: parseTime(&v, "purchase/available_until", p.AvailableUntil)}
	}
	return in, v.Err()
}

func (h *handler) inviteNode(w http.ResponseWriter, r *http.Request) {
	var body invitationBody
	if err := decodeJSON(r, &body, false); err != nil {
		writeError(w, r, err)
		return
	}
	in, err := body.operation()
	if err != nil {
		writeError(w, r, err)
		return
	}
	op, created, ok := h.submitAndWait(w, r, ledger.KindNodeInvite, nil, in)
	if ok {
		h.bootstrapAnswer(w, r, op, replayStatus(created, http.StatusCreated))
	}
}

func (h *handler) reinviteNode(w http.ResponseWriter, r *http.Request) {
	var body struct {
		RedeemableThrough *string `json:"redeemable_through"`
	}
	if err := decodeJSON(r, &body, true); err != nil {
		writeError(w, r, err)
		return
	}
	var v errcode.Validation
	through := parseTime(&v, "redeemable_through", body.RedeemableThrough)
	if err := v.Err(); err != nil {
		writeError(w, r, err)
		return
	}
	target := []ledger.Target{{Kind: ledger.TargetNode, ID: chi.URLParam(r, "id")}}
	op, _, ok := h.submitAndWait(w, r, ledger.KindNodeReinvite, target, ledger.ReinviteOperation{RedeemableThrough: through})
	if ok {
		h.bootstrapAnswer(w, r, op, http.StatusOK)
	}
}

func (h *handler) retireNode(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Reason string `json:"reason"`
	}
	if err := decodeJSON(r, &body, true); err != nil {
		writeError(w, r, err)
		return
	}
	if len(body.Reason) > 512 {
		writeError(w, r, validationError("reason", "at most 512 characters"))
		return
	}
	target := []ledger.Target{{Kind: ledger.TargetNode, ID: chi.URLParam(r, "id")}}
	if _, _, ok := h.submitAndWait(w, r, ledger.KindNodeRetire, target, ledger.RetireOperation{Reason: body.Reason}); !ok {
		return
	}
	n, err := h.Fleet.Node(r.Context(), chi.URLParam(r, "id"))
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewNode(n))
}

// invalidParameter is a 400 naming a bad query parameter.
func invalidParameter(name, format string, args ...any) error {
	e := errcode.Errorf(errcode.InvalidParameter, "query parameter %s: "+format, append([]any{name}, args...)...)
	e.Fields = []errcode.FieldError{{Field: name, Message: e.Message}}
	return e
}

func queryLimit(r *http.Request, def, max int) (int, error) {
	n, ok, err := queryOf(r).number("limit", 1, int64(max), "an integer from 1 to %d", max)
	if err != nil || !ok {
		return def, err
	}
	return int(n), nil
}

// A keyset cursor of a listing ordered by (time, id) — nodes, commands,
// API tokens — is that key: the time in microseconds and the id, so a page
// resumes exactly after the last row of the one before.
func encodeKeyCursor(at time.Time, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(at.UnixMicro(), 10) + "|" + id))
}

func encodeNodeCursor(n fleet.Node) string { return encodeKeyCursor(n.CreatedAt, n.ID) }

// decodeKeyCursor reads a cursor encodeKeyCursor wrote.
func decodeKeyCursor(s string) (time.Time, string, bool) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return time.Time{}, "", false
	}
	us, id, ok := strings.Cut(string(b), "|")
	if !ok || id == "" || !plainText(id) {
		return time.Time{}, "", false
	}
	n, ok := wholeNumber(us, math.MaxInt64)
	if !ok {
		return time.Time{}, "", false
	}
	return time.UnixMicro(n).UTC(), id, true
}

func (h *handler) listNodes(w http.ResponseWriter, r *http.Request) {
	q := queryOf(r)
	f := fleet.NodeFilter{}
	state, err := q.get("state")
	if err != nil {
		writeError(w, r, err)
		return
	}
	at, id, paged, err := q.keyCursor("before")
	if err != nil {
		writeError(w, r, err)
		return
	}
	if paged {
		f.BeforeCreated, f.BeforeID = &at, id
	}
	if state != "" {
		if !fleet.State(state).Valid() {
			writeError(w, r, invalidParameter("state", "one of enrolling, ready, lost, retired"))
			return
		}
		f.State = fleet.State(state)
	}
	limit, err := queryLimit(r, 100, 500)
	if err != nil {
		writeError(w, r, err)
		return
	}
	f.Limit = limit
	nodes, err := h.Fleet.Nodes(r.Context(), f)
	if err != nil {
		writeError(w, r, err)
		return
	}
	out := make([]nodeView, len(nodes))
	for i, n := range nodes {
		out[i] = viewNode(n)
	}
	var next *string
	if len(nodes) == limit {
		c := encodeNodeCursor(nodes[len(nodes)-1])
		next = &c
	}
	writeJSON(w, http.StatusOK, map[string]any{"nodes": out, "next_before": next})
}

func (h *handler) getNode(w http.ResponseWriter, r *http.Request) {
	n, err := h.Fleet.Node(r.Context(), chi.URLParam(r, "id"))
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewNode(n))
}

// timelineEntry is one line of a node's timeline: a node audit entry (what
// the node did, what was done to it) or an operation's event (what a
// principal asked and how it went).
type timelineEntry struct {
	At          time.Time       `json:"at"`
	Source      string          `json:"source"`
	Action      string          `json:"action"`
	Actor       string          `json:"actor"`
	OperationID *string         `json:"operation_id"`
	Kind        *string         `json:"kind"`
	Detail      json.RawMessage `json:"detail"`
}

// nodeTimeline interleaves the node's audit and its operations' events by
// time, newest first (DECISIONS.md §41): the latest `limit` of each trail,
// merged and cut to `limit`.
func (h *handler) nodeTimeline(w http.ResponseWriter, r *http.Request) {
	id, limit, audit, ok := h.nodeAuditPage(w, r, 0)
	if !ok {
		return
	}
	out, err := h.timeline(r, id, limit, audit)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": out})
}

// timeline merges a node's audit entries (the latest limit) with the
// latest limit events of the operations that targeted it, newest first,
// cut to limit: the API's timeline and the console's node page alike.
func (h *handler) timeline(r *http.Request, id string, limit int, audit []fleet.AuditEntry) ([]timelineEntry, error) {
	events, err := h.Ledger.NodeEvents(r.Context(), id, limit)
	if err != nil {
		return nil, err
	}
	out := make([]timelineEntry, 0, len(audit)+len(events))
	for _, a := range audit {
		detail, _ := json.Marshal(a.Detail)
		out = append(out, timelineEntry{At: a.At, Source: "node", Action: a.Action, Actor: a.Actor, Detail: rawOrNull(detail)})
	}
	for _, e := range events {
		opID, kind := e.OperationID, e.Kind
		out = append(out, timelineEntry{At: e.At, Source: "operation", Action: e.Type,
			Actor: string(e.PrincipalKind) + ":" + e.PrincipalName, OperationID: &opID, Kind: &kind, Detail: rawOrNull(e.Data)})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.After(out[j].At) })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// nodeAuditPage reads the node's audit entries below before (0: the
// latest) for the audit and timeline answers; false when it answered an
// error itself.
func (h *handler) nodeAuditPage(w http.ResponseWriter, r *http.Request, before int64) (string, int, []fleet.AuditEntry, bool) {
	id := chi.URLParam(r, "id")
	if _, err := h.Fleet.Node(r.Context(), id); err != nil {
		writeError(w, r, err)
		return "", 0, nil, false
	}
	limit, err := queryLimit(r, 100, 500)
	if err != nil {
		writeError(w, r, err)
		return "", 0, nil, false
	}
	entries, err := h.Fleet.Audit(r.Context(), id, before, limit)
	if err != nil {
		writeError(w, r, err)
		return "", 0, nil, false
	}
	return id, limit, entries, true
}

func (h *handler) nodeAudit(w http.ResponseWriter, r *http.Request) {
	before, err := queryOf(r).cursor("before", "a cursor from next_before")
	if err != nil {
		writeError(w, r, err)
		return
	}
	_, limit, entries, ok := h.nodeAuditPage(w, r, before)
	if !ok {
		return
	}
	type entry struct {
		ID     int64          `json:"id"`
		At     time.Time      `json:"at"`
		Actor  string         `json:"actor"`
		Action string         `json:"action"`
		Detail map[string]any `json:"detail"`
	}
	out := make([]entry, len(entries))
	for i, e := range entries {
		out[i] = entry{ID: e.ID, At: e.At, Actor: e.Actor, Action: e.Action, Detail: e.Detail}
	}
	var next *string
	if len(entries) == limit {
		c := strconv.FormatInt(entries[len(entries)-1].ID, 10)
		next = &c
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": out, "next_before": next})
}

func (h *handler) reconciliation(w http.ResponseWriter, r *http.Request) {
	rec, err := h.Fleet.Reconcile(r.Context(), chi.URLParam(r, "id"))
	if err != nil {
		writeError(w, r, err)
		return
	}
	ws := make([]workloadView, len(rec.Workloads))
	for i, wl := range rec.Workloads {
		ws[i] = viewWorkload(wl)
	}
	applied := rec.AppliedOperationIDs
	if applied == nil {
		applied = []string{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"applied_operation_ids": applied,
		"pending_operation_ids": rec.PendingOperationIDs, "workloads": ws})
}

func (h *handler) getWorkload(w http.ResponseWriter, r *http.Request) {
	wl, err := h.Fleet.Workload(r.Context(), chi.URLParam(r, "id"), chi.URLParam(r, "run_id"), chi.URLParam(r, "attempt_id"))
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewWorkload(wl))
}

func (h *handler) listOffers(w http.ResponseWriter, r *http.Request) {
	q := queryOf(r)
	var f fleet.OfferFilter
	class, err := q.get("class")
	if err != nil {
		writeError(w, r, err)
		return
	}
	f.Class = class
	n, ok, err := q.number("min_free_disk_bytes", 0, math.MaxInt64, "a whole number of bytes, 0 or more")
	if err != nil {
		writeError(w, r, err)
		return
	}
	if ok {
		f.MinFreeDiskBytes = &n
	}
	until, err := q.get("until")
	if err != nil {
		writeError(w, r, err)
		return
	}
	if until != "" {
		t, err := time.Parse(time.RFC3339, until)
		if err != nil {
			writeError(w, r, invalidParameter("until", "an RFC 3339 time"))
			return
		}
		f.Until = &t
	}
	offers, err := h.Fleet.Offers(r.Context(), f)
	if err != nil {
		writeError(w, r, err)
		return
	}
	out := make([]offerView, len(offers))
	for i, o := range offers {
		out[i] = viewOffer(o)
	}
	writeJSON(w, http.StatusOK, map[string]any{"offers": out})
}

// issueCommand is the command wrapper over the ledger (DECISIONS.md §35):
// it submits node.<kind> with the caller's operation_id as the
// operation's id and the Idempotency-Key (else the operation_id) as its
// request id, and answers the command as before.
func (h *handler) issueCommand(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Kind        string          `json:"kind"`
		OperationID string          `json:"operation_id"`
		Payload     json.RawMessage `json:"payload"`
	}
	if err := decodeJSON(r, &body, false); err != nil {
		writeError(w, r, err)
		return
	}
	kind := "node." + body.Kind
	if _, known := ledger.CommandKinds[kind]; !known && kind != ledger.KindNodeDiagnose {
		writeError(w, r, validationError("kind", "one of prepare_image, prepare_artifact, launch_workload, stop_workload, diagnose"))
		return
	}
	key := r.Header.Get("Idempotency-Key")
	requestID := body.OperationID
	if key != "" {
		var err error
		if requestID, err = idempotencyKey(r); err != nil {
			writeError(w, r, err)
			return
		}
	}
	payload := body.Payload
	if len(payload) == 0 || string(payload) == "null" {
		writeError(w, r, validationError("payload", "required: a JSON object"))
		return
	}
	op, created, err := h.submitCommand(r, chi.URLParam(r, "id"), kind, body.OperationID, requestID, payload)
	if errors.Is(err, ledger.ErrRequestConflict) && key == "" {
		err = errcode.Errorf(errcode.OperationConflict, "operation id %q was used for another command", body.OperationID)
	}
	if err != nil {
		writeError(w, r, err)
		return
	}
	c, fresh := op.Recorded.(fleet.Command)
	if !fresh {
		// A replay: the command as it stands now.
		if c, err = h.Fleet.Command(r.Context(), op.ID); err != nil {
			writeError(w, r, err)
			return
		}
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	w.Header().Set("Location", "/api/v1/commands/"+c.OperationID)
	writeJSON(w, status, viewCommand(c))
}

// submitCommand submits a command kind (node.<kind>) for one node under
// the caller's operation id: the one path the API's wrapper and the
// console's form share (DECISIONS.md §34, §35).
func (h *handler) submitCommand(r *http.Request, nodeID, kind, operationID, requestID string, payload json.RawMessage) (ledger.Operation, bool, error) {
	op, created, err := h.Ledger.Submit(r.Context(), ledgerPrincipal(r), ledger.Submission{
		OperationID: operationID, RequestID: requestID, Kind: kind,
		Targets:   []ledger.Target{{Kind: ledger.TargetNode, ID: nodeID}},
		Operation: payload,
	})
	return op, created, rebaseFields(err, "operation", "payload")
}

// validationError is a 422 naming one field.
func validationError(field, message string) error {
	var v errcode.Validation
	v.Add(field, "%s", message)
	return v.Err()
}

func (h *handler) listNodeCommands(w http.ResponseWriter, r *http.Request) {
	var state fleet.CommandState
	s, err := queryOf(r).get("state")
	if err != nil {
		writeError(w, r, err)
		return
	}
	switch s {
	case "":
	case string(fleet.CommandPending), string(fleet.CommandApplied), string(fleet.CommandRefused), string(fleet.CommandCancelled):
		state = fleet.CommandState(s)
	default:
		writeError(w, r, invalidParameter("state", "one of pending, applied, refused, cancelled"))
		return
	}
	page, err := keyPageParams(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	var before *fleet.CommandKey
	if page.paged {
		before = &fleet.CommandKey{IssuedAt: page.at, OperationID: page.id}
	}
	cmds, err := h.Fleet.CommandHistory(r.Context(), chi.URLParam(r, "id"), state, before, page.limit)
	if err != nil {
		writeError(w, r, err)
		return
	}
	out := make([]commandView, len(cmds))
	var next *string
	for i, c := range cmds {
		out[i] = viewCommand(c)
		next = page.next(len(cmds), c.IssuedAt, c.OperationID)
	}
	writeJSON(w, http.StatusOK, map[string]any{"commands": out, "next_before": next})
}

func (h *handler) getCommand(w http.ResponseWriter, r *http.Request) {
	c, err := h.Fleet.Command(r.Context(), chi.URLParam(r, "operation_id"))
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewCommand(c))
}

func (h *handler) liveSessions(w http.ResponseWriter, r *http.Request) {
	ss, err := h.Fleet.LiveSessions(r.Context())
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"sessions": ss})
}
