package handlers_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/html"

	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/handlers"
	"github.com/nodeward/nodeward/internal/testclock"
	"github.com/nodeward/nodeward/keys"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/metrics"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
	"github.com/nodeward/nodeward/secrets"
	"github.com/nodeward/nodeward/static"
	"github.com/nodeward/nodeward/views"
)

// clock is the tests' settable clock.
type clock = testclock.Clock

const (
	adminName     = "ada"
	adminPassword = "correct horse battery staple"
)

// console is one test's bundle: the real router over a real auth service
// and database.
type console struct {
	t       *testing.T
	handler http.Handler
	auth    *auth.Service
	clock   *clock
}

type consoleOpts struct {
	secureCookies bool
	noAdmin       bool
}

func newConsole(t *testing.T, db *models.DB, opts consoleOpts) *console {
	t.Helper()
	clk := testclock.New(time.Now().UTC().Truncate(time.Second))
	svc := auth.New(auth.Options{Store: models.NewAuthStore(db), Keys: keys.NewRing(bytes.Repeat([]byte{7}, 32)), Now: clk.Now})
	if !opts.noAdmin {
		_, err := svc.CreateAdmin(context.Background(), adminName, adminPassword)
		require.NoError(t, err)
	}
	ring := keys.NewRing(bytes.Repeat([]byte{7}, 32))
	m := metrics.New(nil)
	fs := models.NewFleetStore(db, "console-test", nil)
	fl := fleet.New(fleet.Options{Store: fs, Keys: ring, Now: clk.Now, Metrics: m})
	// The ledger and secrets serve the operations, nodes and secret audit
	// pages (no dispatcher runs).
	sec := secrets.New(secrets.Options{Store: models.NewSecretsStore(db), Keys: ring, Now: clk.Now})
	lg := ledger.New(ledger.Options{Store: models.NewLedgerStore(fs), Kinds: ledger.NewRegistry(ledger.ServedKinds(fl)...),
		Replica: "console-test", Now: clk.Now, Metrics: m, Secrets: sec})
	h := handlers.New(handlers.Deps{
		Ready: db, Auth: svc, Fleet: fl, Ledger: lg, Secrets: sec, Metrics: m, Static: static.Files,
		SecureCookies: opts.secureCookies,
	})
	return &console{t: t, handler: h, auth: svc, clock: clk}
}

// request is one browser-like request.
type request struct {
	method  string
	path    string
	form    url.Values
	cookie  string
	headers map[string]string
}

