package handlers

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/a-h/templ"
	"github.com/go-chi/chi/v5"

	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/views"
)

// consoleRoutes mounts the console. Sign-in and first-run setup are open;
// every other page needs a console session, and every state-changing form
// carries the session's CSRF token (on top of the router's cross-origin
// protection and the SameSite=Strict cookie).
func (h *handler) consoleRoutes(r chi.Router) {
	r.Get("/console", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/console/", http.StatusSeeOther)
	})
	r.Get("/console/login", h.consoleLoginForm)
	r.Post("/console/login", h.consoleLogin)
	r.Get("/console/setup", h.consoleSetupForm)
	r.Post("/console/setup", h.consoleSetup)
	// Logging out is a POST (CSRF-checked); a typed or bookmarked GET just
	// goes home rather than answering 405.
	r.Get("/console/logout", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/console/", http.StatusSeeOther)
	})

	r.Group(func(r chi.Router) {
		r.Use(h.consoleSession)
		r.Post("/console/logout", h.consoleLogout)
		r.Get("/console/", h.consoleOverview)
		r.Get("/console/tokens", h.consoleTokens)
		r.Post("/console/tokens", h.consoleCreateToken)
		r.Post("/console/tokens/{id}/revoke", h.consoleRevokeToken)
		r.With(h.consoleOnlyQuery("before")).Get("/console/audit", h.consoleAudit)
		h.consoleAdminRoutes(r)
		// Sections whose pages land with the fleet, ledger and secrets work.
		h.consoleNodeRoutes(r)
		// Operations, secret audit and package hosts.
		h.consoleOperationsRoutes(r)
	})
}

// consoleCtx is what consoleSession puts on a request's context.
type consoleCtx struct {
	principal auth.Principal
	csrf      string
}

type consoleCtxKey struct{}

func consoleFrom(ctx context.Context) consoleCtx {
	c, _ := ctx.Value(consoleCtxKey{}).(consoleCtx)
	return c
}

// csrfLabel separates the CSRF token from any other use of the cookie.
const csrfLabel = "nodeward/v1/console-csrf"

// csrfToken is the session's CSRF token: an HMAC keyed by the session
// cookie. The cookie is a signed, unguessable JWT that scripts cannot read
// (HttpOnly) and other sites cannot send (SameSite=Strict), so only a page
// this server rendered for the session knows the token; and the token, shown
// in pages, does not reveal the cookie. It changes with every sign-in.
func csrfToken(cookie string) string {
	m := hmac.New(sha256.New, []byte(cookie))
	m.Write([]byte(csrfLabel))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// sessionFromCookie authenticates the request's console cookie. It answers
// the principal and the cookie value; auth.ErrUnauthenticated when there is
// no valid session.
func (h *handler) sessionFromCookie(r *http.Request) (auth.Principal, string, error) {
	c, err := r.Cookie(SessionCookie)
	if err != nil || c.Value == "" {
		return auth.Principal{}, "", auth.ErrUnauthenticated
	}
	p, err := h.Auth.AuthenticateSession(r.Context(), c.Value)
	return p, c.Value, err
}

// consoleSession lets a request through with a valid console session and,
// for a state change, a matching CSRF token. Without a session a page
// redirects to sign-in, returning here afterwards.
func (h *handler) consoleSession(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, cookie, err := h.sessionFromCookie(r)
		if errors.Is(err, auth.ErrUnauthenticated) {
			if hasCookie(r) {
				// Expired, revoked or forged: stop the browser sending it.
				h.clearSessionCookie(w)
			}
			target := "/console/login"
			if r.Method == http.MethodGet || r.Method == http.MethodHead {
				target += "?next=" + url.QueryEscape(r.URL.RequestURI())
			}
			http.Redirect(w, r, target, http.StatusSeeOther)
			return
		}
		if err != nil {
			h.consoleInternal(w, r, err)
			return
		}
		cc := consoleCtx{principal: p, csrf: csrfToken(cookie)}
		if !isSafeMethod(r.Method) {
			if err := r.ParseForm(); err != nil {
				h.consoleBadForm(w, r, cc, err)
				return
			}
			got := r.PostForm.Get("csrf_token")
			if subtle.ConstantTimeCompare([]byte(got), []byte(cc.csrf)) != 1 {
				logger(r).Warn("console CSRF token mismatch", "path", clip(r.URL.Path, maxLoggedText), "user", p.Username)
				h.consoleError(w, r, cc, http.StatusForbidden, "Form expired",
					"This form did not come from your current console session. Go back, reload the page and try again.")
				return
			}
		}
		r = withPrincipal(r, p)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), consoleCtxKey{}, cc)))
	})
}

