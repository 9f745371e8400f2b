package handlers

import (
	"net/http"

	"github.com/nodeward/nodeward/views"
)

func (h *handler) consoleOverview(w http.ResponseWriter, r *http.Request) {
	h.render(w, r, http.StatusOK, views.OverviewPage(h.shell(r, views.NavOverview), h.overview(r)))
}

// overview builds the fleet overview's view-model. Until the fleet registry
// serves counts, every state counts zero and there is no recent activity, so
// the page shows its empty state. The fleet work fills Counts (one entry per
// views.NodeStates, in that order) and Recent (newest first) here.
func (h *handler) overview(r *http.Request) views.Overview {
	v := views.Overview{BaseURL: requestBaseURL(r)}
	for _, s := range views.NodeStates {
		v.Counts = append(v.Counts, views.StateCount{State: s})
	}
	return v
}

// requestBaseURL is the URL the browser used to reach this server, for
// examples on the page.
func requestBaseURL(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}