func (c *console) do(rq request) *http.Response {
	c.t.Helper()
	var body io.Reader
	if rq.form != nil {
		body = strings.NewReader(rq.form.Encode())
	}
	if rq.method == "" {
		rq.method = http.MethodGet
	}
	r := httptest.NewRequest(rq.method, rq.path, body)
	if rq.form != nil {
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if rq.cookie != "" {
		r.AddCookie(&http.Cookie{Name: handlers.SessionCookie, Value: rq.cookie})
	}
	for k, v := range rq.headers {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	c.handler.ServeHTTP(w, r)
	return w.Result()
}

func (c *console) get(path, cookie string) *http.Response {
	return c.do(request{path: path, cookie: cookie})
}

func (c *console) post(path, cookie string, form url.Values) *http.Response {
	if form == nil {
		form = url.Values{}
	}
	return c.do(request{method: http.MethodPost, path: path, cookie: cookie, form: form})
}

// login signs in and answers the session cookie.
func (c *console) login() string {
	c.t.Helper()
	res := c.post("/console/login", "", url.Values{"username": {adminName}, "password": {adminPassword}})
	require.Equal(c.t, http.StatusSeeOther, res.StatusCode)
	ck := sessionCookie(res)
	require.NotNil(c.t, ck, "no session cookie")
	return ck.Value
}

// page reads an HTML answer.
func (c *console) page(res *http.Response) *html.Node {
	c.t.Helper()
	defer res.Body.Close()
	require.Equal(c.t, "text/html; charset=utf-8", res.Header.Get("Content-Type"))
	doc, err := html.Parse(res.Body)
	require.NoError(c.t, err)
	return doc
}

// csrf is the CSRF token of a signed-in page.
func (c *console) csrf(cookie string) string {
	c.t.Helper()
	doc := c.page(c.get("/console/tokens", cookie))
	n := findAll(doc, func(n *html.Node) bool { return attr(n, "name") == "csrf_token" })
	require.NotEmpty(c.t, n, "no CSRF field")
	return attr(n[0], "value")
}

// whoami calls the API with a console cookie or an API token.
func (c *console) whoami(cookie, token string) int {
	r := httptest.NewRequest(http.MethodGet, "/api/v1/whoami", nil)
	if cookie != "" {
		r.AddCookie(&http.Cookie{Name: handlers.SessionCookie, Value: cookie})
	}
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	w := httptest.NewRecorder()
	c.handler.ServeHTTP(w, r)
	return w.Code
}

func (c *console) tokens() []auth.APIToken {
	rows, err := c.auth.ListTokens(context.Background(), nil, 0)
	require.NoError(c.t, err)
	return rows
}

func (c *console) audit() []auth.AuditEntry {
	rows, err := c.auth.AuditPage(context.Background(), 0, 500)
	require.NoError(c.t, err)
	return rows
}

func sessionCookie(res *http.Response) *http.Cookie {
	for _, ck := range res.Cookies() {
		if ck.Name == handlers.SessionCookie {
			return ck
		}
	}
	return nil
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

func byTestID(doc *html.Node, id string) []*html.Node {
	return findAll(doc, func(n *html.Node) bool { return attr(n, "data-testid") == id })
}

// one returns the one element with the test id.
func one(t *testing.T, doc *html.Node, id string) *html.Node {
	t.Helper()
	ns := byTestID(doc, id)
	require.Len(t, ns, 1, "elements with data-testid=%q", id)
	return ns[0]
}

func attr(n *html.Node, name string) string {
	for _, a := range n.Attr {
		if a.Key == name {
			return a.Val
		}
	}
	return ""
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

func requireRedirect(t *testing.T, res *http.Response, location string) {
	t.Helper()
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, location, res.Header.Get("Location"))
}

func TestConsoleLogin(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		t.Run("SetsSessionCookie", func(t *testing.T) {
			for _, secure := range []bool{false, true} {
				// The second round reuses the database and its administrator.
				c := newConsole(t, db, consoleOpts{secureCookies: secure, noAdmin: secure})
				res := c.post("/console/login", "", url.Values{"username": {adminName}, "password": {adminPassword}})
				requireRedirect(t, res, "/console/")
				ck := sessionCookie(res)
				require.NotNil(t, ck)
				require.NotEmpty(t, ck.Value)
				require.True(t, ck.HttpOnly)
				require.Equal(t, http.SameSiteStrictMode, ck.SameSite)
				require.Equal(t, "/", ck.Path)
				require.Equal(t, secure, ck.Secure)
				require.WithinDuration(t, c.clock.Now().Add(auth.DefaultSessionTTL), ck.Expires, 2*time.Second)

				doc := c.page(c.get("/console/", ck.Value))
				require.Equal(t, adminName, text(one(t, doc, "username")))
				one(t, doc, "overview")
				require.Contains(t, text(one(t, doc, "empty-fleet")), "No nodes yet")
			}
		})

		t.Run("WrongPasswordIs401AndAudited", func(t *testing.T) {
			c := newConsole(t, db, consoleOpts{noAdmin: true})
			wrongPw := c.post("/console/login", "", url.Values{"username": {adminName}, "password": {"not the password"}})
			require.Equal(t, http.StatusUnauthorized, wrongPw.StatusCode)
			require.Nil(t, sessionCookie(wrongPw))
			msg := text(one(t, c.page(wrongPw), "flash"))

			unknown := c.post("/console/login", "", url.Values{"username": {"nobody"}, "password": {adminPassword}})
			require.Equal(t, http.StatusUnauthorized, unknown.StatusCode)
			// Nothing tells which part was wrong.
			require.Equal(t, msg, text(one(t, c.page(unknown), "flash")))

			// One client's refusals are one entry, counting both.
			var rows, failed int64
			for _, a := range c.audit() {
				if a.Action == "login" && a.Outcome == "failed" {
					rows++
					failed += a.Count
				}
			}
			require.Equal(t, int64(1), rows)
			require.Equal(t, int64(2), failed)
		})

		t.Run("RateLimitedIs429", func(t *testing.T) {
			c := newConsole(t, db, consoleOpts{noAdmin: true})
			form := url.Values{"username": {"mallory"}, "password": {"guess guess guess"}}
			var last *http.Response
			for i := 0; i < 10; i++ {
				last = c.post("/console/login", "", form)
				if last.StatusCode != http.StatusUnauthorized {
					break
				}
			}
			require.Equal(t, http.StatusTooManyRequests, last.StatusCode)
			require.NotEmpty(t, last.Header.Get("Retry-After"))
			one(t, c.page(last), "login-form")
		})

		t.Run("ReturnsToLocalNextOnly", func(t *testing.T) {
			c := newConsole(t, db, consoleOpts{noAdmin: true})
			for next, want := range map[string]string{
				"/console/audit?before=5": "/console/audit?before=5",
				"//evil.example/console/": "/console/",
				"https://evil.example/":   "/console/",
				"/api/v1/whoami":          "/console/",
				"/console/../x":           "/console/",
				"/\\evil.example":         "/console/",
			} {
				res := c.post("/console/login", "", url.Values{
					"username": {adminName}, "password": {adminPassword}, "next": {next},
				})
				requireRedirect(t, res, want)
			}
		})

		t.Run("SignedInLoginPageRedirects", func(t *testing.T) {
			c := newConsole(t, db, consoleOpts{noAdmin: true})
			cookie := c.login()
			requireRedirect(t, c.get("/console/login?next=%2Fconsole%2Ftokens", cookie), "/console/tokens")
		})
	})
}

func TestConsoleSession(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		t.Run("AnonymousPageRedirectsToLogin", func(t *testing.T) {
			c := newConsole(t, db, consoleOpts{})
			requireRedirect(t, c.get("/console/", ""), "/console/login?next=%2Fconsole%2F")
			requireRedirect(t, c.get("/console/audit?before=9", ""), "/console/login?next=%2Fconsole%2Faudit%3Fbefore%3D9")
			requireRedirect(t, c.get("/console/tokens", "forged.jwt.value"), "/console/login?next=%2Fconsole%2Ftokens")
			requireRedirect(t, c.post("/console/tokens", "", url.Values{"name": {"x"}}), "/console/login")
			require.Empty(t, c.tokens())

			// The login page carries next through the form.
			doc := c.page(c.get("/console/login?next=%2Fconsole%2Ftokens", ""))
			form := one(t, doc, "login-form")
			hidden := findAll(form, func(n *html.Node) bool { return attr(n, "name") == "next" })
			require.Len(t, hidden, 1)
			require.Equal(t, "/console/tokens", attr(hidden[0], "value"))
		})

		t.Run("LogoutRevokesTheSession", func(t *testing.T) {
			c := newConsole(t, db, consoleOpts{noAdmin: true})
			cookie := c.login()
			require.Equal(t, http.StatusOK, c.whoami(cookie, ""))

			res := c.post("/console/logout", cookie, url.Values{"csrf_token": {c.csrf(cookie)}})
			requireRedirect(t, res, "/console/login")
			cleared := sessionCookie(res)
			require.NotNil(t, cleared)
			require.Empty(t, cleared.Value)
			require.Less(t, cleared.MaxAge, 0)

			// The old cookie is dead everywhere, not just forgotten by the browser.
			require.Equal(t, http.StatusUnauthorized, c.whoami(cookie, ""))
			requireRedirect(t, c.get("/console/", cookie), "/console/login?next=%2Fconsole%2F")
			var logouts int
			for _, a := range c.audit() {
				if a.Action == "logout" {
					logouts++
				}
			}
			require.Equal(t, 1, logouts)
		})

		t.Run("ExpiredSessionRedirects", func(t *testing.T) {
			c := newConsole(t, db, consoleOpts{noAdmin: true})
			cookie := c.login()
			c.clock.Advance(auth.DefaultSessionTTL - time.Minute)
			require.Equal(t, http.StatusOK, c.get("/console/", cookie).StatusCode)
			c.clock.Advance(2 * time.Minute)
			res := c.get("/console/", cookie)
			requireRedirect(t, res, "/console/login?next=%2Fconsole%2F")
			ck := sessionCookie(res)
			require.NotNil(t, ck, "the dead cookie is cleared")
			require.Empty(t, ck.Value)
		})
	})
}

