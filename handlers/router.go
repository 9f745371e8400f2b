// Package handlers is the HTTP edge: the route table, request decoding and
// validation, authentication middleware, the one mapping from domain errors
// to problem+json, and the console's form handlers. It holds no business
// rules and writes no SQL: it calls the domain packages.
package handlers

import (
	"context"
	"io/fs"
	"log/slog"
	"net/http"
	"net/netip"
	"path"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/offstack"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/metrics"
	"github.com/nodeward/nodeward/secrets"
)

// Readiness is what /readyz asks of the database.
type Readiness interface {
	// Ping checks the database answers.
	Ping(ctx context.Context) error
	// MigrationsCurrent reports whether every migration is applied.
	MigrationsCurrent(ctx context.Context) (bool, error)
}

// Deps are what the HTTP edge needs from the rest of the server.
type Deps struct {
	Logger *slog.Logger
	// Ready answers /readyz's database checks.
	Ready   Readiness
	Auth    *auth.Service
	Fleet   *fleet.Service
	Ledger  *ledger.Service
	Secrets *secrets.Service
	Metrics *metrics.Metrics
	// OpenAPI is the contract served at /openapi.yaml.
	OpenAPI []byte
	// Static is the console's assets (CSS, JS, icons).
	Static fs.FS
	// Draining reports that the server is shutting down.
	Draining func() bool
	// SecureCookies: browsers reach the server over https (it terminates
	// TLS, or a proxy in front does): cookies are Secure and every answer
	// carries Strict-Transport-Security.
	SecureCookies bool
	// BodyReadTimeout overrides DefaultBodyReadTimeout when > 0.
	BodyReadTimeout time.Duration
	// BodyLimit overrides DefaultBodyLimit when > 0.
	BodyLimit int64
	// TrustedProxies are the balancers and reverse proxies in front: a
	// request from one of them is taken to come from the address it
	// forwarded (X-Forwarded-For; see proxies.go). None: the TCP peer is
	// the client.
	TrustedProxies []netip.Prefix
}

type handler struct {
	Deps
	log     *slog.Logger
	metrics *metrics.Metrics
	// root is the router, asked which methods a path takes (Allow).
	root chi.Routes
}

// apiRoute is one endpoint under /api/v1 and the query parameters it
// reads: any other is refused (onlyQuery), so a misspelt filter or a cursor
// an endpoint does not page by is never silently ignored.
type apiRoute struct {
	method, pattern string
	serve           func(*handler, http.ResponseWriter, *http.Request)
	query           []string
}

