package views_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/html"

	"github.com/nodeward/nodeward/views"
)

const hostile = `<img src=x onerror=alert(1)></textarea><script>alert(2)</script>`

func configuredDetail() views.NodeDetail {
	d := sampleDetail()
	d.Config = views.ConfigPanel{Verdict: "failed", Lagging: true, AppliedRevision: 3,
		Desired: &views.DesiredConfig{Revision: 4, Hash: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
			Format: "app/v1", SizeBytes: 2048, UpdatedAt: now.Add(-time.Minute), OperationID: "op-cfg",
			Document: "{\n  \"password\": \"[sealed]\",\n  \"note\": \"" + hostile + "\"\n}"},
		Reported: &views.ConfigReportRow{Revision: 4, Hash: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
			State: "failed", Message: hostile, ObservedAt: now.Add(-30 * time.Second)}}
	d.ConfigForm = views.ConfigForm{RequestID: "console:cfg", ClearRequestID: "console:clear", Format: "app/v1"}
	d.Caps = views.Capabilities{Known: true, List: []string{"commands.v1", "config.v1", "diag.v1"}, Diag: true}
	d.Diagnose = views.DiagnoseForms{RequestIDs: map[string]string{}}
	for _, a := range views.DiagnoseActions {
		d.Diagnose.RequestIDs[a.Action] = "console:diag-" + a.Action
	}
	return d
}

// noHostileMarkup asserts the hostile text made no elements.
func noHostileMarkup(t *testing.T, doc *html.Node) {
	t.Helper()
	require.Empty(t, findAll(doc, func(n *html.Node) bool { v, _ := attr(n, "src"); return n.Data == "img" && v == "x" }))
	require.Empty(t, elements(doc, "script"))
}

func TestNodeConfigPanel(t *testing.T) {
	t.Run("DesiredAndReport", func(t *testing.T) {
		doc := render(t, views.NodePage(signedIn, configuredDetail()))
		require.Equal(t, "4", text(one(t, doc, "config-revision")))
		hash := one(t, doc, "config-hash")
		require.Equal(t, "0123456789ab…", text(hash))
		title, _ := attr(hash, "title")
		require.Len(t, title, 64)
		require.Equal(t, "app/v1", text(one(t, doc, "config-format")))
		href, _ := attr(one(t, doc, "config-operation"), "href")
		require.Equal(t, "/console/operations/op-cfg", href)
		require.Contains(t, text(one(t, doc, "config-document")), `"[sealed]"`)
		require.Contains(t, text(one(t, doc, "config-document")), hostile)
		require.Equal(t, "failed", text(one(t, doc, "config-verdict")))
		require.Equal(t, hostile, text(one(t, doc, "config-message")))
		require.Contains(t, text(one(t, doc, "config-lagging")), "yes")
		require.Equal(t, "3", text(one(t, doc, "config-applied-revision")))
		noHostileMarkup(t, doc)
	})

	t.Run("Empty", func(t *testing.T) {
		d := sampleDetail()
		d.Config = views.ConfigPanel{Verdict: "none"}
		doc := render(t, views.NodePage(signedIn, d))
		require.Contains(t, text(one(t, doc, "config-none")), "No configuration is set")
		one(t, doc, "config-no-report")
		require.Equal(t, "none yet", text(one(t, doc, "config-applied-revision")))
		require.Empty(t, byTestID(doc, "config-clear-form"))
		d.Config = views.ConfigPanel{Unavailable: true}
		doc = render(t, views.NodePage(signedIn, d))
		one(t, doc, "config-unavailable")
	})

	t.Run("FormErrorsOnTheirFields", func(t *testing.T) {
		d := configuredDetail()
		d.ConfigForm.Document = hostile
		d.ConfigForm.Errors = map[string]string{"document": "Not valid JSON.", "format": "Too long."}
		doc := render(t, views.NodePage(signedIn, d))
		require.Equal(t, hostile, text(one(t, doc, "config-document-input")))
		require.Equal(t, "Not valid JSON.", text(one(t, doc, "document-error")))
		require.Equal(t, "Too long.", text(one(t, doc, "format-error")))
		desc, _ := attr(one(t, doc, "config-document-input"), "aria-describedby")
		require.Contains(t, desc, "document-error")
		noHostileMarkup(t, doc)
	})

	t.Run("EveryFieldLabelledEveryPostFormCSRF", func(t *testing.T) {
		doc := render(t, views.NodePage(signedIn, configuredDetail()))
		fields := findAll(doc, func(n *html.Node) bool {
			typ, _ := attr(n, "type")
			return (n.Data == "input" && typ != "hidden" && typ != "submit") || n.Data == "textarea" || n.Data == "select"
		})
		require.NotEmpty(t, fields)
		for _, f := range fields {
			id, _ := attr(f, "id")
			require.NotEmpty(t, id, "a field without an id cannot be labelled")
			require.Len(t, findAll(doc, func(n *html.Node) bool { v, _ := attr(n, "for"); return n.Data == "label" && v == id }), 1, "label for %s", id)
		}
		forms := findAll(doc, func(n *html.Node) bool { m, _ := attr(n, "method"); return n.Data == "form" && m == "post" })
		require.GreaterOrEqual(t, len(forms), 2+len(views.DiagnoseActions), "config, clear and a form per diagnose action at least")
		for _, f := range forms {
			action, _ := attr(f, "action")
			csrf := findAll(f, func(n *html.Node) bool { v, _ := attr(n, "name"); return n.Data == "input" && v == "csrf_token" })
			require.Len(t, csrf, 1, "csrf field in %s", action)
			v, _ := attr(csrf[0], "value")
			require.Equal(t, "csrf-123", v)
		}
		for _, a := range views.DiagnoseActions {
			form := one(t, doc, "diagnose-form-"+a.Action)
			ids := findAll(form, func(n *html.Node) bool { v, _ := attr(n, "name"); return v == "request_id" })
			require.Len(t, ids, 1)
			v, _ := attr(ids[0], "value")
			require.Equal(t, "console:diag-"+a.Action, v, "each form its own request id")
		}
	})
}

