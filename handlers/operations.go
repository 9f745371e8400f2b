package handlers

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/ledger"
)

// ledgerPrincipal is the caller as the ledger knows it: an administrator
// by user, or a package host with the generation of the token it presented
// and its grants.
func ledgerPrincipal(r *http.Request) ledger.Principal {
	p, _ := principalFrom(r.Context())
	if p.Kind == auth.KindPackageHost {
		return ledger.Principal{Kind: ledger.PrincipalPackageHost, ID: p.PackageHostID, Name: p.PackageHostName,
			Generation: p.Generation, Families: p.Families}
	}
	return ledger.Principal{Kind: ledger.PrincipalAdmin, ID: p.UserID, Name: p.Username}
}

type principalView struct {
	Kind string `json:"kind"`
	ID   string `json:"id"`
	Name string `json:"name"`
}

// operationView is an operation as the API answers it. Its request_id is
// the client's idempotency key (DECISIONS.md §42), not an HTTP request id.
type operationView struct {
	Cursor                string          `json:"cursor"`
	OperationID           string          `json:"operation_id"`
	RequestID             string          `json:"request_id"`
	Digest                string          `json:"digest"`
	Principal             principalView   `json:"principal"`
	PackageHostID         *string         `json:"package_host_id"`
	PackageHostGeneration *int64          `json:"package_host_generation"`
	Family                string          `json:"family"`
	Kind                  string          `json:"kind"`
	State                 string          `json:"state"`
	Terminal              bool            `json:"terminal"`
	Channel               string          `json:"channel"`
	Attempt               int             `json:"attempt"`
	Targets               []ledger.Target `json:"targets"`
	ParentID              *string         `json:"parent_id"`
	Counts                *ledger.Counts  `json:"counts"`
	Reason                string          `json:"reason"`
	Operation             json.RawMessage `json:"operation"`
	Result                json.RawMessage `json:"result"`
	Error                 *ledger.Error   `json:"error"`
	Evidence              json.RawMessage `json:"evidence"`
	CancelRequestedAt     *time.Time      `json:"cancel_requested_at"`
	CancelReason          *string         `json:"cancel_reason"`
	CreatedAt             time.Time       `json:"created_at"`
	AcceptedAt            *time.Time      `json:"accepted_at"`
	FinishedAt            *time.Time      `json:"finished_at"`
	Deadline              time.Time       `json:"deadline"`
	UpdatedAt             time.Time       `json:"updated_at"`
	// Reveals and Secrets are answered to a submit only (DECISIONS.md
	// §16, §37).
	Reveals map[string]string `json:"reveals,omitempty"`
	Secrets map[string]string `json:"secrets,omitempty"`
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func rawOrNull(b json.RawMessage) json.RawMessage {
	if len(b) == 0 {
		return json.RawMessage("null")
	}
	return b
}

func viewOperation(o ledger.Operation) operationView {
	v := operationView{
		Cursor: strconv.FormatInt(o.Cursor, 10), OperationID: o.ID, RequestID: o.RequestID, Digest: o.Digest,
		Principal: principalView{Kind: string(o.PrincipalKind), ID: o.PrincipalID, Name: o.PrincipalName},
		Family:    o.Family, Kind: o.Kind, State: string(o.State), Terminal: o.Terminal(), Channel: string(o.Channel),
		Attempt: o.Attempt, Targets: o.Targets, ParentID: optional(o.ParentID), Counts: o.Counts, Reason: o.Reason,
		Operation: rawOrNull(o.Operation), Result: rawOrNull(o.Result), Error: o.Error, Evidence: rawOrNull(o.Evidence),
		CancelRequestedAt: o.CancelRequestedAt, CreatedAt: o.CreatedAt, AcceptedAt: o.AcceptedAt,
		FinishedAt: o.FinishedAt, Deadline: o.Deadline, UpdatedAt: o.UpdatedAt,
		Reveals: o.Reveals, Secrets: o.Secrets,
	}
	if o.CancelRequestedAt != nil {
		v.CancelReason = &o.CancelReason
	}
	if o.PrincipalKind == ledger.PrincipalPackageHost {
		v.PackageHostID, v.PackageHostGeneration = &o.PrincipalID, &o.PackageHostGeneration
	}
	return v
}

type submitBody struct {
	RequestID     string          `json:"request_id"`
	Kind          string          `json:"kind"`
	Targets       []ledger.Target `json:"targets"`
	Operation     json.RawMessage `json:"operation"`
	Reason        string          `json:"reason"`
	WaitTimeoutMS *int64          `json:"wait_timeout_ms"`
}

func (h *handler) submitOperation(w http.ResponseWriter, r *http.Request) {
	var body submitBody
	if err := decodeJSON(r, &body, false); err != nil {
		writeError(w, r, err)
		return
	}
	var v errcode.Validation
	if string(body.Operation) == "null" {
		v.Add("operation", "must be a JSON object, not null")
	}
	var wait time.Duration
	if body.WaitTimeoutMS != nil {
		ms := *body.WaitTimeoutMS
		v.Check(ms >= 0 && ms <= h.Ledger.Settings().MaxWait.Milliseconds(), "wait_timeout_ms", "0 to %d", h.Ledger.Settings().MaxWait.Milliseconds())
		wait = time.Duration(ms) * time.Millisecond
	}
	if err := v.Err(); err != nil {
		writeError(w, r, err)
		return
	}
	op, created, err := h.Ledger.Submit(r.Context(), ledgerPrincipal(r), ledger.Submission{
		RequestID: body.RequestID, Kind: body.Kind, Targets: body.Targets, Operation: body.Operation,
		Reason: body.Reason, Wait: wait, InlineSecrets: true,
	})
	if err != nil {
		if errcode.Of(err) == errcode.QuotaExceeded {
			// A quota frees up as operations end; tell scripts when to
			// look again instead of leaving them to spin.
			w.Header().Set("Retry-After", "5")
		}
		writeError(w, r, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	w.Header().Set("Location", "/api/v1/operations/"+op.ID)
	writeJSON(w, status, viewOperation(op))
}

// revealSecret redeems a reveal handle: the secret's field and value,
// once, to the principal that submitted the operation.
func (h *handler) revealSecret(w http.ResponseWriter, r *http.Request) {
	field, value, err := h.Ledger.Reveal(r.Context(), ledgerPrincipal(r), chi.URLParam(r, "handle"))
	if err != nil {
		writeError(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, map[string]string{"field": field, "value": value})
}

func (h *handler) getOperation(w http.ResponseWriter, r *http.Request) {
	op, err := h.Ledger.Get(r.Context(), ledgerPrincipal(r), chi.URLParam(r, "id"))
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewOperation(op))
}

func (h *handler) cancelOperation(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Reason string `json:"reason"`
	}
	if err := decodeJSON(r, &body, true); err != nil {
		writeError(w, r, err)
		return
	}
	op, err := h.Ledger.Cancel(r.Context(), ledgerPrincipal(r), chi.URLParam(r, "id"), body.Reason)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewOperation(op))
}

// operationFilterParams are the listing's filters and the Filter field
// each sets (DECISIONS.md §39, §40).
var operationFilterParams = []struct {
	name string
	set  func(*ledger.Filter, string) error
}{
	{"package_host_id", func(f *ledger.Filter, s string) error {
		f.PrincipalKind, f.PrincipalID = ledger.PrincipalPackageHost, s
		return nil
	}},
	{"family", func(f *ledger.Filter, s string) error {
		if !slices.Contains(ledger.Families, s) {
			return fmt.Errorf("one of %s", strings.Join(ledger.Families, ", "))
		}
		f.Family = s
		return nil
	}},
	{"kind", func(f *ledger.Filter, s string) error { f.Kind = s; return nil }},
	{"state", func(f *ledger.Filter, s string) error {
		if !ledger.State(s).Valid() {
			return fmt.Errorf("one of pending, running, succeeded, failed, cancelled")
		}
		f.State = ledger.State(s)
		return nil
	}},
	{"request_id", func(f *ledger.Filter, s string) error {
		if !ledger.ValidRequestID(s) {
			return fmt.Errorf("1-128 characters of letters, digits, '.', '_', ':' or '-'")
		}
		f.RequestID = s
		return nil
	}},
	{"operation_id", func(f *ledger.Filter, s string) error { f.OperationID = s; return nil }},
	{"parent", func(f *ledger.Filter, s string) error { f.ParentID = s; return nil }},
	{"target_kind", func(f *ledger.Filter, s string) error {
		if !slices.Contains(ledger.TargetKinds, s) {
			return fmt.Errorf("one of %s", strings.Join(ledger.TargetKinds, ", "))
		}
		f.TargetKind = s
		return nil
	}},
	{"target_id", func(f *ledger.Filter, s string) error { f.TargetID = s; return nil }},
	{"before", func(f *ledger.Filter, s string) error {
		n, err := parseCursor(s)
		if err != nil {
			return err
		}
		f.Before = n
		return nil
	}},
}

// operationFilterNames are the listing's filter parameters.
func operationFilterNames() []string {
	out := make([]string, len(operationFilterParams))
	for i, p := range operationFilterParams {
		out[i] = p.name
	}
	return out
}

// operationFilterOf reads the listing's filters, cursor and limit from a
// query: the API's and the console's one reading of them. A kind must be
// one of served's: the listing shows no other.
func operationFilterOf(q query, served *ledger.Registry) (ledger.Filter, error) {
	var f ledger.Filter
	if q.err != nil {
		return f, q.err
	}
	for _, p := range operationFilterParams {
		v, err := q.get(p.name)
		if err != nil {
			return f, err
		}
		if v == "" {
			continue
		}
		if len(v) > 256 {
			return f, invalidParameter(p.name, "at most 256 bytes")
		}
		if err := p.set(&f, v); err != nil {
			return f, invalidParameter(p.name, "%s", err.Error())
		}
	}
	if _, ok := served.Kind(f.Kind); f.Kind != "" && !ok {
		return f, invalidParameter("kind", "a served kind (GET /api/v1/capabilities lists them)")
	}
	f.Limit = operationsPageSize
	n, ok, err := q.number("limit", 1, maxOperationsPage, "an integer from 1 to %d", maxOperationsPage)
	if err != nil {
		return f, err
	}
	if ok {
		f.Limit = int(n)
	}
	return f, nil
}

// The listing's default and largest page.
const (
	operationsPageSize = 100
	maxOperationsPage  = 500
)

func (h *handler) listOperations(w http.ResponseWriter, r *http.Request) {
	f, err := operationFilterOf(queryOf(r), h.Ledger.Kinds())
	if err != nil {
		writeError(w, r, err)
		return
	}
	limit := f.Limit
	ops, err := h.Ledger.List(r.Context(), ledgerPrincipal(r), f)
	if err != nil {
		writeError(w, r, err)
		return
	}
	out := make([]operationView, len(ops))
	for i, o := range ops {
		out[i] = viewOperation(o)
	}
	var next *string
	if len(ops) == limit {
		c := strconv.FormatInt(ops[len(ops)-1].Cursor, 10)
		next = &c
	}
	writeJSON(w, http.StatusOK, map[string]any{"operations": out, "next_before": next})
}

// eventView is one operation event as a watch streams it.
type eventView struct {
	Cursor      string          `json:"cursor"`
	OperationID string          `json:"operation_id"`
	Type        string          `json:"type"`
	At          time.Time       `json:"at"`
	Data        json.RawMessage `json:"data"`
}

// watchOperation streams the operation's events as server-sent events
// until it ends; Last-Event-ID resumes after an event already seen. A
// drain ends the stream with a final `draining` event (DECISIONS.md §36).
func (h *handler) watchOperation(w http.ResponseWriter, r *http.Request) {
	p := ledgerPrincipal(r)
	id := chi.URLParam(r, "id")
	var after int64
	if s := r.Header.Get("Last-Event-ID"); s != "" {
		n, err := parseCursor(s)
		if err != nil {
			writeError(w, r, errcode.New(errcode.InvalidParameter, "Last-Event-ID: a cursor of an event this stream sent"))
			return
		}
		after = n
	}
	if _, err := h.Ledger.Get(r.Context(), p, id); err != nil {
		writeError(w, r, err)
		return
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush()
	err := h.Ledger.Watch(r.Context(), p, id, after, func(e ledger.Event) error {
		data, err := json.Marshal(eventView{Cursor: strconv.FormatInt(e.Cursor, 10), OperationID: e.OperationID,
			Type: e.Type, At: e.At, Data: rawOrNull(e.Data)})
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", e.Cursor, e.Type, data); err != nil {
			return err
		}
		return rc.Flush()
	})
	if errors.Is(err, ledger.ErrDraining) {
		_, _ = fmt.Fprint(w, "event: draining\ndata: {}\n\n")
		_ = rc.Flush()
		return
	}
	if err != nil && r.Context().Err() == nil {
		h.log.Warn("watch ended", "operation_id", id, "err", err)
	}
}
