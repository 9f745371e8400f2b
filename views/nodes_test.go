package views_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/html"

	"github.com/nodeward/nodeward/views"
)

var now = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

func free(n int64) *int64 { return &n }

func sampleRow(id, state string) views.NodeRow {
	hb := now.Add(-12 * time.Second)
	return views.NodeRow{ID: id, RentalID: "rent-" + id, Generation: 2, State: state, FencingToken: 7,
		LastHeartbeat: &hb, AgentVersion: "1.4.0", Price: "$0.25/h",
		Disk: views.DiskInfo{State: views.DiskMeasured, FreeBytes: free(5 << 30)}}
}

func elements(n *html.Node, tag string) []*html.Node {
	return findAll(n, func(x *html.Node) bool { return x.Data == tag })
}

func TestNodesPage(t *testing.T) {
	t.Run("Rows", func(t *testing.T) {
		unmeasurable, never := sampleRow("n2", "lost"), sampleRow("n3", "enrolling")
		unmeasurable.Disk = views.DiskInfo{State: views.DiskUnmeasurable}
		never.Disk, never.LastHeartbeat, never.Price = views.DiskInfo{State: views.DiskNeverReported}, nil, ""
		doc := render(t, views.NodesPage(signedIn, views.NodesView{Now: now,
			Nodes: []views.NodeRow{sampleRow("n1", "ready"), unmeasurable, never}}))
		row := one(t, doc, "node-n1")
		require.Equal(t, "ready", text(byTestID(row, "node-state")[0]))
		times := elements(byTestID(row, "node-heartbeat")[0], "time")
		require.Len(t, times, 1)
		require.Equal(t, "12 s ago", text(times[0]))
		title, _ := attr(times[0], "title")
		require.Equal(t, "2026-03-04T05:05:55Z", title)
		href, _ := attr(byTestID(row, "node-link")[0], "href")
		require.Equal(t, "/console/nodes/n1", href)

		// The three disk reports read differently.
		require.Equal(t, "5.0 GiB free", text(byTestID(row, "disk")[0]))
		require.Equal(t, "unmeasurable", text(byTestID(one(t, doc, "node-n2"), "disk")[0]))
		require.Equal(t, "not reported", text(byTestID(one(t, doc, "node-n3"), "disk")[0]))
		require.Equal(t, "never", text(byTestID(one(t, doc, "node-n3"), "node-heartbeat")[0]))
		require.Contains(t, text(one(t, doc, "node-n3")), "unpriced")
		require.Empty(t, byTestID(doc, "nodes-older"))
	})

	t.Run("OlderKeepsTheFilter", func(t *testing.T) {
		doc := render(t, views.NodesPage(signedIn, views.NodesView{Now: now, Filter: views.NodeFilter{State: "ready", Lapsing: true},
			Nodes: []views.NodeRow{sampleRow("n1", "ready")}, OlderBefore: "abc", Paged: true}))
		href, _ := attr(one(t, doc, "nodes-older"), "href")
		require.Equal(t, "/console/nodes?lease=lapsing&state=ready&before=abc", href)
		href, _ = attr(one(t, doc, "nodes-newest"), "href")
		require.Equal(t, "/console/nodes?lease=lapsing&state=ready", href)
		selected := findAll(one(t, doc, "filter-state"), func(n *html.Node) bool { _, ok := attr(n, "selected"); return ok })
		require.Len(t, selected, 1)
		require.Equal(t, "ready", text(selected[0]))
		_, checked := attr(one(t, doc, "filter-lapsing"), "checked")
		require.True(t, checked)
	})

	t.Run("EmptyAndError", func(t *testing.T) {
		doc := render(t, views.NodesPage(signedIn, views.NodesView{Now: now}))
		require.Contains(t, text(one(t, doc, "no-nodes")), "No nodes yet")
		doc = render(t, views.NodesPage(signedIn, views.NodesView{Now: now, Filter: views.NodeFilter{State: "lost"}}))
		require.Contains(t, text(one(t, doc, "no-nodes")), "No nodes match")
		doc = render(t, views.NodesPage(signedIn, views.NodesView{Now: now, Error: "bad <cursor>"}))
		require.Equal(t, "bad <cursor>", text(one(t, doc, "nodes-error")))
		require.Empty(t, byTestID(doc, "no-nodes"))
	})

	t.Run("AgentTextEscaped", func(t *testing.T) {
		r := sampleRow("n1", "ready")
		r.Hostname = `<script>alert(1)</script>`
		doc := render(t, views.NodesPage(signedIn, views.NodesView{Now: now, Nodes: []views.NodeRow{r}}))
		require.Equal(t, r.Hostname, text(one(t, doc, "node-hostname")))
		require.Empty(t, elements(doc, "script"))
	})
}