func TestDiagnosePanel(t *testing.T) {
	t.Run("Capabilities", func(t *testing.T) {
		d := configuredDetail()
		d.Caps = views.Capabilities{Known: true, Legacy: true, List: []string{"commands.v1", "config.v1"}}
		doc := render(t, views.NodePage(signedIn, d))
		require.Contains(t, text(one(t, doc, "capabilities")), "read as commands.v1 + config.v1")
		one(t, doc, "diagnose-unsupported")
		for _, fs := range elements(one(t, doc, "diagnose"), "fieldset") {
			_, disabled := attr(fs, "disabled")
			require.True(t, disabled)
		}
		d.Caps = views.Capabilities{Diag: true}
		doc = render(t, views.NodePage(signedIn, d))
		require.Contains(t, text(one(t, doc, "capabilities")), "not reported yet")
		one(t, doc, "diagnose-unknown")
	})

	t.Run("ErrorsOnTheSubmittedForm", func(t *testing.T) {
		d := configuredDetail()
		d.Diagnose.Action = "connect"
		d.Diagnose.Values = map[string]string{"host": hostile, "port": "70000"}
		d.Diagnose.Errors = map[string]string{"port": "required: 1 to 65535"}
		d.Diagnose.Error = "capability_missing: " + hostile
		doc := render(t, views.NodePage(signedIn, d))
		require.Equal(t, "required: 1 to 65535", text(one(t, doc, "diag-connect-port-error")))
		v, _ := attr(one(t, doc, "diag-connect-host"), "value")
		require.Equal(t, hostile, v)
		require.Equal(t, "capability_missing: "+hostile, text(one(t, doc, "diagnose-error")))
		v, _ = attr(one(t, doc, "diag-resolve-names"), "aria-invalid")
		require.Empty(t, v)
		noHostileMarkup(t, doc)
	})
}

func TestEvidencePanel(t *testing.T) {
	v := views.OperationDetailView{ID: "op-1", Kind: "node.diagnose", State: "succeeded", Terminal: true,
		Readable: &views.Evidence{Title: "Evidence: disk",
			Facts: []views.EvidenceFact{{Label: "Ran at", Value: "2026-01-01T00:00:00Z"}, {Label: "Result", Value: hostile, Tone: "bad"}},
			Tables: []views.EvidenceTable{{Caption: "Disk usage", TestID: "evidence-disk", Columns: []string{"Path", "Error"},
				Rows: [][]string{{"/var/lib/x", hostile}}}, {Caption: "Nothing", TestID: "evidence-none", Empty: "No rows."}}}}
	doc := render(t, views.OperationPage(signedIn, v))
	require.Equal(t, "Evidence: disk", text(elements(one(t, doc, "readable-result"), "h2")[0]))
	require.Equal(t, hostile, text(one(t, doc, "evidence-result")))
	rows := byTestID(doc, "evidence-disk-row")
	require.Len(t, rows, 1)
	require.Equal(t, hostile, text(elements(rows[0], "td")[1]))
	require.Equal(t, "No rows.", text(one(t, doc, "evidence-none-empty")))
	noHostileMarkup(t, doc)

	v.Readable = &views.Evidence{Title: "Evidence: mystery", Raw: `{"x": "` + hostile + `"}`}
	doc = render(t, views.OperationPage(signedIn, v))
	require.Contains(t, text(one(t, doc, "evidence-raw")), hostile)
	noHostileMarkup(t, doc)
}

func TestLaggingPage(t *testing.T) {
	rep := now.Add(-time.Minute)
	doc := render(t, views.LaggingPage(signedIn, views.LaggingView{Now: now, Count: 2, NeverReported: 5,
		Nodes: []views.LaggingRow{{NodeID: "n2", DesiredRevision: 3, AppliedRevision: 1, Verdict: "stale", ReportedAt: &rep},
			{NodeID: "n1", DesiredRevision: 2, AppliedRevision: 1, Verdict: "failed", ReportedAt: &rep}}, NextBefore: "n1"}))
	require.Equal(t, "2 lagging", text(one(t, doc, "lagging-count")))
	require.Contains(t, text(one(t, doc, "never-reported-count")), "5")
	href, _ := attr(byTestID(one(t, doc, "lagging-n2"), "lagging-node-link")[0], "href")
	require.Equal(t, "/console/nodes/n2", href)
	require.Equal(t, "stale", text(byTestID(one(t, doc, "lagging-n2"), "config-verdict")[0]))
	href, _ = attr(one(t, doc, "lagging-next"), "href")
	require.Equal(t, "/console/config/lagging?before=n1", href)

	doc = render(t, views.LaggingPage(signedIn, views.LaggingView{Now: now}))
	require.Contains(t, text(one(t, doc, "no-lagging")), "No node is lagging")
}
