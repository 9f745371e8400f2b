package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/nodeward/nodeward/errcode"
)

// statusOf is the one table from error codes to HTTP statuses.
var statusOf = map[errcode.Code]int{
	errcode.InvalidJSON:          http.StatusBadRequest,
	errcode.ValidationFailed:     http.StatusUnprocessableEntity,
	errcode.Unauthenticated:      http.StatusUnauthorized,
	errcode.PermissionDenied:     http.StatusForbidden,
	errcode.NotFound:             http.StatusNotFound,
	errcode.MethodNotAllowed:     http.StatusMethodNotAllowed,
	errcode.RequestTimeout:       http.StatusRequestTimeout,
	errcode.PayloadTooLarge:      http.StatusRequestEntityTooLarge,
	errcode.UnsupportedMediaType: http.StatusUnsupportedMediaType,
	errcode.QuotaExceeded:        http.StatusTooManyRequests,
	errcode.RateLimited:          http.StatusTooManyRequests,
	errcode.Draining:             http.StatusServiceUnavailable,
	errcode.Unavailable:          http.StatusServiceUnavailable,
	errcode.Overloaded:           http.StatusServiceUnavailable,
	errcode.Internal:             http.StatusInternalServerError,
	errcode.Conflict:             http.StatusConflict,
	errcode.LastAdministrator:    http.StatusConflict,
	errcode.SelfDisable:          http.StatusConflict,
	errcode.InvalidParameter:     http.StatusBadRequest,
	errcode.IdentityExists:       http.StatusConflict,
	errcode.GenerationStale:      http.StatusConflict,
	errcode.EnrollmentInvalid:    http.StatusUnauthorized,
	errcode.EnrollmentSpent:      http.StatusConflict,
	errcode.EnrollmentSuperseded: http.StatusConflict,
	errcode.NodeRetired:          http.StatusGone,
	errcode.RevealSpent:          http.StatusGone,
	errcode.RevealExpired:        http.StatusGone,
	errcode.NodeNotReady:         http.StatusConflict,
	errcode.SessionInvalid:       http.StatusUnauthorized,
	errcode.Fenced:               http.StatusConflict,
	errcode.UnknownOperation:     http.StatusNotFound,
	errcode.NotThisNode:          http.StatusForbidden,
	errcode.OperationConflict:    http.StatusConflict,
	errcode.RequestConflict:      http.StatusConflict,
	errcode.KindNotServed:        http.StatusNotImplemented,
	errcode.OutcomeUnknown:       http.StatusConflict,

	// Capabilities and diagnostics (DECISIONS.md §45, §46).
	errcode.CapabilityMissing:     http.StatusConflict,
	errcode.DestinationNotAllowed: http.StatusForbidden,
}

// titles are the short human summaries of each status family.
func titleOf(code errcode.Code, status int) string {
	switch code {
	case errcode.ValidationFailed:
		return "Validation failed"
	case errcode.InvalidJSON:
		return "Invalid JSON"
	}
	return http.StatusText(status)
}

// problem is an RFC 9457 document with the stable code and, for validation
// failures, the fields at fault.
type problem struct {
	Type      string               `json:"type"`
	Title     string               `json:"title"`
	Status    int                  `json:"status"`
	Detail    string               `json:"detail,omitempty"`
	Code      errcode.Code         `json:"code"`
	Instance  string               `json:"instance,omitempty"`
	RequestID string               `json:"request_id,omitempty"`
	Errors    []errcode.FieldError `json:"errors,omitempty"`
	// Capability names what a capability_missing node lacks.
	Capability string `json:"capability,omitempty"`
}

// resolve is the one mapping from an error to what a caller is told, for
// the API and the console alike: the coded error and its HTTP status. An
// error without a code is an internal error: the caller sees "internal
// error" and the request id, the log gets the whole chain. A code missing
// from statusOf is a bug, answered and logged as a 500.
func resolve(r *http.Request, err error) (int, *errcode.Error) {
	var e *errcode.Error
	switch {
	case errors.As(err, &e):
	case r.Context().Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		// The client went away mid-request: its transaction rolled back and
		// nobody reads this answer. Not a fault of the server.
		logger(r).Debug("client went away", "err", err.Error())
		e = errcode.New(errcode.Unavailable, "request cancelled by the client")
	case errcode.IsUnavailable(err):
		// The database is down, restarting or out of space: a condition the
		// client retries (with its Idempotency-Key, a retry of a write whose
		// commit was cut off is answered from the first), not a bug.
		logger(r).Warn("database unavailable", "err", err.Error())
		e = errcode.New(errcode.Unavailable, "the database is unavailable; retry later")
	default:
		logger(r).Error("internal error", "err", err.Error())
		e = errcode.New(errcode.Internal, "internal error")
	}
	status, ok := statusOf[e.Code]
	if !ok {
		logger(r).Error("error code has no HTTP status", "code", string(e.Code), "err", err.Error())
		return http.StatusInternalServerError, errcode.New(errcode.Internal, "internal error")
	}
	return status, e
}

// statusFor is the HTTP status of err (see resolve), for console pages that
// render their own view of an expected error.
func statusFor(r *http.Request, err error) int {
	status, _ := resolve(r, err)
	return status
}

// setRetryAfter tells a client refused with 503 when to come back, unless
// the handler already said.
func setRetryAfter(w http.ResponseWriter, status int) {
	if status == http.StatusServiceUnavailable && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", "5")
	}
}

// writeError answers err as problem+json (see resolve).
func writeError(w http.ResponseWriter, r *http.Request, err error) {
	status, e := resolve(r, err)
	setRetryAfter(w, status)
	closeAfterTimeout(w, r, status)
	writeProblem(w, r, status, e)
}

func writeProblem(w http.ResponseWriter, r *http.Request, status int, e *errcode.Error) {
	p := problem{
		Type:   "https://nodeward.dev/problems/" + string(e.Code),
		Title:  titleOf(e.Code, status),
		Status: status,
		Detail: e.Message,
		Code:   e.Code,
		// Like the log, the problem never repeats a reveal handle: answers
		// get logged by clients too.
		Instance:  clip(loggedPath(r.URL.Path), maxLoggedText),
		RequestID: requestIDFrom(r.Context()),
		Errors:    e.Fields,
		// Only capability_missing carries it.
		Capability: e.Capability,
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(p)
}

// writeJSON answers v as JSON with the given status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	if err := writeJSONChecked(w, status, v); err != nil {
		slog.Debug("write response", "err", err)
	}
}

// writeJSONChecked answers v as JSON and reports whether it reached the
// connection (flushed), for answers whose loss must be undone. The body
// is encoded first and sent with its length: a flushed answer of unknown
// length goes out chunked, and its closing chunk then costs the
// connection a second write once the handler returns.
func writeJSONChecked(w http.ResponseWriter, status int, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		return err
	}
	return writeBodyChecked(w, status, body)
}

// writeBodyChecked is writeJSONChecked for a body already encoded.
func writeBodyChecked(w http.ResponseWriter, status int, body []byte) error {
	body = append(body, '\n')
	h := w.Header()
	h["Content-Type"] = hdrJSON
	h["Cache-Control"] = hdrNoStore
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	if _, err := w.Write(body); err != nil {
		return err
	}
	return http.NewResponseController(w).Flush()
}
