package handlers

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/ledger"
)

// Package host endpoints are wrappers over the credential kinds: each
// submits its operation (request id = the Idempotency-Key header, else a
// fresh one), waits for it to end, and answers the host. A new token is
// re-derived from its operation (auth.Service.PackageHostToken) and shown
// in the answer only; it is never in the ledger.

type packageHostView struct {
	PackageHostID string     `json:"package_host_id"`
	Name          string     `json:"name"`
	Families      []string   `json:"families"`
	Generation    int64      `json:"generation"`
	CreatedAt     time.Time  `json:"created_at"`
	RevokedAt     *time.Time `json:"revoked_at"`
}

func viewPackageHost(h auth.PackageHost) packageHostView {
	return packageHostView{PackageHostID: h.ID, Name: h.Name, Families: h.Families, Generation: h.Generation,
		CreatedAt: h.CreatedAt, RevokedAt: h.RevokedAt}
}

// issuedView is a host with the token just minted for it.
type issuedView struct {
	packageHostView
	Token       string `json:"token"`
	OperationID string `json:"operation_id"`
}

// idempotencyKey is the ledger request id of a wrapper call: its
// Idempotency-Key header, else a fresh id. A malformed key is 400
// invalid_parameter naming the header.
func idempotencyKey(r *http.Request) (string, error) {
	k := r.Header.Get("Idempotency-Key")
	if k == "" {
		return ledger.NewID(), nil
	}
	if !ledger.ValidRequestID(k) {
		e := errcode.New(errcode.InvalidParameter, "Idempotency-Key: 1-128 characters of letters, digits, '.', '_', ':' or '-'")
		e.Fields = []errcode.FieldError{{Field: "Idempotency-Key", Message: e.Message}}
		return "", e
	}
	return k, nil
}

// errCredentialRunning is what runCredential answers for an operation that
// had not ended within the longest wait.
var errCredentialRunning = errors.New("credential operation still running")

// runCredential submits a credential kind as the caller, under request id
// rid, and waits for its end: the API's and the console's one path to
// package host changes. It answers the succeeded operation; a refusal or
// the failed operation's error; or the operation with errCredentialRunning
// when it has not ended within the longest wait.
func (h *handler) runCredential(r *http.Request, rid, kind string, targets []ledger.Target, operation any) (ledger.Operation, bool, error) {
	body, err := json.Marshal(operation)
	if err != nil {
		return ledger.Operation{}, false, err
	}
	op, created, err := h.Ledger.Submit(r.Context(), ledgerPrincipal(r), ledger.Submission{
		RequestID: rid, Kind: kind, Targets: targets, Operation: body, Wait: h.Ledger.Settings().MaxWait,
		// The token shown in the answer spends its reveal handle
		// (DECISIONS.md §37).
		InlineSecrets: true,
	})
	switch {
	case err != nil:
		return op, false, rebaseFields(err, "operation", "")
	case op.State == ledger.StateSucceeded:
		return op, created, nil
	case op.Terminal():
		e := &errcode.Error{Code: errcode.Internal, Message: "internal error"}
		if op.Error != nil && op.Error.Code != ledger.CodeInternal {
			e = errcode.New(errcode.Code(op.Error.Code), op.Error.Message)
			if _, ok := statusOf[e.Code]; !ok {
				// The ledger's own ends (cancelled, timed_out, interrupted).
				e = errcode.Errorf(errcode.Conflict, "operation %s ended %s: %s", op.ID, op.State, op.Error.Message)
			}
		}
		return op, false, e
	}
	return op, false, errCredentialRunning
}

// submitCredential runs a credential kind for the API. It answers false
// after writing the answer itself: a refusal, the failed operation's
// error, or 202 with the operation when it has not ended within the
// longest wait.
func (h *handler) submitCredential(w http.ResponseWriter, r *http.Request, kind string, targets []ledger.Target, operation any) (ledger.Operation, bool, bool) {
	rid, err := idempotencyKey(r)
	if err != nil {
		writeError(w, r, err)
		return ledger.Operation{}, false, false
	}
	op, created, err := h.runCredential(r, rid, kind, targets, operation)
	if errors.Is(err, errCredentialRunning) {
		w.Header().Set("Location", "/api/v1/operations/"+op.ID)
		writeJSON(w, http.StatusAccepted, viewOperation(op))
		return op, false, false
	}
	if err != nil {
		writeError(w, r, err)
		return op, false, false
	}
	return op, created, true
}

