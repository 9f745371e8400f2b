package handlers

import (
	"net/http"
	"time"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/views"
)

func (h *handler) consoleOverview(w http.ResponseWriter, r *http.Request) {
	h.render(w, r, http.StatusOK, views.OverviewPage(h.shell(r, views.NavOverview), h.overview(r)))
}

// overview builds the fleet overview's view-model: nodes by state and the
// latest changes across the fleet. A failed read shows the empty state and
// is logged, rather than failing the whole page.
func (h *handler) overview(r *http.Request) views.Overview {
	v := views.Overview{BaseURL: requestBaseURL(r)}
	var counts map[fleet.State]int64
	v.Summary, counts = h.summary(r)
	for _, s := range views.NodeStates {
		v.Counts = append(v.Counts, views.StateCount{State: s, Count: int(counts[fleet.State(s)])})
	}
	recent, err := h.Fleet.RecentAudit(r.Context(), 10)
	if err != nil {
		logger(r).Error("overview: recent activity", "err", err)
	}
	for _, e := range recent {
		v.Recent = append(v.Recent, views.Activity{At: e.At, Actor: e.Actor,
			Summary: e.Action + " " + e.NodeID, Href: views.NodeHref(e.NodeID)})
	}
	return v
}

// summary is the overview's "needs attention" counts, each from an index
// (fleet.Service.Summarize, ledger.Service.Summarize). A failed read is
// shown as unavailable, never as zeros. It answers the nodes by state too
// (nil when unread).
func (h *handler) summary(r *http.Request) (views.FleetSummary, map[fleet.State]int64) {
	fs, err := h.Fleet.Summarize(r.Context(), 24*time.Hour)
	if err != nil {
		logger(r).Error("overview: fleet summary", "err", err)
		return views.FleetSummary{}, nil
	}
	ls, err := h.Ledger.Summarize(r.Context(), time.Hour, 24*time.Hour)
	if err != nil {
		logger(r).Error("overview: ledger summary", "err", err)
		return views.FleetSummary{}, fs.ByState
	}
	v := views.FleetSummary{Available: true, Lapsing: fs.Lapsing, LapseWindow: h.Fleet.LapseWindow(),
		PendingCommands: fs.PendingCommands, Failed: ls.Failed, Refused: fs.RefusedCommands}
	// The lagging count and the never-reported count come together from
	// the lagging listing's counts (one row read beside them).
	if lag, err := h.Fleet.LaggingConfigs(r.Context(), "", 1); err != nil {
		logger(r).Error("overview: lagging configurations", "err", err)
		v.ConfigUnavailable = true
	} else {
		v.Lagging, v.NeverReported = lag.Count, lag.NeverReported
	}
	for _, s := range views.OperationStates {
		v.Operations = append(v.Operations, views.StateCount{State: s, Count: int(ls.RecentByState[ledger.State(s)])})
	}
	return v, fs.ByState
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