var (
	pageQuery = []string{"limit", "before"}
	apiRoutes = []apiRoute{
		{http.MethodGet, "/whoami", (*handler).whoami, nil},
		{http.MethodGet, "/capabilities", (*handler).capabilities, nil},
		{http.MethodPost, "/tokens", (*handler).createToken, nil},
		{http.MethodGet, "/tokens", (*handler).listTokens, pageQuery},
		{http.MethodPost, "/tokens/{id}/revoke", (*handler).revokeToken, nil},
		{http.MethodGet, "/admin-audit", (*handler).adminAudit, pageQuery},
		{http.MethodGet, "/admins", (*handler).listAdmins, pageQuery},
		{http.MethodPost, "/admins", (*handler).createAdmin, nil},
		{http.MethodGet, "/admins/{username}", (*handler).getAdmin, nil},
		{http.MethodPost, "/admins/{username}/disable", (*handler).disableAdmin, nil},
		{http.MethodPost, "/admins/{username}/enable", (*handler).enableAdmin, nil},
		{http.MethodPost, "/admins/{username}/sign-out", (*handler).signOutAdmin, nil},
		{http.MethodPost, "/account/password", (*handler).changePassword, nil},

		{http.MethodPost, "/nodes/invitations", (*handler).inviteNode, nil},
		{http.MethodGet, "/nodes", (*handler).listNodes, []string{"state", "limit", "before"}},
		{http.MethodGet, "/nodes/{id}", (*handler).getNode, nil},
		{http.MethodPost, "/nodes/{id}/reinvite", (*handler).reinviteNode, nil},
		{http.MethodPost, "/nodes/{id}/retire", (*handler).retireNode, nil},
		{http.MethodGet, "/nodes/{id}/reconciliation", (*handler).reconciliation, nil},
		{http.MethodGet, "/nodes/{id}/workloads/{run_id}/{attempt_id}", (*handler).getWorkload, nil},
		{http.MethodGet, "/nodes/{id}/workloads/{run_id}/{attempt_id}/output", (*handler).getWorkloadOutput, nil},
		{http.MethodGet, "/nodes/{id}/audit", (*handler).nodeAudit, pageQuery},
		// The timeline merges two trails: it answers the latest, unpaged
		// (page the audit and the node's operations instead).
		{http.MethodGet, "/nodes/{id}/timeline", (*handler).nodeTimeline, []string{"limit"}},
		{http.MethodGet, "/nodes/{id}/config", (*handler).getNodeConfig, nil},
		{http.MethodGet, "/config/lagging", (*handler).listLaggingConfigs, pageQuery},
		{http.MethodPost, "/nodes/{id}/commands", (*handler).issueCommand, nil},
		{http.MethodGet, "/nodes/{id}/commands", (*handler).listNodeCommands, []string{"state", "limit", "before"}},
		{http.MethodGet, "/commands/{operation_id}", (*handler).getCommand, nil},
		{http.MethodGet, "/offers", (*handler).listOffers, []string{"class", "min_free_disk_bytes", "until"}},
		{http.MethodGet, "/sessions", (*handler).liveSessions, nil},

		{http.MethodPost, "/operations", (*handler).submitOperation, nil},
		{http.MethodGet, "/operations/{id}", (*handler).getOperation, nil},
		{http.MethodPost, "/operations/{id}/cancel", (*handler).cancelOperation, nil},
		{http.MethodGet, "/operations/{id}/watch", (*handler).watchOperation, nil},
		{http.MethodGet, "/node-operations", (*handler).listOperations, append(operationFilterNames(), "limit")},

		{http.MethodPost, "/package-hosts", (*handler).createPackageHost, nil},
		{http.MethodGet, "/package-hosts", (*handler).listPackageHosts, pageQuery},
		{http.MethodPost, "/package-hosts/{id}/revoke", (*handler).revokePackageHost, nil},
		{http.MethodPost, "/package-hosts/{id}/tokens", (*handler).issuePackageHostToken, nil},

		{http.MethodPost, "/secrets/seal", (*handler).sealSecret, nil},
		{http.MethodGet, "/reveals/{handle}", (*handler).revealSecret, nil},
		{http.MethodGet, "/secret-audit", (*handler).secretAudit, append(secretAuditFilterNames(), "limit", "before")},
	}
)

// New returns the control plane's HTTP handler.
func New(d Deps) http.Handler {
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	if d.BodyLimit <= 0 {
		d.BodyLimit = DefaultBodyLimit
	}
	if d.BodyReadTimeout <= 0 {
		d.BodyReadTimeout = DefaultBodyReadTimeout
	}
	if d.Draining == nil {
		d.Draining = func() bool { return false }
	}
	h := &handler{Deps: d, log: d.Logger, metrics: d.Metrics}

	r := chi.NewRouter()
	cop := http.NewCrossOriginProtection()
	h.root = r
	r.Use(h.edge(d.BodyReadTimeout, d.BodyLimit, cop))
	// HEAD is GET without the body (a balancer's health check, a link
	// checker), wherever GET is served.
	r.Use(middleware.GetHead)
	r.NotFound(h.notFound)
	r.MethodNotAllowed(h.methodNotAllowed)

	// Operations.
	r.Get("/healthz", h.healthz)
	r.Get("/readyz", h.readyz)
	r.Method(http.MethodGet, "/metrics", promhttp.HandlerFor(d.Metrics.Registry, promhttp.HandlerOpts{}))
	r.Get("/openapi.yaml", h.openapi)

	// Agents: enrollment by token, everything else on a fenced session,
	// authenticated before routing.
	r.Route("/agent/v1", func(r chi.Router) {
		r.Use(h.requireAgentSession)
		r.NotFound(h.notFound)
		r.MethodNotAllowed(h.methodNotAllowed)
		r.Post("/enroll", h.enroll)
		r.Post("/session/renew", h.renewSession)
		r.Method(http.MethodGet, "/commands", (*pollHandler)(h)) // served by pollRoute (New)
		r.Post("/results", h.postResults)
		r.Post("/events", h.postEvents)
		r.Post("/output", h.postOutput)
	})

	// Administration and scripts: authentication before routing, so no
	// /api path answers anything but 401 to an anonymous caller.
	r.Route("/api", func(r chi.Router) {
		r.Use(h.requirePrincipal, h.plainPath(nil))
		r.NotFound(h.notFound)
		r.MethodNotAllowed(h.methodNotAllowed)
		r.Route("/v1", func(r chi.Router) {
			for _, rt := range apiRoutes {
				r.With(onlyQuery(rt.query)).Method(rt.method, rt.pattern, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
					rt.serve(h, w, req)
				}))
			}
		})
	})

	// Console and its assets.
	r.Get("/", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/console/", http.StatusSeeOther)
	})
	r.Handle("/static/*", http.StripPrefix("/static/", staticHandler(d.Static)))
	h.consoleRoutes(r)
	return &pollRoute{rest: r, poll: &edgeHandler{h: h, bodyTimeout: d.BodyReadTimeout, limit: d.BodyLimit, cop: cop,
		route: pollPath, next: &agentSessionHandler{h: h, next: (*pollHandler)(h)}}}
}