func hasCookie(r *http.Request) bool {
	_, err := r.Cookie(SessionCookie)
	return err == nil
}

func isSafeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

func (h *handler) setSessionCookie(w http.ResponseWriter, value string, expires time.Time) {
	http.SetCookie(w, &http.Cookie{
		Name: SessionCookie, Value: value, Path: "/", Expires: expires,
		HttpOnly: true, Secure: h.SecureCookies, SameSite: http.SameSiteStrictMode,
	})
}

func (h *handler) clearSessionCookie(w http.ResponseWriter) {
	http.SetCookie(w, &http.Cookie{
		Name: SessionCookie, Value: "", Path: "/", MaxAge: -1, Expires: time.Unix(0, 0),
		HttpOnly: true, Secure: h.SecureCookies, SameSite: http.SameSiteStrictMode,
	})
}

// localNext returns next when it is a console path on this server, else "".
// Anything else (another host, a scheme, "//host", backslashes) could send a
// freshly signed-in administrator somewhere else.
func localNext(next string) string {
	if next == "" || len(next) > 2048 || strings.ContainsAny(next, "\\\r\n\t") || strings.Contains(next, "/..") {
		return ""
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" {
		return ""
	}
	if !strings.HasPrefix(next, "/console/") && next != "/console" {
		return ""
	}
	if strings.HasPrefix(next, "/console/login") || strings.HasPrefix(next, "/console/logout") || strings.HasPrefix(next, "/console/setup") {
		return ""
	}
	return next
}

// shell is the frame of a signed-in page.
func (h *handler) shell(r *http.Request, active string) views.Shell {
	cc := consoleFrom(r.Context())
	return views.Shell{Username: cc.principal.Username, CSRFToken: cc.csrf, Active: active}
}