func sampleDetail() views.NodeDetail {
	seen := now.Add(-3 * time.Minute)
	return views.NodeDetail{Now: now, Node: sampleRow("n1", "ready"), CreatedAt: now.Add(-time.Hour),
		Facts:      []views.Fact{{Key: "hostname", Value: `<img src=x onerror=alert(1)>`}, {Key: "labels", Value: `{"a":"<b>"}`}},
		Workloads:  []views.WorkloadRow{{RunID: "r1", AttemptID: "a1", State: "exited", ObservedAt: &seen, HasOutput: true, StdoutTail: "hello\n"}},
		Pending:    []views.CommandRow{{OperationID: "op-1", Kind: "launch_workload", State: "pending", IssuedAt: seen}},
		Timeline:   []views.TimelineRow{{At: seen, Source: "operation", Action: "succeeded", Actor: "admin:ada", OperationID: "op-0", Kind: "node.invite"}},
		Operations: []views.NodeOperationRow{{ID: "op-0", Kind: "node.invite", State: "succeeded", CreatedAt: seen}},
		Command:    views.CommandForm{RequestID: "console:abc", Kind: "launch_workload"},
	}
}

func TestNodePage(t *testing.T) {
	t.Run("Sections", func(t *testing.T) {
		doc := render(t, views.NodePage(signedIn, sampleDetail()))
		require.Equal(t, "n1", text(one(t, doc, "node-id")))
		require.Equal(t, "7", text(one(t, doc, "fencing-token")))
		require.Equal(t, `<img src=x onerror=alert(1)>`, text(one(t, doc, "fact-hostname")))
		require.Empty(t, findAll(doc, func(n *html.Node) bool { v, _ := attr(n, "src"); return n.Data == "img" && v == "x" }))
		require.Equal(t, "hello", text(one(t, doc, "stdout")))
		one(t, doc, "command-op-1")
		require.Contains(t, text(one(t, doc, "timeline")), "node.invite")
		href, _ := attr(elements(one(t, doc, "operation-op-0"), "a")[0], "href")
		require.Equal(t, "/console/operations/op-0", href)
		// No configuration yet, said so.
		one(t, doc, "config-none")
	})

	t.Run("CommandForm", func(t *testing.T) {
		d := sampleDetail()
		d.Command.Errors = map[string]string{"payload": "Not a JSON object."}
		d.Command.Payload = `{"x": </textarea><script>`
		doc := render(t, views.NodePage(signedIn, d))
		form := one(t, doc, "command-form")
		action, _ := attr(form, "action")
		require.Equal(t, "/console/nodes/n1/commands", action)
		hidden := map[string]string{}
		for _, in := range findAll(form, func(n *html.Node) bool { v, _ := attr(n, "type"); return v == "hidden" }) {
			name, _ := attr(in, "name")
			hidden[name], _ = attr(in, "value")
		}
		require.Equal(t, map[string]string{"csrf_token": "csrf-123", "request_id": "console:abc"}, hidden)
		payload := one(t, doc, "command-payload")
		require.Equal(t, d.Command.Payload, text(payload))
		invalid, _ := attr(payload, "aria-invalid")
		require.Equal(t, "true", invalid)
		require.Equal(t, "Not a JSON object.", text(one(t, doc, "payload-error")))
		require.Empty(t, elements(doc, "script"))
		// Every field has a label.
		for _, id := range []string{"command-kind", "command-payload", "command-opid"} {
			require.Len(t, findAll(doc, func(n *html.Node) bool { v, _ := attr(n, "for"); return n.Data == "label" && v == id }), 1, id)
		}
	})

	t.Run("RetiredOffersNoActions", func(t *testing.T) {
		d := sampleDetail()
		d.Node.State = "retired"
		doc := render(t, views.NodePage(signedIn, d))
		require.Empty(t, byTestID(doc, "command-form"))
		require.Empty(t, byTestID(doc, "node-actions"))
	})
}