// pollPath is the agents' long-poll: GET /agent/v1/commands.
const pollPath = "/agent/v1/commands"

// pollRoute serves the long-poll past chi: the same layers (edge, the agent
// session, the poll) without the two routers' frames under every held poll
// (~0.8 KB, the difference between a 4 KB and an 8 KB stack), their route
// context and the request copies they make. Every other request, and any
// other spelling of the path or method, is chi's (which serves
// GET /agent/v1/commands the same way).
type pollRoute struct {
	rest http.Handler
	poll http.Handler
}

func (p *pollRoute) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.URL.Path == pollPath && r.URL.RawPath == "" {
		p.poll.ServeHTTP(w, r)
		return
	}
	// Anything else runs off the connection's goroutine too: an agent's
	// connection carries its enrollment, results and events between polls,
	// and the stack they grew would stay under its next held poll until
	// collections shrank it.
	offstack.Run(func() { p.rest.ServeHTTP(w, r) })
}

func staticHandler(fsys fs.FS) http.Handler {
	if fsys == nil {
		return http.NotFoundHandler()
	}
	fileServer := http.FileServerFS(fsys)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Files only: a folder is not listed (nor redirected to, nor its
		// index served).
		name := strings.TrimPrefix(path.Clean("/"+r.URL.Path), "/")
		if fi, err := fs.Stat(fsys, name); name == "" || err != nil || fi.IsDir() {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Cache-Control", "public, max-age=300")
		fileServer.ServeHTTP(w, r)
	})
}

func isAPIPath(p string) bool {
	return strings.HasPrefix(p, "/api/") || strings.HasPrefix(p, "/agent/") || p == "/api"
}

// isConsolePath reports whether p is answered with console pages.
func isConsolePath(p string) bool {
	return !isAPIPath(p) && strings.HasPrefix(p, "/console")
}

func (h *handler) notFound(w http.ResponseWriter, r *http.Request) {
	if isConsolePath(r.URL.Path) {
		h.consoleNotFound(w, r)
		return
	}
	writeError(w, r, errcode.Errorf(errcode.NotFound, "no such resource: %s", clip(loggedPath(r.URL.Path), maxLoggedText)))
}

// methodNotAllowed answers 405 with the methods the path does take in
// Allow (RFC 9110): a console page as a page, the rest as a problem.
func (h *handler) methodNotAllowed(w http.ResponseWriter, r *http.Request) {
	var allowed []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		if h.root != nil && h.root.Match(chi.NewRouteContext(), m, r.URL.Path) {
			allowed = append(allowed, m)
			if m == http.MethodGet {
				allowed = append(allowed, http.MethodHead)
			}
		}
	}
	if len(allowed) > 0 {
		w.Header().Set("Allow", strings.Join(allowed, ", "))
	}
	if isConsolePath(r.URL.Path) {
		h.consoleError(w, r, h.cookieConsoleCtx(r), http.StatusMethodNotAllowed, "Not available this way",
			"This address answers a form; it cannot be opened on its own. Go back to the page the form was on.")
		return
	}
	writeError(w, r, errcode.Errorf(errcode.MethodNotAllowed, "method %s is not allowed here", clip(r.Method, 16)))
}
