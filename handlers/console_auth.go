package handlers

import (
	"errors"
	"net/http"
	"strings"

	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/views"
)

// loginFailed never says whether the username or the password was wrong.
const loginFailed = "Wrong username or password."

func (h *handler) consoleLoginForm(w http.ResponseWriter, r *http.Request) {
	next := localNext(r.URL.Query().Get("next"))
	if _, _, err := h.sessionFromCookie(r); err == nil {
		if next == "" {
			next = "/console/"
		}
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	h.render(w, r, http.StatusOK, views.LoginPage(views.LoginView{Next: next}))
}

func (h *handler) consoleLogin(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		h.consoleBadForm(w, r, consoleCtx{}, err)
		return
	}
	username := strings.TrimSpace(r.PostForm.Get("username"))
	if !plainText(username) {
		// No administrator has such a name, and PostgreSQL cannot look it
		// up (invalid UTF-8, U+0000): a failed sign-in, not a 500.
		h.render(w, r, http.StatusUnauthorized, views.LoginPage(views.LoginView{Error: loginFailed, Next: localNext(r.PostForm.Get("next"))}))
		return
	}
	next := localNext(r.PostForm.Get("next"))
	v := views.LoginView{Username: username, Next: next}
	if len(username) > auth.MaxUsernameLen {
		// Refused as any failed sign-in; not echoed back into the page.
		v.Username = ""
	}
	tok, expires, err := h.Auth.Login(r.Context(), username, r.PostForm.Get("password"), r.RemoteAddr)
	if err != nil {
		status, e := resolve(r, err)
		switch e.Code {
		case errcode.RateLimited:
			w.Header().Set("Retry-After", "900")
			v.Error = "Too many failed sign-ins. Wait a few minutes, then try again."
		case errcode.Unauthenticated:
			v.Error = loginFailed
		case errcode.Overloaded:
			v.Error = "The server is busy with other sign-ins. Try again in a few seconds."
		default:
			h.consoleInternal(w, r, err)
			return
		}
		setRetryAfter(w, status)
		h.render(w, r, status, views.LoginPage(v))
		return
	}
	h.setSessionCookie(w, tok, expires)
	if next == "" {
		next = "/console/"
	}
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (h *handler) consoleLogout(w http.ResponseWriter, r *http.Request) {
	p, _ := principalFrom(r.Context())
	if err := h.Auth.Logout(r.Context(), p, r.RemoteAddr); err != nil {
		h.consoleInternal(w, r, err)
		return
	}
	h.clearSessionCookie(w)
	http.Redirect(w, r, "/console/login", http.StatusSeeOther)
}

func (h *handler) consoleSetupForm(w http.ResponseWriter, r *http.Request) {
	has, err := h.Auth.HasAdmin(r.Context())
	if err != nil {
		h.consoleInternal(w, r, err)
		return
	}
	h.render(w, r, http.StatusOK, views.SetupPage(views.SetupView{Closed: has, MinPasswordLen: auth.MinPasswordLen}))
}

// consoleSetup creates the first administrator with the one-time setup
// token, then signs them in.
func (h *handler) consoleSetup(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		h.consoleBadForm(w, r, consoleCtx{}, err)
		return
	}
	has, err := h.Auth.HasAdmin(r.Context())
	if err != nil {
		h.consoleInternal(w, r, err)
		return
	}
	if has {
		h.render(w, r, statusFor(r, auth.ErrSetupClosed), views.SetupPage(views.SetupView{Closed: true}))
		return
	}
	username := strings.TrimSpace(r.PostForm.Get("username"))
	password := r.PostForm.Get("password")
	v := views.SetupView{Username: username, MinPasswordLen: auth.MinPasswordLen}
	_, err = h.Auth.CompleteSetup(r.Context(), r.PostForm.Get("setup_token"), username, password, r.RemoteAddr)
	var ce *errcode.Error
	switch {
	case err == nil:
	case errors.Is(err, auth.ErrSetupClosed):
		h.render(w, r, statusFor(r, err), views.SetupPage(views.SetupView{Closed: true}))
		return
	case errors.Is(err, auth.ErrUnauthenticated):
		v.Error = "The setup token is wrong or already used. Open the setup link from the server log again."
		v.FieldErrors = map[string]string{"setup_token": "Not a live setup token."}
		h.render(w, r, statusFor(r, err), views.SetupPage(v))
		return
	case errors.As(err, &ce) && ce.Code == errcode.ValidationFailed:
		v.Error = "Please correct the fields below."
		v.FieldErrors = map[string]string{}
		for _, f := range ce.Fields {
			v.FieldErrors[f.Field] = f.Message
		}
		h.render(w, r, statusFor(r, err), views.SetupPage(v))
		return
	default:
		h.consoleInternal(w, r, err)
		return
	}
	tok, expires, err := h.Auth.Login(r.Context(), username, password, r.RemoteAddr)
	if err != nil {
		// The administrator exists; signing in by hand still works.
		logger(r).Warn("sign-in after setup", "err", err.Error())
		http.Redirect(w, r, "/console/login", http.StatusSeeOther)
		return
	}
	h.setSessionCookie(w, tok, expires)
	http.Redirect(w, r, "/console/", http.StatusSeeOther)
}
