package handlers

import (
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/nodeward/nodeward/auth"
)

type adminView struct {
	ID                string     `json:"id"`
	Username          string     `json:"username"`
	CreatedAt         time.Time  `json:"created_at"`
	DisabledAt        *time.Time `json:"disabled_at"`
	PasswordChangedAt *time.Time `json:"password_changed_at"`
}

func viewAdmin(u auth.User) adminView {
	return adminView{ID: u.ID, Username: u.Username, CreatedAt: u.CreatedAt, DisabledAt: u.DisabledAt,
		PasswordChangedAt: u.PasswordChangedAt}
}

// adminSessionsView answers a change that ended console sessions.
type adminSessionsView struct {
	adminView
	SessionsEnded int64 `json:"sessions_ended"`
}

func (h *handler) listAdmins(w http.ResponseWriter, r *http.Request) {
	page, err := keyPageParams(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	rows, err := h.Auth.ListAdmins(r.Context(), page.key(), page.limit)
	if err != nil {
		writeError(w, r, err)
		return
	}
	type listed struct {
		adminView
		LiveSessions int64 `json:"live_sessions"`
	}
	out := make([]listed, 0, len(rows))
	var next *string
	for _, u := range rows {
		out = append(out, listed{adminView: viewAdmin(u), LiveSessions: u.LiveSessions})
		next = page.next(len(rows), u.CreatedAt, u.ID)
	}
	writeJSON(w, http.StatusOK, map[string]any{"admins": out, "next_before": next})
}

func (h *handler) createAdmin(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Username string `json:"username"`
		Password string `json:"password"`
	}
	if err := decodeJSON(r, &body, false); err != nil {
		writeError(w, r, err)
		return
	}
	p, _ := principalFrom(r.Context())
	u, err := h.Auth.AddAdmin(r.Context(), p, body.Username, body.Password, r.RemoteAddr)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, viewAdmin(u))
}

func (h *handler) getAdmin(w http.ResponseWriter, r *http.Request) {
	u, err := h.Auth.Admin(r.Context(), chi.URLParam(r, "username"))
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewAdmin(u))
}

func (h *handler) disableAdmin(w http.ResponseWriter, r *http.Request) {
	if err := decodeJSON(r, &struct{}{}, true); err != nil {
		writeError(w, r, err)
		return
	}
	p, _ := principalFrom(r.Context())
	u, ended, err := h.Auth.DisableAdmin(r.Context(), p, chi.URLParam(r, "username"), r.RemoteAddr)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, adminSessionsView{adminView: viewAdmin(u), SessionsEnded: ended})
}

func (h *handler) enableAdmin(w http.ResponseWriter, r *http.Request) {
	if err := decodeJSON(r, &struct{}{}, true); err != nil {
		writeError(w, r, err)
		return
	}
	p, _ := principalFrom(r.Context())
	u, err := h.Auth.EnableAdmin(r.Context(), p, chi.URLParam(r, "username"), r.RemoteAddr)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewAdmin(u))
}

func (h *handler) signOutAdmin(w http.ResponseWriter, r *http.Request) {
	if err := decodeJSON(r, &struct{}{}, true); err != nil {
		writeError(w, r, err)
		return
	}
	p, _ := principalFrom(r.Context())
	u, ended, err := h.Auth.SignOutAdmin(r.Context(), p, chi.URLParam(r, "username"), r.RemoteAddr)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, adminSessionsView{adminView: viewAdmin(u), SessionsEnded: ended})
}

func (h *handler) changePassword(w http.ResponseWriter, r *http.Request) {
	var body struct {
		CurrentPassword string `json:"current_password"`
		NewPassword     string `json:"new_password"`
	}
	if err := decodeJSON(r, &body, false); err != nil {
		writeError(w, r, err)
		return
	}
	p, _ := principalFrom(r.Context())
	ended, err := h.Auth.ChangePassword(r.Context(), p, body.CurrentPassword, body.NewPassword, r.RemoteAddr)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"username": p.Username, "sessions_ended": ended})
}