func TestConsoleCSRF(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		c := newConsole(t, db, consoleOpts{})
		cookie := c.login()
		other := c.login()
		otherToken := c.csrf(other)
		require.NotEqual(t, otherToken, c.csrf(cookie), "CSRF tokens are per session")

		for name, form := range map[string]url.Values{
			"Missing":      {"name": {"stolen"}},
			"Wrong":        {"name": {"stolen"}, "csrf_token": {"AAAA"}},
			"OtherSession": {"name": {"stolen"}, "csrf_token": {otherToken}},
		} {
			t.Run(name, func(t *testing.T) {
				res := c.post("/console/tokens", cookie, form)
				require.Equal(t, http.StatusForbidden, res.StatusCode)
				one(t, c.page(res), "error-page")
				require.Empty(t, c.tokens())
			})
		}

		t.Run("LogoutNeedsIt", func(t *testing.T) {
			res := c.post("/console/logout", cookie, url.Values{})
			require.Equal(t, http.StatusForbidden, res.StatusCode)
			require.Equal(t, http.StatusOK, c.whoami(cookie, ""), "the session survives")
		})

		t.Run("RevokeNeedsIt", func(t *testing.T) {
			tok, row, err := c.auth.CreateTokenFor(context.Background(), adminName, "keep")
			require.NoError(t, err)
			res := c.post("/console/tokens/"+row.ID+"/revoke", cookie, url.Values{"csrf_token": {otherToken}})
			require.Equal(t, http.StatusForbidden, res.StatusCode)
			require.Equal(t, http.StatusOK, c.whoami("", tok), "the token survives")
		})

		t.Run("CrossSiteRefused", func(t *testing.T) {
			before := len(c.tokens())
			res := c.do(request{
				method: http.MethodPost, path: "/console/tokens", cookie: cookie,
				form:    url.Values{"name": {"cross"}, "csrf_token": {c.csrf(cookie)}},
				headers: map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"},
			})
			require.Equal(t, http.StatusForbidden, res.StatusCode)
			require.Contains(t, text(one(t, c.page(res), "error-page")), "cross-origin request refused", "a page, not problem+json")
			require.Len(t, c.tokens(), before)
		})

		t.Run("SameOriginAccepted", func(t *testing.T) {
			before := len(c.tokens())
			res := c.do(request{
				method: http.MethodPost, path: "/console/tokens", cookie: cookie,
				form:    url.Values{"name": {"same"}, "csrf_token": {c.csrf(cookie)}},
				headers: map[string]string{"Sec-Fetch-Site": "same-origin"},
			})
			require.Equal(t, http.StatusOK, res.StatusCode)
			require.Len(t, c.tokens(), before+1)
		})
	})
}

