package handlers

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/nodeward/nodeward/migrations"
)

func (h *handler) healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz answers 200 only when the database answers and its schema is
// current, and not while draining: a load balancer stops sending work here.
// A schema a newer release migrated is "ahead": this replica is an old one
// left running through an upgrade, and must get no more work.
func (h *handler) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	checks := map[string]string{"database": "ok", "migrations": "ok", "draining": "no"}
	ready := true
	if err := h.Ready.Ping(ctx); err != nil {
		checks["database"] = "unreachable"
		ready = false
		logger(r).Warn("readyz: database", "err", err)
	} else if ok, err := h.Ready.MigrationsCurrent(ctx); errors.Is(err, migrations.ErrAhead) {
		checks["migrations"] = "ahead"
		ready = false
	} else if err != nil || !ok {
		checks["migrations"] = "pending"
		ready = false
	}
	if h.Draining() {
		checks["draining"] = "yes"
		ready = false
	}
	status := http.StatusOK
	state := "ready"
	if !ready {
		status = http.StatusServiceUnavailable
		state = "not_ready"
	}
	writeJSON(w, status, map[string]any{"status": state, "checks": checks})
}

func (h *handler) openapi(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	_, _ = w.Write(h.OpenAPI)
}
