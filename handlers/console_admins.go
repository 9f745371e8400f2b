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

func (h *handler) consoleAdminRoutes(r chi.Router) {
	r.Get("/console/admins", h.consoleAdmins)
	r.Post("/console/admins", h.consoleAddAdmin)
	for _, action := range []string{"disable", "enable", "sign-out"} {
		r.Post("/console/admins/{username}/"+action, h.consoleAdminAction(action))
	}
	r.Get("/console/account", h.consoleAccount)
	r.Post("/console/account/password", h.consoleChangePassword)
	r.Post("/console/account/sign-out-others", h.consoleSignOutOthers)
}

// adminRows lists every administrator for the page.
func (h *handler) adminRows(r *http.Request) ([]views.AdminRow, error) {
	users, err := h.Auth.ListAdmins(r.Context(), nil, 0)
	if err != nil {
		return nil, err
	}
	me := consoleFrom(r.Context()).principal.UserID
	out := make([]views.AdminRow, 0, len(users))
	for _, u := range users {
		out = append(out, views.AdminRow{Username: u.Username, CreatedAt: u.CreatedAt, DisabledAt: u.DisabledAt,
			PasswordChangedAt: u.PasswordChangedAt, LiveSessions: u.LiveSessions, Self: u.ID == me})
	}
	return out, nil
}

// adminDone is the flash after an action, keyed by the query parameter the
// action redirects with; it names the administrator only when the list
// shows the action took (the name is looked up, never echoed).
var adminDone = map[string]func(views.AdminRow) string{
	"added":      func(a views.AdminRow) string { return "Added the administrator " + a.Username + "." },
	"disabled":   disabledFlash,
	"enabled":    enabledFlash,
	"signed_out": func(a views.AdminRow) string { return "Ended every console session of " + a.Username + "." },
}

func disabledFlash(a views.AdminRow) string {
	if a.DisabledAt == nil {
		return ""
	}
	return "Disabled " + a.Username + ": their console sessions ended and their API tokens are refused."
}

func enabledFlash(a views.AdminRow) string {
	if a.DisabledAt != nil {
		return ""
	}
	return "Enabled " + a.Username + " again."
}

func (h *handler) consoleAdmins(w http.ResponseWriter, r *http.Request) {
	rows, err := h.adminRows(r)
	if err != nil {
		h.consoleInternal(w, r, err)
		return
	}
	s := h.shell(r, views.NavAdmins)
	for key, say := range adminDone {
		name := r.URL.Query().Get(key)
		for _, a := range rows {
			if name != "" && a.Username == name {
				if msg := say(a); msg != "" {
					s.Flash = views.Flash{Kind: views.FlashOK, Message: msg}
				}
			}
		}
	}
	h.render(w, r, http.StatusOK, views.AdminsPage(s, views.AdminsView{Admins: rows, MinPasswordLen: auth.MinPasswordLen}))
}

func (h *handler) consoleAddAdmin(w http.ResponseWriter, r *http.Request) {
	p, _ := principalFrom(r.Context())
	username := r.PostForm.Get("username")
	_, err := h.Auth.AddAdmin(r.Context(), p, username, r.PostForm.Get("password"), r.RemoteAddr)
	if err == nil {
		http.Redirect(w, r, "/console/admins?added="+url.QueryEscape(username), http.StatusSeeOther)
		return
	}
	v := views.AdminsView{MinPasswordLen: auth.MinPasswordLen, FieldErrors: map[string]string{}}
	if displayable(username) {
		v.Username = username
	}
	var ce *errcode.Error
	switch {
	case errors.As(err, &ce) && ce.Code == errcode.ValidationFailed:
		for _, f := range ce.Fields {
			v.FieldErrors[f.Field] = sentence(f.Message)
		}
	case errors.Is(err, auth.ErrUsernameTaken):
		v.FieldErrors["username"] = "An administrator with that username exists."
	case errors.Is(err, auth.ErrOverloaded):
		h.consoleError(w, r, consoleFrom(r.Context()), statusFor(r, err), "Busy", "Too many passwords are being checked right now; try again in a moment.")
		return
	default:
		h.consoleInternal(w, r, err)
		return
	}
	rows, lerr := h.adminRows(r)
	if lerr != nil {
		h.consoleInternal(w, r, lerr)
		return
	}
	v.Admins = rows
	s := h.shell(r, views.NavAdmins)
	s.Flash = views.Flash{Kind: views.FlashError, Message: "The administrator was not added: correct the fields below."}
	h.render(w, r, statusFor(r, err), views.AdminsPage(s, v))
}

// consoleAdminAction disables, enables or signs out an administrator.
func (h *handler) consoleAdminAction(action string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		h.adminAction(w, r, action)
	}
}

