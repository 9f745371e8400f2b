package handlers

import (
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/errcode"
)

type tokenView struct {
	ID         string     `json:"id"`
	Name       string     `json:"name"`
	UserID     string     `json:"user_id"`
	CreatedAt  time.Time  `json:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
	RevokedAt  *time.Time `json:"revoked_at"`
}

func viewToken(t auth.APIToken) tokenView {
	return tokenView{ID: t.ID, Name: t.Name, UserID: t.UserID, CreatedAt: t.CreatedAt, LastUsedAt: t.LastUsedAt, RevokedAt: t.RevokedAt}
}

func (h *handler) whoami(w http.ResponseWriter, r *http.Request) {
	p, _ := principalFrom(r.Context())
	writeJSON(w, http.StatusOK, map[string]string{"user_id": p.UserID, "username": p.Username, "via": p.Via})
}

func (h *handler) createToken(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Name string `json:"name"`
	}
	if err := decodeJSON(r, &body, false); err != nil {
		writeError(w, r, err)
		return
	}
	var v errcode.Validation
	checkDisplayable(&v, "name", body.Name)
	if err := v.Err(); err != nil {
		writeError(w, r, err)
		return
	}
	p, _ := principalFrom(r.Context())
	tok, row, err := h.Auth.CreateToken(r.Context(), p, body.Name, r.RemoteAddr)
	if err != nil {
		writeError(w, r, err)
		return
	}
	type created struct {
		tokenView
		Token string `json:"token"`
	}
	writeJSON(w, http.StatusCreated, created{tokenView: viewToken(row), Token: tok})
}

func (h *handler) listTokens(w http.ResponseWriter, r *http.Request) {
	page, err := keyPageParams(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	rows, err := h.Auth.ListTokens(r.Context(), page.key(), page.limit)
	if err != nil {
		writeError(w, r, err)
		return
	}
	out := make([]tokenView, 0, len(rows))
	var next *string
	for _, t := range rows {
		out = append(out, viewToken(t))
		next = page.next(len(rows), t.CreatedAt, t.ID)
	}
	writeJSON(w, http.StatusOK, map[string]any{"tokens": out, "next_before": next})
}

func (h *handler) revokeToken(w http.ResponseWriter, r *http.Request) {
	if err := decodeJSON(r, &struct{}{}, true); err != nil {
		writeError(w, r, err)
		return
	}
	p, _ := principalFrom(r.Context())
	row, err := h.Auth.RevokeToken(r.Context(), p, chi.URLParam(r, "id"), r.RemoteAddr)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewToken(row))
}

type auditView struct {
	ID         int64     `json:"id"`
	At         time.Time `json:"at"`
	Actor      string    `json:"actor"`
	Action     string    `json:"action"`
	Target     string    `json:"target"`
	Outcome    string    `json:"outcome"`
	RemoteAddr string    `json:"remote_addr"`
	Detail     string    `json:"detail"`
	// Count and LastAt describe a coalesced entry (repeated refused
	// sign-ins of one client): how many, and when the latest was.
	Count  int64      `json:"count"`
	LastAt *time.Time `json:"last_at"`
}

func (h *handler) adminAudit(w http.ResponseWriter, r *http.Request) {
	limit, before, err := pageParams(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	rows, err := h.Auth.AuditPage(r.Context(), before, limit)
	if err != nil {
		writeError(w, r, err)
		return
	}
	out := make([]auditView, 0, len(rows))
	for _, a := range rows {
		out = append(out, auditView{ID: a.ID, At: a.At, Actor: a.Actor, Action: a.Action, Target: a.Target,
			Outcome: a.Outcome, RemoteAddr: a.RemoteAddr, Detail: a.Detail, Count: a.Count, LastAt: a.LastAt})
	}
	var next *string
	if len(rows) == limit {
		s := strconv.FormatInt(rows[len(rows)-1].ID, 10)
		next = &s
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": out, "next_before": next})
}

// pageParams reads limit (1-500, default 100) and an integer `before` cursor.
// keyPage is a page of a listing ordered by (time, id): its size, and the
// key it starts below when paged.
type keyPage struct {
	limit int
	at    time.Time
	id    string
	paged bool
}

// keyPageParams reads a keyed listing's limit and before cursor.
func keyPageParams(r *http.Request) (keyPage, error) {
	limit, err := queryLimit(r, 100, 500)
	if err != nil {
		return keyPage{}, err
	}
	at, id, paged, err := queryOf(r).keyCursor("before")
	return keyPage{limit: limit, at: at, id: id, paged: paged}, err
}

// key is the page's place as the administrators' listings take it (nil:
// from the newest).
func (p keyPage) key() *auth.PageKey {
	if !p.paged {
		return nil
	}
	return &auth.PageKey{CreatedAt: p.at, ID: p.id}
}

// next answers the next page's cursor after a page of n rows whose last is
// keyed (at, id): nil when the page was not full (the last).
func (p keyPage) next(n int, at time.Time, id string) *string {
	if n < p.limit {
		return nil
	}
	c := encodeKeyCursor(at, id)
	return &c
}

func pageParams(r *http.Request) (int, int64, error) {
	limit, err := queryLimit(r, 100, 500)
	if err != nil {
		return 0, 0, err
	}
	before, err := queryOf(r).cursor("before", "a cursor from next_before")
	if err != nil {
		return 0, 0, err
	}
	return limit, before, nil
}