func TestConsoleSetup(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		c := newConsole(t, db, consoleOpts{noAdmin: true})
		setupToken, err := c.auth.OpenSetup(context.Background())
		require.NoError(t, err)
		require.NotEmpty(t, setupToken)

		doc := c.page(c.get("/console/setup", ""))
		one(t, doc, "setup-form")
		scripts := findAll(doc, func(n *html.Node) bool { return n.Data == "script" })
		require.Len(t, scripts, 1)
		require.Equal(t, "/static/setup.js", attr(scripts[0], "src"))

		form := func(tok, user, pw string) url.Values {
			return url.Values{"setup_token": {tok}, "username": {user}, "password": {pw}}
		}
		hasAdmin := func() bool {
			has, err := c.auth.HasAdmin(context.Background())
			require.NoError(t, err)
			return has
		}

		t.Run("WrongTokenRefused", func(t *testing.T) {
			res := c.post("/console/setup", "", form("nws_wrong", "root", adminPassword))
			require.Equal(t, http.StatusUnauthorized, res.StatusCode)
			require.Nil(t, sessionCookie(res))
			one(t, c.page(res), "setup_token-error")
			require.False(t, hasAdmin())
		})

		t.Run("InvalidFieldsShown", func(t *testing.T) {
			res := c.post("/console/setup", "", form(setupToken, "root", "short"))
			require.Equal(t, http.StatusUnprocessableEntity, res.StatusCode)
			doc := c.page(res)
			one(t, doc, "password-error")
			require.Equal(t, "root", attr(one(t, doc, "setup-username"), "value"))
			require.Empty(t, attr(one(t, doc, "setup-password"), "value"), "passwords are never echoed")
			require.False(t, hasAdmin())
		})

		t.Run("RightTokenCreatesAdminOnce", func(t *testing.T) {
			res := c.post("/console/setup", "", form(setupToken, "root", adminPassword))
			requireRedirect(t, res, "/console/")
			ck := sessionCookie(res)
			require.NotNil(t, ck, "setup signs the new administrator in")
			doc := c.page(c.get("/console/", ck.Value))
			require.Equal(t, "root", text(one(t, doc, "username")))

			// Setup is closed now, for the page and for the spent token.
			one(t, c.page(c.get("/console/setup", "")), "setup-closed")
			again := c.post("/console/setup", "", form(setupToken, "second", adminPassword))
			require.Equal(t, http.StatusForbidden, again.StatusCode)
			one(t, c.page(again), "setup-closed")
			_, _, err := c.auth.Login(context.Background(), "second", adminPassword, "test")
			require.Error(t, err, "no second administrator")
		})
	})
}

