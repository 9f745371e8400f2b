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
	"path"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
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
	// SecureCookies marks cookies Secure (the server terminates TLS).
	SecureCookies bool
	// BodyReadTimeout overrides DefaultBodyReadTimeout when > 0.
	BodyReadTimeout time.Duration
	// BodyLimit overrides DefaultBodyLimit when > 0.
	BodyLimit int64
}

type handler struct {
	Deps
	log     *slog.Logger
	metrics *metrics.Metrics
}

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
	r.Use(h.edge(d.BodyReadTimeout, d.BodyLimit, cop))
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
			r.Get("/whoami", h.whoami)
			r.Get("/capabilities", h.capabilities)
			r.Post("/tokens", h.createToken)
			r.Get("/tokens", h.listTokens)
			r.Post("/tokens/{id}/revoke", h.revokeToken)
			r.Get("/admin-audit", h.adminAudit)

			r.Post("/nodes/invitations", h.inviteNode)
			r.Get("/nodes", h.listNodes)
			r.Get("/nodes/{id}", h.getNode)
			r.Post("/nodes/{id}/reinvite", h.reinviteNode)
			r.Post("/nodes/{id}/retire", h.retireNode)
			r.Get("/nodes/{id}/reconciliation", h.reconciliation)
			r.Get("/nodes/{id}/workloads/{run_id}/{attempt_id}", h.getWorkload)
			r.Get("/nodes/{id}/workloads/{run_id}/{attempt_id}/output", h.getWorkloadOutput)
			r.Get("/nodes/{id}/audit", h.nodeAudit)
			r.Get("/nodes/{id}/timeline", h.nodeTimeline)
			r.Get("/nodes/{id}/config", h.getNodeConfig)
			r.Get("/config/lagging", h.listLaggingConfigs)
			r.Post("/nodes/{id}/commands", h.issueCommand)
			r.Get("/nodes/{id}/commands", h.listNodeCommands)
			r.Get("/commands/{operation_id}", h.getCommand)
			r.Get("/offers", h.listOffers)
			r.Get("/sessions", h.liveSessions)

			r.Post("/operations", h.submitOperation)
			r.Get("/operations/{id}", h.getOperation)
			r.Post("/operations/{id}/cancel", h.cancelOperation)
			r.Get("/operations/{id}/watch", h.watchOperation)
			r.Get("/node-operations", h.listOperations)

			r.Post("/package-hosts", h.createPackageHost)
			r.Get("/package-hosts", h.listPackageHosts)
			r.Post("/package-hosts/{id}/revoke", h.revokePackageHost)
			r.Post("/package-hosts/{id}/tokens", h.issuePackageHostToken)

			r.Post("/secrets/seal", h.sealSecret)
			r.Get("/reveals/{handle}", h.revealSecret)
			r.Get("/secret-audit", h.secretAudit)
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

func (h *handler) notFound(w http.ResponseWriter, r *http.Request) {
	if !isAPIPath(r.URL.Path) && strings.HasPrefix(r.URL.Path, "/console") {
		h.consoleNotFound(w, r)
		return
	}
	writeError(w, r, errcode.Errorf(errcode.NotFound, "no such resource: %s", clip(r.URL.Path, maxLoggedText)))
}

func (h *handler) methodNotAllowed(w http.ResponseWriter, r *http.Request) {
	writeError(w, r, errcode.Errorf(errcode.MethodNotAllowed, "method %s is not allowed here", clip(r.Method, 16)))
}
