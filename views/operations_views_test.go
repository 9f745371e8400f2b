package views_test

import (
	"bytes"
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/a-h/templ"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/html"

	"github.com/nodeward/nodeward/views"
)

const evil = `<script>alert(1)</script><img src=x onerror=alert(2)>`

// renderRaw renders a component and answers the markup.
func renderRaw(t *testing.T, c templ.Component) string {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, c.Render(context.Background(), &buf))
	return buf.String()
}

// requireEscaped: the hostile text appears only as text, never as markup.
func requireEscaped(t *testing.T, c templ.Component) *html.Node {
	t.Helper()
	raw := renderRaw(t, c)
	require.NotContains(t, raw, "<script>alert")
	require.NotContains(t, raw, "<img src=x")
	doc := render(t, c)
	require.Empty(t, findAll(doc, func(n *html.Node) bool {
		if n.Data == "img" {
			v, _ := attr(n, "src")
			return v == "x"
		}
		if n.Data == "script" {
			v, _ := attr(n, "src")
			return v == ""
		}
		return false
	}), "no element came from data")
	return doc
}

func hrefOf(t *testing.T, n *html.Node) string {
	t.Helper()
	v, ok := attr(n, "href")
	require.True(t, ok)
	return v
}

func TestOperationsPage(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ops := views.OperationsView{
		Query: url.Values{"kind": {"node.invite"}, "state": {"failed"}},
		Operations: []views.OperationRow{
			{ID: "op-2", Kind: "node.invite", State: "failed", RequestID: "rid-2", Principal: "admin: " + evil, Target: "node " + evil, CreatedAt: at, ErrorCode: "conflict"},
			{ID: "op-1", Kind: "node.invite", State: "succeeded", RequestID: "rid-1", Principal: "admin: ada", CreatedAt: at, ParentID: "op-0"},
		},
		Paged:       true,
		OlderBefore: "41",
	}
	doc := requireEscaped(t, views.OperationsPage(signedIn, ops))
	rows := byTestID(doc, "operation-row")
	require.Len(t, rows, 2)
	require.Contains(t, text(rows[0]), evil)
	badges := byTestID(doc, "state-badge")
	require.Equal(t, "failed", text(badges[0]))
	cls, _ := attr(badges[0], "class")
	require.Contains(t, cls, "badge-state-failed")
	require.Equal(t, "/console/operations/op-2", hrefOf(t, byTestID(doc, "operation-link")[0]))

	older, err := url.Parse(hrefOf(t, one(t, doc, "operations-older")))
	require.NoError(t, err)
	require.Equal(t, "/console/operations", older.Path)
	require.Equal(t, url.Values{"kind": {"node.invite"}, "state": {"failed"}, "before": {"41"}}, older.Query())
	require.Equal(t, "/console/operations?kind=node.invite&state=failed", hrefOf(t, one(t, doc, "operations-newest")))

	// The form is a GET form with a labelled field for every API filter.
	form := one(t, doc, "operation-filters")
	m, _ := attr(form, "method")
	require.Equal(t, "get", m)
	for _, name := range []string{"package_host_id", "family", "kind", "state", "request_id", "operation_id", "parent", "target_kind", "target_id", "limit"} {
		fields := findAll(form, func(n *html.Node) bool { v, _ := attr(n, "name"); return v == name })
		require.Len(t, fields, 1, name)
		id, _ := attr(fields[0], "id")
		labels := findAll(form, func(n *html.Node) bool { v, _ := attr(n, "for"); return n.Data == "label" && v == id })
		require.Len(t, labels, 1, "label for %s", name)
	}
	selected := findAll(one(t, doc, "filter-state"), func(n *html.Node) bool { _, ok := attr(n, "selected"); return ok })
	require.Len(t, selected, 1)
	require.Equal(t, "failed", text(selected[0]))
	v, _ := attr(one(t, doc, "filter-kind"), "value")
	require.Equal(t, "node.invite", v)

	t.Run("Empty", func(t *testing.T) {
		doc := render(t, views.OperationsPage(signedIn, views.OperationsView{}))
		require.Contains(t, text(one(t, doc, "no-operations")), "No operations yet")
		require.Empty(t, byTestID(doc, "operations-older"))
		require.Empty(t, byTestID(doc, "filter-clear"))
	})

	t.Run("FilterError", func(t *testing.T) {
		doc := requireEscaped(t, views.OperationsPage(signedIn, views.OperationsView{
			Query: url.Values{"state": {evil}}, Error: "query parameter state: " + evil, ErrorField: "state",
		}))
		require.Contains(t, text(one(t, doc, "filter-error")), evil)
		require.Empty(t, byTestID(doc, "no-operations"))
		inv, _ := attr(one(t, doc, "filter-state"), "aria-invalid")
		require.Equal(t, "true", inv, "the refused field is marked")
	})
}