func TestConsoleTokens(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		c := newConsole(t, db, consoleOpts{})
		cookie := c.login()
		csrf := c.csrf(cookie)

		one(t, c.page(c.get("/console/tokens", cookie)), "no-tokens")

		// Create: the token is on the result page, once.
		res := c.post("/console/tokens", cookie, url.Values{"name": {"deploy script"}, "csrf_token": {csrf}})
		require.Equal(t, http.StatusOK, res.StatusCode)
		require.Equal(t, "no-store", res.Header.Get("Cache-Control"))
		doc := c.page(res)
		secret := attr(one(t, doc, "new-token"), "value")
		require.True(t, strings.HasPrefix(secret, "nwa_"), secret)
		require.Equal(t, "deploy script", text(one(t, doc, "token-created-name")))
		require.Equal(t, http.StatusOK, c.whoami("", secret))

		rows := c.tokens()
		require.Len(t, rows, 1)
		id := rows[0].ID

		// The list names it but never shows it again.
		list := c.get("/console/tokens", cookie)
		body, err := io.ReadAll(list.Body)
		require.NoError(t, err)
		require.NotContains(t, string(body), secret)
		list.Body = io.NopCloser(bytes.NewReader(body))
		doc = c.page(list)
		row := one(t, doc, "token-"+id)
		require.Equal(t, "deploy script", text(one(t, row, "token-row-name")))
		require.Equal(t, adminName, text(one(t, row, "token-row-owner")), "whose token it is, before anyone revokes it")
		require.Equal(t, "active", text(one(t, row, "token-status")))

		// A nameless token is refused with the field marked.
		bad := c.post("/console/tokens", cookie, url.Values{"name": {"  "}, "csrf_token": {csrf}})
		require.Equal(t, http.StatusUnprocessableEntity, bad.StatusCode)
		one(t, c.page(bad), "name-error")
		require.Len(t, c.tokens(), 1)

		// Revoke.
		res = c.post("/console/tokens/"+id+"/revoke", cookie, url.Values{"csrf_token": {csrf}})
		requireRedirect(t, res, "/console/tokens?revoked="+id)
		doc = c.page(c.get(res.Header.Get("Location"), cookie))
		require.Contains(t, text(one(t, doc, "flash")), "deploy script")
		row = one(t, doc, "token-"+id)
		require.Equal(t, "revoked", text(one(t, row, "token-status")))
		require.Empty(t, byTestID(row, "token-revoke"))
		require.Equal(t, http.StatusUnauthorized, c.whoami("", secret))

		// Revoking an unknown token is a 404 page.
		missing := c.post("/console/tokens/nope/revoke", cookie, url.Values{"csrf_token": {csrf}})
		require.Equal(t, http.StatusNotFound, missing.StatusCode)

		// Both changes are in the admin audit page.
		doc = c.page(c.get("/console/audit", cookie))
		var actions []string
		for _, tr := range byTestID(doc, "audit-row") {
			actions = append(actions, text(tr))
		}
		joined := strings.Join(actions, "\n")
		require.Contains(t, joined, "token.create")
		require.Contains(t, joined, "token.revoke")
	})
}

