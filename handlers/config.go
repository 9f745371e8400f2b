package handlers

import (
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/nodeward/nodeward/fleet"
)

// Desired configuration reads (DECISIONS.md §32); administrators only
// (package hosts are refused before routing, DECISIONS.md §15).

func (h *handler) getNodeConfig(w http.ResponseWriter, r *http.Request) {
	v, err := h.Fleet.NodeConfig(r.Context(), chi.URLParam(r, "id"))
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (h *handler) listLaggingConfigs(w http.ResponseWriter, r *http.Request) {
	before, err := queryOf(r).get("before")
	if err != nil {
		writeError(w, r, err)
		return
	}
	if !laggingCursor(before) {
		writeError(w, r, invalidParameter("before", "a cursor from next_before"))
		return
	}
	limit, err := queryLimit(r, 100, 500)
	if err != nil {
		writeError(w, r, err)
		return
	}
	page, err := h.Fleet.LaggingConfigs(r.Context(), before, limit)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, page)
}

// laggingCursor reports whether before is absent or a cursor the listing
// could have answered, a node id (anything else, NUL or bytes that are
// not UTF-8 among them, would reach the database's text comparison).
func laggingCursor(before string) bool {
	return before == "" || fleet.ValidID(before)
}