func TestOperationPage(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	v := views.OperationDetailView{
		ID: "op-1", RequestID: "rid-1", Kind: "node.invite", Family: "nodes", State: "failed", Terminal: true,
		PrincipalKind: "package_host", PrincipalID: "ph-1", PrincipalName: evil, HostGeneration: 3,
		Targets:   []views.TargetRow{{Kind: "node", ID: "n-1"}},
		Reason:    evil,
		Operation: "{\n  \"name\": \"" + evil + "\"\n}",
		ErrorCode: "conflict", ErrorMessage: evil, ErrorRetryable: true,
		Counts:    &views.ChildCounts{Total: 4, Succeeded: 2, Failed: 1, Pending: 1},
		CreatedAt: at, Deadline: at,
		Events: []views.EventRow{
			{Cursor: 7, Type: "submitted", At: at, Data: `{"x":"` + evil + `"}`},
			{Cursor: 9, Type: "failed", At: at},
		},
	}
	doc := requireEscaped(t, views.OperationPage(signedIn, v))
	require.Equal(t, evil, text(one(t, doc, "operation-error-message")))
	require.Equal(t, "conflict", text(one(t, doc, "operation-error-code")))
	require.Contains(t, text(one(t, doc, "operation-error-retryable")), "yes")
	require.Equal(t, evil, text(one(t, doc, "operation-reason")))
	require.Contains(t, text(one(t, doc, "operation-body")), evil)
	require.Contains(t, text(one(t, doc, "operation-principal")), evil)
	one(t, doc, "operation-result-none")
	require.Equal(t, "/console/operations?parent=op-1", hrefOf(t, one(t, doc, "children-link")))
	require.Contains(t, text(one(t, doc, "operation-children")), "4 total")
	evs := byTestID(doc, "event-row")
	require.Len(t, evs, 2)
	c, _ := attr(evs[1], "data-cursor")
	require.Equal(t, "9", c)
	// An ended operation: no cancel form, no live script, no watch.
	require.Empty(t, byTestID(doc, "cancel-form"))
	_, watching := attr(one(t, doc, "operation-summary"), "data-watch")
	require.False(t, watching)
	require.Empty(t, findAll(doc, func(n *html.Node) bool { s, _ := attr(n, "src"); return s == "/static/operation.js" }))

	t.Run("Live", func(t *testing.T) {
		v := views.OperationDetailView{ID: "op/2", State: "running", CreatedAt: at, Deadline: at}
		doc := render(t, views.OperationPage(signedIn, v))
		w, _ := attr(one(t, doc, "operation-summary"), "data-watch")
		require.Equal(t, "/api/v1/operations/op%2F2/watch", w)
		form := one(t, doc, "cancel-form")
		action, _ := attr(form, "action")
		require.Equal(t, "/console/operations/op%2F2/cancel", action)
		hidden := findAll(form, func(n *html.Node) bool { v, _ := attr(n, "name"); return v == "csrf_token" })
		require.Len(t, hidden, 1)
		label := findAll(form, func(n *html.Node) bool { f, _ := attr(n, "for"); return n.Data == "label" && f == "cancel-reason" })
		require.Len(t, label, 1)
		require.Len(t, findAll(doc, func(n *html.Node) bool { s, _ := attr(n, "src"); return s == "/static/operation.js" }), 1)
		require.Empty(t, byTestID(doc, "operation-error"))
	})
}