func TestConfirmPages(t *testing.T) {
	c := views.Confirm{Node: sampleRow("n1", "ready"), RequestID: "console:r", Errors: map[string]string{"confirm": "Tick the box."}}
	doc := render(t, views.RetireConfirmPage(signedIn, c))
	box := one(t, doc, "retire-confirm-box")
	_, required := attr(box, "required")
	require.True(t, required, "the browser asks for the tick before posting")
	require.Equal(t, "Tick the box.", text(one(t, doc, "confirm-error")))
	doc = render(t, views.ReinviteConfirmPage(signedIn, c))
	one(t, doc, "reinvite-confirm-box")
}

func TestBootstrapPage(t *testing.T) {
	doc := render(t, views.BootstrapPage(signedIn, views.Bootstrap{NodeID: "n1", RentalID: "r1", ExpiresAt: now,
		JSON: `{"enrollment_token": "tok"}`, Command: "NODEWARD_AGENT_BOOTSTRAP='…' nodeward-agent"}))
	require.Contains(t, text(one(t, doc, "shown-once")), "will not be shown again")
	require.Contains(t, text(one(t, doc, "bootstrap-json")), `"tok"`)
	require.Contains(t, text(one(t, doc, "agent-command")), "nodeward-agent")
	require.Len(t, findAll(doc, func(n *html.Node) bool { v, _ := attr(n, "data-copy"); return v != "" }), 2)
	require.Len(t, findAll(doc, func(n *html.Node) bool { v, _ := attr(n, "src"); return n.Data == "script" && v == "/static/copy.js" }), 1)

	doc = render(t, views.AlreadyShownPage(signedIn, views.AlreadyShown{NodeID: "n1"}))
	require.Contains(t, text(one(t, doc, "already-shown")), "not shown again")
}

func TestInvitePage(t *testing.T) {
	doc := render(t, views.InvitePage(signedIn, views.InviteForm{RequestID: "console:r", RentalID: `"><b>x`,
		Errors: map[string]string{"generation": "A whole number."}}))
	rental := one(t, doc, "invite-rental")
	v, _ := attr(rental, "value")
	require.Equal(t, `"><b>x`, v)
	require.Empty(t, elements(one(t, doc, "invite-form"), "b"))
	require.Equal(t, "A whole number.", text(one(t, doc, "generation-error")))
	for _, in := range findAll(doc, func(n *html.Node) bool { t, _ := attr(n, "type"); return n.Data == "input" && t == "text" }) {
		id, _ := attr(in, "id")
		require.Len(t, findAll(doc, func(n *html.Node) bool { v, _ := attr(n, "for"); return n.Data == "label" && v == id }), 1, "label for %s", id)
	}
}

func TestOverviewAttention(t *testing.T) {
	ops := make([]views.StateCount, len(views.OperationStates))
	for i, s := range views.OperationStates {
		ops[i] = views.StateCount{State: s, Count: i}
	}
	doc := render(t, views.OverviewPage(signedIn, views.Overview{Counts: counts(1, 5, 2, 0), Summary: views.FleetSummary{
		Available: true, Lapsing: 3, LapseWindow: 30 * time.Second, Operations: ops, PendingCommands: 4, Failed: 6, Refused: 2,
		Lagging: 7, NeverReported: 2}}))
	link := func(id string) string {
		href, _ := attr(elements(one(t, doc, id), "a")[0], "href")
		return href
	}
	require.Equal(t, "3 leases lapsing within 30 s", text(one(t, doc, "lapsing")))
	require.Equal(t, "/console/nodes?state=ready&lease=lapsing", link("lapsing"))
	require.Equal(t, "/console/operations?state=failed", link("failed-ops"))
	require.Equal(t, "/console/operations?family=commands&state=failed", link("refused-commands"))
	require.Equal(t, "3 failed", text(one(t, doc, "ops-failed")))
	require.Equal(t, "/console/operations?state=failed", link("ops-failed"))
	require.Equal(t, "/console/config/lagging", link("config-lagging"))
	require.Contains(t, text(one(t, doc, "config-lagging")), "7 nodes lagging their desired configuration")
	require.Equal(t, "2 more not reported yet", text(one(t, doc, "config-never-reported")))
	require.True(t, strings.HasPrefix(link("pending-commands"), "/console/operations?family=commands"))

	doc = render(t, views.OverviewPage(signedIn, views.Overview{Counts: counts(1, 0, 0, 0)}))
	one(t, doc, "summary-unavailable")
	require.Empty(t, byTestID(doc, "attention"))
}
