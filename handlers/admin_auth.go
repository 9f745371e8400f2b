package handlers

import (
	"context"
	"net/http"
	"strings"

	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/errcode"
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

// bearer returns the Bearer credential of the request, or "": none for a
// request with more than one Authorization header, which names no one
// credential to check (taking the first would let an intermediary's
// header stand in for the client's, or the other way round).
func bearer(r *http.Request) string {
	if manyAuthorizations(r) {
		return ""
	}
	v := r.Header.Get("Authorization")
	if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
		return strings.TrimSpace(v[7:])
	}
	return ""
}

func manyAuthorizations(r *http.Request) bool { return len(r.Header.Values("Authorization")) > 1 }

// authenticate accepts a Bearer token (an administrator's API token or a
// package host's token) or a console session cookie.
func (h *handler) authenticate(r *http.Request) (auth.Principal, error) {
	if manyAuthorizations(r) {
		return auth.Principal{}, auth.ErrUnauthenticated
	}
	if tok := bearer(r); tok != "" {
		return h.Auth.AuthenticateBearer(r.Context(), tok)
	}
	if c, err := r.Cookie(SessionCookie); err == nil && c.Value != "" {
		return h.Auth.AuthenticateSession(r.Context(), c.Value)
	}
	return auth.Principal{}, auth.ErrUnauthenticated
}

// requirePrincipal refuses every request without a valid credential,
// before routing (401), and a package host's request to anything but the
// few endpoints it may call (403, DECISIONS.md §15).
func (h *handler) requirePrincipal(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := h.authenticate(r)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="nodeward"`)
			writeError(w, r, err)
			return
		}
		if p.Kind == auth.KindPackageHost && !packageHostMayCall(r.Method, r.URL.Path) {
			writeError(w, r, errcode.New(errcode.PermissionDenied, "package hosts may not call this endpoint"))
			return
		}
		next.ServeHTTP(w, withPrincipal(r, p))
	})
}

// packageHostRoutes are what a package host may call: submit operations
// (the ledger checks its families), and read, watch and cancel its own
// (the ledger hides everyone else's), and seal values for their own
// requests, and redeem their own reveal handles, and read what the
// control plane serves (capabilities). A {segment} matches
// one non-empty path segment.
var packageHostRoutes = []struct{ method, pattern string }{
	{http.MethodPost, "/api/v1/operations"},
	{http.MethodGet, "/api/v1/operations/{id}"},
	{http.MethodGet, "/api/v1/operations/{id}/watch"},
	{http.MethodPost, "/api/v1/operations/{id}/cancel"},
	{http.MethodGet, "/api/v1/node-operations"},
	{http.MethodPost, "/api/v1/secrets/seal"},
	{http.MethodGet, "/api/v1/reveals/{handle}"},
	{http.MethodGet, "/api/v1/capabilities"},
}

func packageHostMayCall(method, path string) bool {
	got := strings.Split(path, "/")
	for _, rt := range packageHostRoutes {
		if rt.method != method {
			continue
		}
		want := strings.Split(rt.pattern, "/")
		if len(want) != len(got) {
			continue
		}
		ok := true
		for i, w := range want {
			if strings.HasPrefix(w, "{") {
				ok = ok && got[i] != ""
			} else {
				ok = ok && got[i] == w
			}
		}
		if ok {
			return true
		}
	}
	return false
}