// issuedHost is the host a succeeded credential.issue left, as that
// operation left it (a later one may have moved on), with the token it
// minted: re-derived from the operation, never read from storage.
func (h *handler) issuedHost(r *http.Request, op ledger.Operation) (auth.PackageHost, string, error) {
	res, err := ledger.ResultPackageHost(op)
	if err != nil {
		return auth.PackageHost{}, "", err
	}
	// A submit that waited to the end holds the token, revealed inline
	// (audited then). A replay of the request is shown it again, minted
	// anew (the identical token): that showing is audited too.
	tok := op.Secrets[ledger.FieldToken]
	if tok == "" {
		if tok, err = h.Auth.PackageHostToken(r.Context(), op.ID, res.PackageHostID, res.Generation); err != nil {
			return auth.PackageHost{}, "", err
		}
		if err := h.Secrets.AuditShownAgain(r.Context(), sealPrincipal(r), op.RequestID, op.ID, ledger.FieldToken); err != nil {
			return auth.PackageHost{}, "", err
		}
	}
	host, err := h.Auth.PackageHost(r.Context(), res.PackageHostID)
	if err != nil {
		return auth.PackageHost{}, "", err
	}
	host.Generation, host.Families = res.Generation, res.Families
	return host, tok, nil
}

// answerIssued answers a host with the token its operation minted: 201
// when the operation is new, 200 for a replay of the same request.
func (h *handler) answerIssued(w http.ResponseWriter, r *http.Request, op ledger.Operation, created bool) {
	host, tok, err := h.issuedHost(r, op)
	if err != nil {
		writeError(w, r, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, status, issuedView{packageHostView: viewPackageHost(host), Token: tok, OperationID: op.ID})
}

func (h *handler) createPackageHost(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Name     string   `json:"name"`
		Families []string `json:"families"`
	}
	if err := decodeJSON(r, &body, false); err != nil {
		writeError(w, r, err)
		return
	}
	if _, err := auth.ValidatePackageHost(body.Name, body.Families, ""); err != nil {
		writeError(w, r, err)
		return
	}
	op, created, ok := h.submitCredential(w, r, ledger.KindCredentialIssue, nil,
		ledger.IssueOperation{Name: body.Name, Families: body.Families})
	if ok {
		h.answerIssued(w, r, op, created)
	}
}

func (h *handler) issuePackageHostToken(w http.ResponseWriter, r *http.Request) {
	if err := decodeJSON(r, &struct{}{}, true); err != nil {
		writeError(w, r, err)
		return
	}
	op, created, ok := h.submitCredential(w, r, ledger.KindCredentialIssue,
		[]ledger.Target{{Kind: ledger.TargetPackageHost, ID: chi.URLParam(r, "id")}}, ledger.IssueOperation{})
	if ok {
		h.answerIssued(w, r, op, created)
	}
}

func (h *handler) revokePackageHost(w http.ResponseWriter, r *http.Request) {
	if err := decodeJSON(r, &struct{}{}, true); err != nil {
		writeError(w, r, err)
		return
	}
	op, _, ok := h.submitCredential(w, r, ledger.KindCredentialRevoke,
		[]ledger.Target{{Kind: ledger.TargetPackageHost, ID: chi.URLParam(r, "id")}}, ledger.RevokeOperation{})
	if !ok {
		return
	}
	res, err := ledger.ResultPackageHost(op)
	if err != nil {
		writeError(w, r, err)
		return
	}
	host, err := h.Auth.PackageHost(r.Context(), res.PackageHostID)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewPackageHost(host))
}

func (h *handler) listPackageHosts(w http.ResponseWriter, r *http.Request) {
	limit, before, err := pageParams(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	rows, err := h.Auth.ListPackageHosts(r.Context(), before, limit)
	if err != nil {
		writeError(w, r, err)
		return
	}
	out := make([]packageHostView, 0, len(rows))
	for _, ph := range rows {
		out = append(out, viewPackageHost(ph))
	}
	var next *string
	if len(rows) == limit {
		s := strconv.FormatInt(rows[len(rows)-1].Cursor, 10)
		next = &s
	}
	writeJSON(w, http.StatusOK, map[string]any{"package_hosts": out, "next_before": next})
}
