package handlers

import (
	"net/http"
	"strconv"
	"time"

	"github.com/nodeward/nodeward/errcode"
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
	Cursor       string         `json:"cursor"`
	At           time.Time      `json:"at"`
	Action       string         `json:"action"`
	Outcome      string         `json:"outcome"`
	Principal    principalRef   `json:"principal"`
	HandleDigest string         `json:"handle_digest"`
	RequestID    string         `json:"request_id"`
	OperationID  *string        `json:"operation_id"`
	Target       secrets.Target `json:"target"`
	Field        string         `json:"field"`
}

type principalRef struct {
	Kind string `json:"kind"`
	ID   string `json:"id"`
}

func (h *handler) secretAudit(w http.ResponseWriter, r *http.Request) {
	limit, before, err := pageParams(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	rows, err := h.Secrets.Audit(r.Context(), before, limit)
	if err != nil {
		writeError(w, r, err)
		return
	}
	out := make([]secretAuditView, 0, len(rows))
	for _, a := range rows {
		out = append(out, secretAuditView{Cursor: strconv.FormatInt(a.Cursor, 10), At: a.At, Action: a.Action, Outcome: a.Outcome,
			Principal: principalRef{Kind: a.Principal.Kind, ID: a.Principal.ID}, HandleDigest: a.HandleDigest,
			RequestID: a.RequestID, OperationID: optional(a.OperationID), Target: a.Target, Field: a.Field})
	}
	var next *string
	if len(rows) == limit {
		s := strconv.FormatInt(rows[len(rows)-1].Cursor, 10)
		next = &s
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": out, "next_before": next})
}