func TestSecretAuditPage(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	v := views.SecretAuditView{
		Query:   url.Values{"action": {"reveal"}},
		Actions: []string{"seal", "use", "reveal", "expire"}, Outcomes: []string{"ok", "denied"}, PrincipalKinds: []string{"admin", "package_host"},
		Entries: []views.SecretAuditRow{
			{At: at, Action: "reveal", Outcome: "denied", PrincipalKind: "package_host", PrincipalID: "ph-1", HandleDigest: "0123456789abcdef",
				RequestID: "r-1", OperationID: "op-1", TargetKind: "package_host", TargetID: "ph-1", Field: evil},
		},
		OlderBefore: "12",
	}
	doc := requireEscaped(t, views.SecretAuditPage(signedIn, v))
	require.Len(t, byTestID(doc, "secret-audit-row"), 1)
	require.Equal(t, evil, text(one(t, doc, "secret-field")))
	require.Equal(t, "/console/operations/op-1", hrefOf(t, one(t, doc, "secret-operation")))
	require.Equal(t, "/console/secret-audit?action=reveal&before=12", hrefOf(t, one(t, doc, "secret-older")))
	for _, name := range []string{"principal_kind", "principal_id", "operation_id", "target_kind", "target_id", "action", "outcome", "limit"} {
		require.Len(t, byTestID(doc, "sfilter-"+name), 1, name)
	}

	doc = render(t, views.SecretAuditPage(signedIn, views.SecretAuditView{}))
	require.Contains(t, text(one(t, doc, "no-secret-audit")), "No secrets handled yet")
}

func TestPackageHostsPage(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	v := views.PackageHostsView{
		Families: []string{"nodes", "commands"}, RequestID: "console-1",
		Hosts: []views.PackageHostRow{
			{ID: "ph-1", Name: evil, Families: []string{"commands", "nodes"}, Generation: 2, CreatedAt: at, TokenRequestID: "console-2"},
			{ID: "ph-2", Name: "gone", Families: []string{"nodes"}, Generation: 4, CreatedAt: at, RevokedAt: &at},
		},
		Name: evil, Checked: map[string]bool{"nodes": true}, NameError: "taken",
	}
	doc := requireEscaped(t, views.PackageHostsPage(signedIn, v))
	row := one(t, doc, "host-ph-1")
	require.Equal(t, evil, text(one(t, row, "host-row-name")))
	require.Equal(t, "commands, nodes", text(one(t, row, "host-row-families")))
	require.Equal(t, "2", text(one(t, row, "host-row-generation")))
	require.Equal(t, "active", text(one(t, row, "host-status")))
	one(t, row, "host-revoke")
	gone := one(t, doc, "host-ph-2")
	require.Equal(t, "revoked", text(one(t, gone, "host-status")))
	require.Empty(t, byTestID(gone, "host-revoke"), "a revoked host cannot be revoked again")
	one(t, gone, "host-new-token")

	require.Equal(t, "taken", text(one(t, doc, "host-name-error")))
	inv, _ := attr(one(t, doc, "host-name"), "aria-invalid")
	require.Equal(t, "true", inv)
	_, checked := attr(one(t, doc, "host-family-nodes"), "checked")
	require.True(t, checked)
	_, checked = attr(one(t, doc, "host-family-commands"), "checked")
	require.False(t, checked)

	// Every form posts with the CSRF token.
	for _, f := range findAll(doc, func(n *html.Node) bool { return n.Data == "form" }) {
		m, _ := attr(f, "method")
		require.Equal(t, "post", m)
		hidden := findAll(f, func(n *html.Node) bool { v, _ := attr(n, "name"); return v == "csrf_token" })
		require.Len(t, hidden, 1)
	}

	doc = render(t, views.PackageHostsPage(signedIn, views.PackageHostsView{Families: []string{"nodes"}}))
	require.Contains(t, text(one(t, doc, "no-hosts")), "No package hosts yet")

	t.Run("Issued", func(t *testing.T) {
		doc := requireEscaped(t, views.HostIssuedPage(signedIn, views.HostIssuedView{Created: true, ID: "ph-1", Name: evil,
			Families: []string{"nodes"}, Generation: 1, Token: "nwp_secret", OperationID: "op-1"}))
		tok, _ := attr(one(t, doc, "host-token"), "value")
		require.Equal(t, "nwp_secret", tok)
		require.Contains(t, text(one(t, doc, "host-token-once")), "will not be shown again")
		require.Len(t, findAll(doc, func(n *html.Node) bool { v, _ := attr(n, "data-copy"); return v == "host-token" }), 1)
	})

	t.Run("ConfirmRevoke", func(t *testing.T) {
		doc := requireEscaped(t, views.RevokeHostPage(signedIn, views.RevokeConfirmView{Host: v.Hosts[0], RequestID: "console-3"}))
		require.Equal(t, evil, text(one(t, doc, "host-revoke-name")))
		form := one(t, doc, "host-revoke-submit").Parent
		confirm := findAll(form, func(n *html.Node) bool { v, _ := attr(n, "name"); return v == "confirm" })
		require.Len(t, confirm, 1)
		require.Equal(t, "/console/package-hosts", hrefOf(t, one(t, doc, "host-revoke-back")))
	})
}