// render writes a complete page; a page that fails to render is a 500, not
// half a page.
func (h *handler) render(w http.ResponseWriter, r *http.Request, status int, c templ.Component) {
	if clientGone(r) {
		// Nobody is waiting for this page; the access log counts it.
		logger(r).Debug("client went away before the page was rendered")
		return
	}
	var buf bytes.Buffer
	// The page is rendered into memory; a render error is a fault of the
	// page, never of a connection broken by a body that did not arrive.
	if err := c.Render(context.WithoutCancel(r.Context()), &buf); err != nil {
		logger(r).Error("render console page", "err", err.Error())
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", "text/html; charset=utf-8")
	// Console pages hold personal and sometimes secret data (a new token).
	hd.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// consoleError renders an error page inside the signed-in frame when cc
// holds a session, else the anonymous one.
func (h *handler) consoleError(w http.ResponseWriter, r *http.Request, cc consoleCtx, status int, title, msg string) {
	s := views.Shell{Username: cc.principal.Username, CSRFToken: cc.csrf}
	back, label := "/console/", "Back to the overview"
	if !s.SignedIn() {
		back, label = "/console/login", "Sign in"
	}
	h.render(w, r, status, views.ErrorPage(s, views.ErrorView{
		Status: status, Title: title, Message: msg, RequestID: requestIDFrom(r.Context()),
		Back: back, BackLabel: label,
	}))
}

// consoleInternal renders the page for an error the handler did not
// expect, through the API's one mapping (resolve): the same status and, for
// a coded error, its message; an uncoded error is logged with the request
// id and shown as a generic page.
func (h *handler) consoleInternal(w http.ResponseWriter, r *http.Request, err error) {
	h.consoleResolved(w, r, consoleFrom(r.Context()), err)
}

// consoleResolved is consoleInternal in the frame of cc, for a request
// whose context does not carry it yet.
func (h *handler) consoleResolved(w http.ResponseWriter, r *http.Request, cc consoleCtx, err error) {
	if clientGone(r) && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		logger(r).Debug("client went away", "err", err.Error())
		return
	}
	status, e := resolve(r, err)
	setRetryAfter(w, status)
	closeAfterTimeout(w, r, status)
	title, msg := http.StatusText(status), e.Message
	if e.Code == errcode.Internal {
		title, msg = "Something went wrong",
			"The server could not complete the request. The request id below finds it in the server log."
	}
	h.consoleError(w, r, cc, status, title, msg)
}

// consoleBadForm answers a form that could not be read as the API
// answers such a body: 408 when it did not arrive within the read timeout
// (the link was slow; sending it again may work), 413 when it passed the
// body limit, else 400.
func (h *handler) consoleBadForm(w http.ResponseWriter, r *http.Request, cc consoleCtx, err error) {
	if e := bodyTimeout(r, err); e != nil {
		h.consoleResolved(w, r, cc, e)
		return
	}
	if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
		h.consoleResolved(w, r, cc, errcode.Errorf(errcode.PayloadTooLarge, "request body exceeds %d bytes", mbe.Limit))
		return
	}
	h.consoleError(w, r, cc, http.StatusBadRequest, "Bad request", "The form could not be read.")
}

// consoleNotFound answers unknown console paths with a page, in the
// signed-in frame when the visitor has a session.
func (h *handler) consoleNotFound(w http.ResponseWriter, r *http.Request) {
	h.consoleError(w, r, h.cookieConsoleCtx(r), http.StatusNotFound, "Page not found", "There is no console page at this address.")
}

// cookieConsoleCtx is the signed-in administrator, if any, of a request
// answered outside the console's routes (404, 405): the page shows the
// navigation to whoever is signed in.
func (h *handler) cookieConsoleCtx(r *http.Request) consoleCtx {
	if p, cookie, err := h.sessionFromCookie(r); err == nil {
		return consoleCtx{principal: p, csrf: csrfToken(cookie)}
	}
	return consoleCtx{}
}

// newRequestID mints the request id a rendered form carries.
func newRequestID() string { return "console:" + ledger.NewID() }

// formRequestID is the form's request id; a missing or malformed one (a
// hand-made request) gets a fresh one, so the submit still happens once.
func formRequestID(r *http.Request) string {
	id := r.PostForm.Get("request_id")
	if !ledger.ValidRequestID(id) {
		return newRequestID()
	}
	return id
}

// consoleOnlyQuery refuses a listing page whose link carries a query
// parameter it does not read (a misspelt filter, a hand-edited link): the
// page would otherwise show everything while its reader believes it
// filtered, as the API refuses the same (onlyQuery).
func (h *handler) consoleOnlyQuery(names ...string) func(http.Handler) http.Handler {
	allowed := make(map[string]bool, len(names))
	for _, n := range names {
		allowed[n] = true
	}
	sorted := append([]string(nil), names...)
	slices.Sort(sorted)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for k := range r.URL.Query() {
				if allowed[k] {
					continue
				}
				name := "“" + clip(k, 64) + "”"
				if !displayable(k) {
					name = "a name that cannot be shown"
				}
				h.consoleError(w, r, consoleFrom(r.Context()), http.StatusBadRequest, "Unknown filter",
					"This page has no filter "+name+", so it would show more than the link asks for. "+
						"It takes: "+strings.Join(sorted, ", ")+".")
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}
