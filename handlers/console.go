package handlers

import (
	"net/http"

	"github.com/go-chi/chi/v5"
)

// consoleRoutes mounts the console. (Placeholder until the console lands.)
func (h *handler) consoleRoutes(r chi.Router) {
	r.Get("/console/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte("<!doctype html><title>Nodeward</title><p>Console coming soon."))
	})
}

func (h *handler) consoleNotFound(w http.ResponseWriter, r *http.Request) {
	http.Error(w, "not found", http.StatusNotFound)
}
