// Package errcode is Nodeward's one error vocabulary: every refusal the
// product makes carries a stable machine code that scripts and agents match
// on. Domain packages return *Error values (usually through their sentinel
// errors, wrapped with %w); the HTTP edge maps a code to a status in one
// table. Anything that is not an *Error is an internal error.
package errcode

import (
	"errors"
	"fmt"
)

// Code is a stable machine code, the `code` member of a problem document.
type Code string

// Platform codes (DECISIONS.md §18).
const (
	InvalidJSON          Code = "invalid_json"
	InvalidParameter     Code = "invalid_parameter"
	ValidationFailed     Code = "validation_failed"
	Unauthenticated      Code = "unauthenticated"
	PermissionDenied     Code = "permission_denied"
	NotFound             Code = "not_found"
	MethodNotAllowed     Code = "method_not_allowed"
	RequestTimeout       Code = "request_timeout" // the body did not arrive within the read timeout: a slow client, not bad JSON
	PayloadTooLarge      Code = "payload_too_large"
	UnsupportedMediaType Code = "unsupported_media_type"
	QuotaExceeded        Code = "quota_exceeded"
	RateLimited          Code = "rate_limited"
	Draining             Code = "draining"
	Unavailable          Code = "unavailable"
	Overloaded           Code = "overloaded" // work shed to protect the server (§44)
	Internal             Code = "internal"
	Conflict             Code = "conflict"
)

// Domain codes (API.md, DECISIONS.md).
const (
	IdentityExists       Code = "identity_exists"
	GenerationStale      Code = "generation_stale"
	EnrollmentInvalid    Code = "enrollment_invalid"
	EnrollmentSpent      Code = "enrollment_spent"
	EnrollmentSuperseded Code = "enrollment_superseded"
	NodeRetired          Code = "node_retired"
	NodeNotReady         Code = "node_not_ready"
	SessionInvalid       Code = "session_invalid"
	Fenced               Code = "fenced"
	UnknownOperation     Code = "unknown_operation"
	NotThisNode          Code = "not_this_node"
	OperationConflict    Code = "operation_conflict"
	OutcomeUnknown       Code = "outcome_unknown"
	RequestConflict      Code = "request_conflict"
	KindNotServed        Code = "kind_not_served"
	RevealSpent          Code = "reveal_spent"
	RevealExpired        Code = "reveal_expired"
	// CapabilityMissing: the target node's agent does not report the
	// capability the kind needs (DECISIONS.md §45); Error.Capability names it.
	CapabilityMissing Code = "capability_missing"
	// DestinationNotAllowed: a control-plane probe to a host the operator
	// did not allow (DECISIONS.md §46).
	DestinationNotAllowed Code = "destination_not_allowed"
	// LastAdministrator: disabling the only enabled administrator would
	// leave nobody able to sign in.
	LastAdministrator Code = "last_administrator"
	// SelfDisable: an administrator may not disable their own account
	// (another administrator, or the CLI, does it).
	SelfDisable Code = "self_disable"
)

// FieldError names one invalid input field (a JSON pointer or field name).
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Error is an application error: a code, a message safe to show the caller
// (it never names a secret), and for validation failures the fields at fault.
type Error struct {
	Code    Code
	Message string
	Fields  []FieldError
	// Capability names the missing agent capability of a
	// capability_missing refusal (the problem's `capability` member).
	Capability string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return string(e.Code)
	}
	return e.Message
}

// Is makes errors.Is match any *Error with the same code, so a sentinel
// matches a copy carrying a more specific message.
func (e *Error) Is(target error) bool {
	var t *Error
	if errors.As(target, &t) {
		return t.Code == e.Code
	}
	return false
}

// New returns an error with the given code and message.
func New(code Code, message string) *Error {
	return &Error{Code: code, Message: message}
}

// Errorf returns an error with the given code and a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Of returns the code of err: the code of the first *Error in its chain, or
// Internal when there is none.
func Of(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return Internal
}

// Validation collects field errors; Err returns nil when there were none.
type Validation struct {
	fields []FieldError
}

// Add records that field is invalid.
func (v *Validation) Add(field, format string, args ...any) {
	v.fields = append(v.fields, FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
}

// Check records message for field unless ok holds.
func (v *Validation) Check(ok bool, field, format string, args ...any) {
	if !ok {
		v.Add(field, format, args...)
	}
}

// Err returns a validation_failed error naming every field recorded, or nil.
func (v *Validation) Err() error {
	if len(v.fields) == 0 {
		return nil
	}
	msg := v.fields[0].Field + ": " + v.fields[0].Message
	if len(v.fields) > 1 {
		msg = fmt.Sprintf("%s (and %d more)", msg, len(v.fields)-1)
	}
	return &Error{Code: ValidationFailed, Message: msg, Fields: v.fields}
}
