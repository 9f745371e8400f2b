package handlers

import (
	"context"
	"net/http"
	"strings"

	"github.com/nodeward/nodeward/auth"
)

// SessionCookie is the console's session cookie.
const SessionCookie = "nodeward_session"

func principalFrom(ctx context.Context) (auth.Principal, bool) {
	p, ok := ctx.Value(principalKey).(auth.Principal)
	return p, ok
}

func withPrincipal(r *http.Request, p auth.Principal) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), principalKey, p))
}

// bearer returns the Bearer credential of the request, or "".
func bearer(r *http.Request) string {
	v := r.Header.Get("Authorization")
	if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
		return strings.TrimSpace(v[7:])
	}
	return ""
}

// authenticateAdmin accepts an API token (Bearer) or a console session
// cookie.
func (h *handler) authenticateAdmin(r *http.Request) (auth.Principal, error) {
	if tok := bearer(r); tok != "" {
		return h.Auth.AuthenticateToken(r.Context(), tok)
	}
	if c, err := r.Cookie(SessionCookie); err == nil && c.Value != "" {
		return h.Auth.AuthenticateSession(r.Context(), c.Value)
	}
	return auth.Principal{}, auth.ErrUnauthenticated
}

// requireAdmin refuses every request without a valid administrator
// credential, before routing.
func (h *handler) requireAdmin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := h.authenticateAdmin(r)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="nodeward"`)
			writeError(w, r, err)
			return
		}
		next.ServeHTTP(w, withPrincipal(r, p))
	})
}