func (h *handler) adminAction(w http.ResponseWriter, r *http.Request, action string) {
	p, _ := principalFrom(r.Context())
	username := chi.URLParam(r, "username")
	var (
		err  error
		done string
	)
	switch action {
	case "disable":
		_, _, err = h.Auth.DisableAdmin(r.Context(), p, username, r.RemoteAddr)
		done = "disabled"
	case "enable":
		_, err = h.Auth.EnableAdmin(r.Context(), p, username, r.RemoteAddr)
		done = "enabled"
	default:
		_, _, err = h.Auth.SignOutAdmin(r.Context(), p, username, r.RemoteAddr)
		done = "signed_out"
	}
	switch {
	case err == nil:
		http.Redirect(w, r, "/console/admins?"+done+"="+url.QueryEscape(username), http.StatusSeeOther)
	case errors.Is(err, auth.ErrAdminNotFound):
		h.consoleError(w, r, consoleFrom(r.Context()), statusFor(r, err), "No such administrator", "That administrator does not exist.")
	case errors.Is(err, auth.ErrSelfDisable), errors.Is(err, auth.ErrLastAdministrator):
		rows, lerr := h.adminRows(r)
		if lerr != nil {
			h.consoleInternal(w, r, lerr)
			return
		}
		s := h.shell(r, views.NavAdmins)
		s.Flash = views.Flash{Kind: views.FlashError, Message: sentence(err.Error())}
		h.render(w, r, statusFor(r, err), views.AdminsPage(s, views.AdminsView{Admins: rows, MinPasswordLen: auth.MinPasswordLen}))
	default:
		h.consoleInternal(w, r, err)
	}
}

// accountView is the signed-in administrator's page as it stands.
func (h *handler) accountView(r *http.Request) (views.AccountView, error) {
	rows, err := h.adminRows(r)
	if err != nil {
		return views.AccountView{}, err
	}
	v := views.AccountView{MinPasswordLen: auth.MinPasswordLen}
	for _, a := range rows {
		if a.Self {
			v.Username, v.CreatedAt, v.PasswordChangedAt = a.Username, a.CreatedAt, a.PasswordChangedAt
			v.OtherSessions = max(a.LiveSessions-1, 0) // less this one
		}
	}
	return v, nil
}

func (h *handler) consoleAccount(w http.ResponseWriter, r *http.Request) {
	v, err := h.accountView(r)
	if err != nil {
		h.consoleInternal(w, r, err)
		return
	}
	s := h.shell(r, views.NavAccount)
	switch r.URL.Query().Get("done") {
	case "password":
		s.Flash = views.Flash{Kind: views.FlashOK, Message: "Your password is changed. Every other console session of yours has ended, and this browser has a new one."}
	case "signed_out":
		s.Flash = views.Flash{Kind: views.FlashOK, Message: "Your other console sessions have ended."}
	}
	h.render(w, r, http.StatusOK, views.AccountPage(s, v))
}

func (h *handler) consoleChangePassword(w http.ResponseWriter, r *http.Request) {
	p, _ := principalFrom(r.Context())
	current, next := r.PostForm.Get("current_password"), r.PostForm.Get("new_password")
	var err error
	if next != r.PostForm.Get("confirm_password") {
		var v errcode.Validation
		v.Add("confirm_password", "does not match the new password")
		err = v.Err()
	} else {
		_, err = h.Auth.ChangePassword(r.Context(), p, current, next, r.RemoteAddr)
	}
	if err == nil {
		// Every session ended, this one too: this browser carries on with
		// a fresh one.
		tok, expires, err := h.Auth.SessionAfterPasswordChange(r.Context(), p, r.RemoteAddr)
		if errors.Is(err, auth.ErrUnauthenticated) {
			h.clearSessionCookie(w)
			http.Redirect(w, r, "/console/login", http.StatusSeeOther)
			return
		}
		if err != nil {
			h.consoleInternal(w, r, err)
			return
		}
		h.setSessionCookie(w, tok, expires)
		http.Redirect(w, r, "/console/account?done=password", http.StatusSeeOther)
		return
	}
	v, verr := h.accountView(r)
	if verr != nil {
		h.consoleInternal(w, r, verr)
		return
	}
	s := h.shell(r, views.NavAccount)
	var ce *errcode.Error
	switch {
	case errors.As(err, &ce) && ce.Code == errcode.ValidationFailed:
		v.FieldErrors = map[string]string{}
		for _, f := range ce.Fields {
			v.FieldErrors[f.Field] = sentence(f.Message)
		}
		if v.FieldErrors["current_password"] == sentence(auth.MsgNotCurrentPassword) {
			v.FieldErrors["current_password"] = "That is not your current password."
		}
		s.Flash = views.Flash{Kind: views.FlashError, Message: "Your password was not changed: correct the fields below."}
	case errors.Is(err, auth.ErrRateLimited):
		s.Flash = views.Flash{Kind: views.FlashError, Message: "Too many wrong passwords: try again later."}
	case errors.Is(err, auth.ErrOverloaded):
		s.Flash = views.Flash{Kind: views.FlashError, Message: "Too many passwords are being checked right now; try again in a moment."}
	default:
		h.consoleInternal(w, r, err)
		return
	}
	h.render(w, r, statusFor(r, err), views.AccountPage(s, v))
}

func (h *handler) consoleSignOutOthers(w http.ResponseWriter, r *http.Request) {
	p, _ := principalFrom(r.Context())
	if _, _, err := h.Auth.SignOutAdmin(r.Context(), p, p.Username, r.RemoteAddr); err != nil {
		h.consoleInternal(w, r, err)
		return
	}
	http.Redirect(w, r, "/console/account?done=signed_out", http.StatusSeeOther)
}

// sentence makes a domain message a sentence for a page: capitalised,
// ending in a full stop.
func sentence(msg string) string {
	if msg == "" {
		return msg
	}
	if c := msg[0]; c >= 'a' && c <= 'z' {
		msg = string(c-'a'+'A') + msg[1:]
	}
	if msg[len(msg)-1] != '.' {
		msg += "."
	}
	return msg
}
