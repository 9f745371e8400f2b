package views_test

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/a-h/templ"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/html"

	"github.com/nodeward/nodeward/views"
)

func render(t *testing.T, c templ.Component) *html.Node {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, c.Render(context.Background(), &buf))
	doc, err := html.Parse(&buf)
	require.NoError(t, err)
	return doc
}

func findAll(n *html.Node, match func(*html.Node) bool) []*html.Node {
	var out []*html.Node
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode && match(n) {
			out = append(out, n)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(n)
	return out
}

func attr(n *html.Node, name string) (string, bool) {
	for _, a := range n.Attr {
		if a.Key == name {
			return a.Val, true
		}
	}
	return "", false
}

func byTestID(doc *html.Node, id string) []*html.Node {
	return findAll(doc, func(n *html.Node) bool { v, _ := attr(n, "data-testid"); return v == id })
}

func one(t *testing.T, doc *html.Node, id string) *html.Node {
	t.Helper()
	ns := byTestID(doc, id)
	require.Len(t, ns, 1, "elements with data-testid=%q", id)
	return ns[0]
}

var spaces = regexp.MustCompile(`\s+`)

func text(n *html.Node) string {
	var b strings.Builder
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.TextNode {
			b.WriteString(n.Data)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(n)
	return strings.TrimSpace(spaces.ReplaceAllString(b.String(), " "))
}

var signedIn = views.Shell{Username: "ada", CSRFToken: "csrf-123", Active: views.NavOverview}

func counts(n ...int) []views.StateCount {
	out := make([]views.StateCount, len(views.NodeStates))
	for i, s := range views.NodeStates {
		out[i] = views.StateCount{State: s, Count: n[i]}
	}
	return out
}

func TestOverview(t *testing.T) {
	t.Run("EmptyFleet", func(t *testing.T) {
		doc := render(t, views.OverviewPage(signedIn, views.Overview{Counts: counts(0, 0, 0, 0), BaseURL: "https://cp.example"}))
		require.Contains(t, text(one(t, doc, "empty-fleet")), "No nodes yet")
		require.Contains(t, text(one(t, doc, "invite-example")), "https://cp.example/api/v1/nodes/invitations")
		require.Empty(t, byTestID(doc, "state-counts"))
	})

	t.Run("CountsAndActivity", func(t *testing.T) {
		at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
		doc := render(t, views.OverviewPage(signedIn, views.Overview{
			Counts: counts(1, 5, 2, 0),
			Recent: []views.Activity{
				{At: at, Actor: "ada", Summary: "invited node n-1", Href: "/console/nodes/n-1"},
				{At: at, Summary: "node n-2 lost its lease"},
			},
		}))
		require.Empty(t, byTestID(doc, "empty-fleet"))
		require.Equal(t, "5 ready", text(one(t, doc, "state-ready")))
		require.Equal(t, "2 lost", text(one(t, doc, "state-lost")))
		require.Equal(t, "8 nodes in all", text(one(t, doc, "state-total")))
		items := findAll(one(t, doc, "recent-activity"), func(n *html.Node) bool { return n.Data == "li" })
		require.Len(t, items, 2)
		require.Contains(t, text(items[0]), "2026-03-04 05:06:07 UTC")
		links := findAll(items[0], func(n *html.Node) bool { return n.Data == "a" })
		require.Len(t, links, 1)
		href, _ := attr(links[0], "href")
		require.Equal(t, "/console/nodes/n-1", href)
	})
}

func TestFrame(t *testing.T) {
	t.Run("SignedInHasNavAndLogout", func(t *testing.T) {
		doc := render(t, views.OverviewPage(signedIn, views.Overview{}))
		require.Equal(t, "ada", text(one(t, doc, "username")))
		for _, item := range views.Nav {
			a := one(t, doc, "nav-"+item.Key)
			cur, ok := attr(a, "aria-current")
			require.Equal(t, item.Key == views.NavOverview, ok && cur == "page", item.Key)
		}
		form := one(t, doc, "logout-form")
		method, _ := attr(form, "method")
		require.Equal(t, "post", method)
		hidden := findAll(form, func(n *html.Node) bool { v, _ := attr(n, "name"); return v == "csrf_token" })
		require.Len(t, hidden, 1)
		v, _ := attr(hidden[0], "value")
		require.Equal(t, "csrf-123", v)
	})

	t.Run("AnonymousHasNoNav", func(t *testing.T) {
		doc := render(t, views.LoginPage(views.LoginView{}))
		require.Empty(t, byTestID(doc, "username"))
		require.Empty(t, byTestID(doc, "logout"))
		require.Empty(t, byTestID(doc, "nav-tokens"))
	})

	t.Run("EveryStateChangingFormCarriesCSRF", func(t *testing.T) {
		now := time.Now()
		pages := []templ.Component{
			views.OverviewPage(signedIn, views.Overview{}),
			views.TokensPage(signedIn, views.TokensView{Tokens: []views.TokenRow{{ID: "t1", Name: "a", CreatedAt: now}}}),
			views.TokenCreatedPage(signedIn, views.TokenCreatedView{Name: "a", Token: "nwa_x"}),
			views.AuditPage(signedIn, views.AuditView{}),
			views.ErrorPage(signedIn, views.ErrorView{Status: 404, Title: "Not found"}),
		}
		for _, p := range pages {
			doc := render(t, p)
			forms := findAll(doc, func(n *html.Node) bool { return n.Data == "form" })
			require.NotEmpty(t, forms)
			for _, f := range forms {
				if m, _ := attr(f, "method"); m != "post" {
					continue
				}
				hidden := findAll(f, func(n *html.Node) bool { v, _ := attr(n, "name"); return v == "csrf_token" })
				require.Len(t, hidden, 1)
			}
		}
	})

	t.Run("NoInlineScriptOrStyle", func(t *testing.T) {
		// The CSP is script-src 'self'; style-src 'self'.
		for _, p := range []templ.Component{
			views.LoginPage(views.LoginView{Error: "x"}),
			views.SetupPage(views.SetupView{MinPasswordLen: 12}),
			views.OverviewPage(signedIn, views.Overview{Counts: counts(1, 1, 1, 1)}),
			views.TokenCreatedPage(signedIn, views.TokenCreatedView{Name: "a", Token: "nwa_x"}),
		} {
			doc := render(t, p)
			for _, s := range findAll(doc, func(n *html.Node) bool { return n.Data == "script" }) {
				src, _ := attr(s, "src")
				require.True(t, strings.HasPrefix(src, "/static/"), "script without a static src")
				require.Nil(t, s.FirstChild, "inline script")
			}
			require.Empty(t, findAll(doc, func(n *html.Node) bool { return n.Data == "style" }))
			require.Empty(t, findAll(doc, func(n *html.Node) bool { _, ok := attr(n, "style"); return ok }))
		}
	})
}

func TestEscaping(t *testing.T) {
	evil := `<script>alert(1)</script>`
	var buf bytes.Buffer
	require.NoError(t, views.LoginPage(views.LoginView{Username: evil, Next: `"><script>`}).Render(context.Background(), &buf))
	require.NotContains(t, buf.String(), "<script>alert")
	require.NotContains(t, buf.String(), `"><script>`)

	doc := render(t, views.OverviewPage(signedIn, views.Overview{
		Counts: counts(1, 0, 0, 0),
		Recent: []views.Activity{{Summary: "x", Href: "javascript:alert(1)"}},
	}))
	a := findAll(one(t, doc, "recent-activity"), func(n *html.Node) bool { return n.Data == "a" })
	require.Len(t, a, 1)
	href, _ := attr(a[0], "href")
	require.NotContains(t, href, "javascript:")
}

func TestTokens(t *testing.T) {
	now := time.Now()
	doc := render(t, views.TokensPage(signedIn, views.TokensView{
		Tokens: []views.TokenRow{
			{ID: "live", Name: "deploy", CreatedAt: now, LastUsedAt: &now},
			{ID: "dead", Name: "old", CreatedAt: now, RevokedAt: &now},
		},
		Name: "bad", NameError: "required",
	}))
	require.Equal(t, "active", text(one(t, one(t, doc, "token-live"), "token-status")))
	require.Len(t, byTestID(one(t, doc, "token-live"), "token-revoke"), 1)
	require.Equal(t, "revoked", text(one(t, one(t, doc, "token-dead"), "token-status")))
	require.Empty(t, byTestID(one(t, doc, "token-dead"), "token-revoke"))
	require.Equal(t, "required", text(one(t, doc, "name-error")))
	v, _ := attr(one(t, doc, "token-name"), "value")
	require.Equal(t, "bad", v)
}

func TestAuditPager(t *testing.T) {
	first := render(t, views.AuditPage(signedIn, views.AuditView{
		Entries: []views.AuditRow{{ID: 9, Action: "login", Outcome: "failed"}}, OlderBefore: 9,
	}))
	href, _ := attr(one(t, first, "audit-older"), "href")
	require.Equal(t, "/console/audit?before=9", href)
	require.Empty(t, byTestID(first, "audit-newest"))
	require.Equal(t, "failed", text(one(t, first, "audit-outcome")))

	last := render(t, views.AuditPage(signedIn, views.AuditView{Paged: true}))
	require.Empty(t, byTestID(last, "audit-older"))
	one(t, last, "audit-newest")
	one(t, last, "no-audit")
}

func TestAuditCoalescedCount(t *testing.T) {
	doc := render(t, views.AuditPage(signedIn, views.AuditView{Entries: []views.AuditRow{
		{ID: 2, Action: "login", Outcome: "failed", Count: 37},
		{ID: 1, Action: "login", Outcome: "ok", Count: 1},
	}}))
	require.Equal(t, "×37", text(one(t, doc, "audit-count")), "only the coalesced entry shows a count")
}