func TestConsoleAuditPages(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		c := newConsole(t, db, consoleOpts{})
		cookie := c.login()
		for i := 0; i < 60; i++ {
			_, _, err := c.auth.CreateTokenFor(context.Background(), adminName, "t")
			require.NoError(t, err)
		}
		total := len(c.audit())
		require.Greater(t, total, 50)

		doc := c.page(c.get("/console/audit", cookie))
		require.Len(t, byTestID(doc, "audit-row"), 50)
		require.Empty(t, byTestID(doc, "audit-newest"))
		older := attr(one(t, doc, "audit-older"), "href")
		require.True(t, strings.HasPrefix(older, "/console/audit?before="), older)

		doc = c.page(c.get(older, cookie))
		require.Len(t, byTestID(doc, "audit-row"), total-50)
		require.Empty(t, byTestID(doc, "audit-older"))
		one(t, doc, "audit-newest")

		require.Equal(t, http.StatusBadRequest, c.get("/console/audit?before=x", cookie).StatusCode)
	})
}

func TestConsoleNavigation(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		c := newConsole(t, db, consoleOpts{})
		cookie := c.login()

		t.Run("NoBrokenLinks", func(t *testing.T) {
			for _, item := range views.Nav {
				res := c.get(item.Href, cookie)
				require.Equal(t, http.StatusOK, res.StatusCode, item.Href)
				doc := c.page(res)
				require.Equal(t, "page", attr(one(t, doc, "nav-"+item.Key), "aria-current"), item.Href)
			}
		})

		t.Run("NotFoundPage", func(t *testing.T) {
			res := c.get("/console/no-such-page", cookie)
			require.Equal(t, http.StatusNotFound, res.StatusCode)
			doc := c.page(res)
			require.Equal(t, "404", text(one(t, doc, "error-status")))
			require.Equal(t, adminName, text(one(t, doc, "username")))

			anon := c.get("/console/no-such-page", "")
			require.Equal(t, http.StatusNotFound, anon.StatusCode)
			require.Empty(t, byTestID(c.page(anon), "username"))
		})

		t.Run("BareConsoleRedirects", func(t *testing.T) {
			requireRedirect(t, c.get("/console", cookie), "/console/")
			requireRedirect(t, c.get("/console/logout", cookie), "/console/")
			require.Equal(t, http.StatusOK, c.whoami(cookie, ""), "a GET does not log out")
		})

		t.Run("StaticAssets", func(t *testing.T) {
			for path, ctype := range map[string]string{
				"/static/console.css":  "text/css",
				"/static/setup.js":     "text/javascript",
				"/static/copy.js":      "text/javascript",
				"/static/operation.js": "text/javascript",
				"/static/favicon.svg":  "image/svg+xml",
			} {
				res := c.get(path, "")
				require.Equal(t, http.StatusOK, res.StatusCode, path)
				require.True(t, strings.HasPrefix(res.Header.Get("Content-Type"), ctype), "%s: %s", path, res.Header.Get("Content-Type"))
			}
		})
	})
}
