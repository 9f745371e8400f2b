package handlers

import (
	"errors"
	"net/http"
	"net/url"

	"github.com/go-chi/chi/v5"

	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/views"
)

func tokenRows(rows []auth.APIToken) []views.TokenRow {
	out := make([]views.TokenRow, 0, len(rows))
	for _, t := range rows {
		out = append(out, views.TokenRow{ID: t.ID, Name: t.Name, Owner: t.Username, CreatedAt: t.CreatedAt, LastUsedAt: t.LastUsedAt, RevokedAt: t.RevokedAt})
	}
	return out
}

func (h *handler) consoleTokens(w http.ResponseWriter, r *http.Request) {
	rows, err := h.Auth.ListTokens(r.Context(), nil, 0)
	if err != nil {
		h.consoleInternal(w, r, err)
		return
	}
	s := h.shell(r, views.NavTokens)
	// After a revoke, name the token that was revoked (looked up, never
	// echoed from the query string).
	if id := r.URL.Query().Get("revoked"); id != "" {
		for _, t := range rows {
			if t.ID == id && t.RevokedAt != nil {
				s.Flash = views.Flash{Kind: views.FlashOK, Message: "Revoked the token “" + t.Name + "”."}
			}
		}
	}
	if id := r.URL.Query().Get("replayed"); id != "" {
		for _, t := range rows {
			if t.ID == id {
				s.Flash = views.Flash{Kind: views.FlashInfo, Message: "That form was sent already: the token “" + t.Name +
					"” was shown then and is not shown again. If it was lost, revoke it and create another."}
			}
		}
	}
	h.render(w, r, http.StatusOK, views.TokensPage(s, views.TokensView{Tokens: tokenRows(rows), RequestID: newRequestID()}))
}

func (h *handler) consoleCreateToken(w http.ResponseWriter, r *http.Request) {
	p, _ := principalFrom(r.Context())
	name := r.PostForm.Get("name")
	if !displayable(name) {
		h.refuseTokenName(w, r, name)
		return
	}
	tok, row, replayed, err := h.Auth.CreateTokenOnce(r.Context(), p, name, formRequestID(r), r.RemoteAddr)
	if err == nil && replayed {
		http.Redirect(w, r, "/console/tokens?replayed="+url.QueryEscape(row.ID), http.StatusSeeOther)
		return
	}
	var ce *errcode.Error
	if errors.As(err, &ce) && ce.Code == errcode.ValidationFailed {
		rows, lerr := h.Auth.ListTokens(r.Context(), nil, 0)
		if lerr != nil {
			h.consoleInternal(w, r, lerr)
			return
		}
		v := views.TokensView{Tokens: tokenRows(rows), Name: name, NameError: "A name of 1 to 128 characters is required.",
			RequestID: formRequestID(r)}
		h.render(w, r, statusFor(r, err), views.TokensPage(h.shell(r, views.NavTokens), v))
		return
	}
	if err != nil {
		h.consoleInternal(w, r, err)
		return
	}
	h.render(w, r, http.StatusOK, views.TokenCreatedPage(h.shell(r, views.NavTokens),
		views.TokenCreatedView{ID: row.ID, Name: row.Name, Token: tok}))
}

func (h *handler) consoleRevokeToken(w http.ResponseWriter, r *http.Request) {
	p, _ := principalFrom(r.Context())
	id := chi.URLParam(r, "id")
	_, err := h.Auth.RevokeToken(r.Context(), p, id, r.RemoteAddr)
	if errors.Is(err, auth.ErrTokenNotFound) {
		h.consoleError(w, r, consoleFrom(r.Context()), statusFor(r, err), "No such token", "That API token does not exist.")
		return
	}
	if err != nil {
		h.consoleInternal(w, r, err)
		return
	}
	http.Redirect(w, r, "/console/tokens?revoked="+url.QueryEscape(id), http.StatusSeeOther)
}

// consoleAuditPageSize is how many audit entries one console page shows.
const consoleAuditPageSize = 50

func (h *handler) consoleAudit(w http.ResponseWriter, r *http.Request) {
	var before int64
	if s := r.URL.Query().Get("before"); s != "" {
		n, err := parseCursor(s)
		if err != nil {
			h.consoleError(w, r, consoleFrom(r.Context()), http.StatusBadRequest, "Bad page link", "The audit page cursor is not valid.")
			return
		}
		before = n
	}
	rows, err := h.Auth.AuditPage(r.Context(), before, consoleAuditPageSize)
	if err != nil {
		h.consoleInternal(w, r, err)
		return
	}
	v := views.AuditView{Paged: before > 0, Entries: make([]views.AuditRow, 0, len(rows))}
	for _, a := range rows {
		v.Entries = append(v.Entries, views.AuditRow{
			ID: a.ID, At: a.At, Actor: a.Actor, Action: a.Action, Target: a.Target,
			Outcome: a.Outcome, Remote: a.RemoteAddr, Detail: a.Detail, Count: a.Count,
		})
	}
	if len(rows) == consoleAuditPageSize {
		v.OlderBefore = rows[len(rows)-1].ID
	}
	h.render(w, r, http.StatusOK, views.AuditPage(h.shell(r, views.NavAudit), v))
}

// refuseTokenName shows the tokens page again, 422, for a name the console
// could not show faithfully (see displayable).
func (h *handler) refuseTokenName(w http.ResponseWriter, r *http.Request, name string) {
	rows, err := h.Auth.ListTokens(r.Context(), nil, 0)
	if err != nil {
		h.consoleInternal(w, r, err)
		return
	}
	v := views.TokensView{Tokens: tokenRows(rows), Name: name, RequestID: formRequestID(r),
		NameError: "A name may not hold control characters, bidirectional formatting characters or invalid UTF-8."}
	h.render(w, r, http.StatusUnprocessableEntity, views.TokensPage(h.shell(r, views.NavTokens), v))
}
