package handlers

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/secrets"
)

type sealBody struct {
	RequestID  string         `json:"request_id"`
	Target     secrets.Target `json:"target"`
	Field      string         `json:"field"`
	Value      string         `json:"value"`
	TTLSeconds *int64         `json:"ttl_seconds"`
}

// sealPrincipal is the caller as the secrets know it: the ledger's
// principal, so a handle is used by exactly who sealed it.
func sealPrincipal(r *http.Request) secrets.Principal {
	p := ledgerPrincipal(r)
	return secrets.Principal{Kind: string(p.Kind), ID: p.ID}
}

func (h *handler) sealSecret(w http.ResponseWriter, r *http.Request) {
	var body sealBody
	if err := decodeJSON(r, &body, false); err != nil {
		writeError(w, r, err)
		return
	}
	var ttl time.Duration
	if body.TTLSeconds != nil {
		n := *body.TTLSeconds
		if n < 1 || n > int64(secrets.MaxTTL/time.Second) {
			var v errcode.Validation
			v.Add("ttl_seconds", "1 to %d", int64(secrets.MaxTTL/time.Second))
			writeError(w, r, v.Err())
			return
		}
		ttl = time.Duration(n) * time.Second
	}
	rc, err := h.Secrets.Seal(r.Context(), sealPrincipal(r), secrets.SealRequest{RequestID: body.RequestID,
		Target: body.Target, Field: body.Field, Value: body.Value, TTL: ttl})
	if err != nil {
		if errcode.Of(err) == errcode.QuotaExceeded {
			// Live handles free up as they are used or expire.
			w.Header().Set("Retry-After", "60")
		}
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"handle": rc.Handle, "expires_at": rc.ExpiresAt})
}

type secretAuditView struct {
	Cursor       string       `json:"cursor"`
	At           time.Time    `json:"at"`
	Action       string       `json:"action"`
	Outcome      string       `json:"outcome"`
	Principal    principalRef `json:"principal"`
	HandleDigest string       `json:"handle_digest"`
	RequestID    string       `json:"request_id"`
	OperationID  *string      `json:"operation_id"`
	// Target is null for a reveal: it names its operation instead.
	Target *secrets.Target `json:"target"`
	Field  string          `json:"field"`
}

type principalRef struct {
	Kind string `json:"kind"`
	ID   string `json:"id"`
}

// secretAuditFilterParams are the secret audit's filters and the
// AuditFilter field each sets.
var secretAuditFilterParams = []struct {
	name string
	set  func(*secrets.AuditFilter, string) error
}{
	{"principal_kind", func(f *secrets.AuditFilter, s string) error {
		if s != string(ledger.PrincipalAdmin) && s != string(ledger.PrincipalPackageHost) {
			return fmt.Errorf("one of %s, %s", ledger.PrincipalAdmin, ledger.PrincipalPackageHost)
		}
		f.PrincipalKind = s
		return nil
	}},
	{"principal_id", func(f *secrets.AuditFilter, s string) error { f.PrincipalID = s; return nil }},
	{"operation_id", func(f *secrets.AuditFilter, s string) error { f.OperationID = s; return nil }},
	{"target_kind", func(f *secrets.AuditFilter, s string) error {
		if !slices.Contains(ledger.TargetKinds, s) {
			return fmt.Errorf("one of %s", strings.Join(ledger.TargetKinds, ", "))
		}
		f.TargetKind = s
		return nil
	}},
	{"target_id", func(f *secrets.AuditFilter, s string) error { f.TargetID = s; return nil }},
	{"action", func(f *secrets.AuditFilter, s string) error {
		if !slices.Contains(secrets.AuditActions, s) {
			return fmt.Errorf("one of %s", strings.Join(secrets.AuditActions, ", "))
		}
		f.Action = s
		return nil
	}},
	{"outcome", func(f *secrets.AuditFilter, s string) error {
		if !slices.Contains(secrets.AuditOutcomes, s) {
			return fmt.Errorf("one of %s", strings.Join(secrets.AuditOutcomes, ", "))
		}
		f.Outcome = s
		return nil
	}},
}

// secretAuditFilterNames are the secret audit's filter parameters.
func secretAuditFilterNames() []string {
	out := make([]string, len(secretAuditFilterParams))
	for i, p := range secretAuditFilterParams {
		out[i] = p.name
	}
	return out
}

// secretAuditFilterOf reads the secret audit's filters, cursor and limit
// from a query: the API's and the console's one reading of them.
func secretAuditFilterOf(q query) (secrets.AuditFilter, error) {
	var f secrets.AuditFilter
	for _, p := range secretAuditFilterParams {
		s, err := q.get(p.name)
		if err != nil {
			return f, err
		}
		if s == "" {
			continue
		}
		if len(s) > 256 {
			return f, invalidParameter(p.name, "at most 256 bytes")
		}
		if err := p.set(&f, s); err != nil {
			return f, invalidParameter(p.name, "%s", err.Error())
		}
	}
	before, err := q.cursor("before", "a cursor from next_before")
	if err != nil {
		return f, err
	}
	f.Before = before
	f.Limit = 100
	n, ok, err := q.number("limit", 1, 500, "an integer from 1 to %d", 500)
	if err != nil {
		return f, err
	}
	if ok {
		f.Limit = int(n)
	}
	return f, nil
}

func (h *handler) secretAudit(w http.ResponseWriter, r *http.Request) {
	f, err := secretAuditFilterOf(queryOf(r))
	if err != nil {
		writeError(w, r, err)
		return
	}
	limit := f.Limit
	rows, err := h.Secrets.Audit(r.Context(), f)
	if err != nil {
		writeError(w, r, err)
		return
	}
	out := make([]secretAuditView, 0, len(rows))
	for _, a := range rows {
		out = append(out, secretAuditView{Cursor: strconv.FormatInt(a.Cursor, 10), At: a.At, Action: a.Action, Outcome: a.Outcome,
			Principal: principalRef{Kind: a.Principal.Kind, ID: a.Principal.ID}, HandleDigest: a.HandleDigest,
			RequestID: a.RequestID, OperationID: optional(a.OperationID), Field: a.Field})
		if a.Target.Kind != "" {
			t := a.Target
			out[len(out)-1].Target = &t
		}
	}
	var next *string
	if len(rows) == limit {
		s := strconv.FormatInt(rows[len(rows)-1].Cursor, 10)
		next = &s
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": out, "next_before": next})
}
