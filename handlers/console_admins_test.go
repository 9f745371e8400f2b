package handlers_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/html"

	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/handlers"
)

// TestConsoleAdministrators: from the console an administrator adds
// another, disables them (their session ends at once), enables them and
// signs them out; refusals come back as the page with the reason.
func TestConsoleAdministrators(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		me := signIn(t, s)
		page := me.get("/console/admins")
		require.Equal(t, http.StatusOK, page.status)
		require.Contains(t, text(page.one(t, "admin-"+apitest.AdminUsername)), "(you)")
		form := page.form(t, "admin-add-form")

		t.Run("AddRefusals", func(t *testing.T) {
			before := rowCounts(t, s)
			res := me.post("/console/admins", with(form, "username", "bob", "password", "short"))
			require.Equal(t, http.StatusUnprocessableEntity, res.status)
			require.Contains(t, text(res.one(t, "password-error")), "At least 12 characters")
			require.Equal(t, "bob", attr(res.one(t, "admin-username"), "value"), "the username is kept")
			require.NotContains(t, res.raw, `value="short"`, "never the password")
			res = me.post("/console/admins", with(form, "username", apitest.AdminUsername, "password", "a-long-enough-password"))
			require.Equal(t, http.StatusConflict, res.status)
			require.Contains(t, text(res.one(t, "username-error")), "exists")
			require.Equal(t, before, rowCounts(t, s))
		})

		res := me.send(http.MethodPost, "/console/admins", with(form, "username", "bob", "password", "bobs-long-password"))
		res.Body.Close()
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		page = me.get(res.Header.Get("Location"))
		require.Contains(t, text(page.one(t, "flash")), "Added the administrator bob")
		require.Equal(t, "enabled", text(byTestIDIn(t, page.one(t, "admin-bob"), "admin-status")))

		bob := signInAs(t, s, "bob", "bobs-long-password")
		require.Equal(t, http.StatusOK, bob.get("/console/").status)
		page = me.get("/console/admins")
		require.Equal(t, "1", text(byTestIDIn(t, page.one(t, "admin-bob"), "admin-row-sessions")))

		t.Run("DisableEndsTheirSession", func(t *testing.T) {
			res := me.send(http.MethodPost, "/console/admins/bob/disable", form)
			res.Body.Close()
			require.Equal(t, http.StatusSeeOther, res.StatusCode)
			page := me.get(res.Header.Get("Location"))
			require.Contains(t, text(page.one(t, "flash")), "Disabled bob")
			require.Equal(t, "disabled", text(byTestIDIn(t, page.one(t, "admin-bob"), "admin-status")))
			gone := bob.send(http.MethodGet, "/console/", nil)
			gone.Body.Close()
			require.Equal(t, http.StatusSeeOther, gone.StatusCode)
			require.True(t, strings.HasPrefix(gone.Header.Get("Location"), "/console/login"), "back to sign-in")
		})
		t.Run("SelfIsRefused", func(t *testing.T) {
			res := me.post("/console/admins/"+apitest.AdminUsername+"/disable", form)
			require.Equal(t, http.StatusConflict, res.status)
			require.Contains(t, text(res.one(t, "flash")), "cannot disable your own account")
			require.Empty(t, byTestID(res.one(t, "admin-"+apitest.AdminUsername), "admin-disable"), "no button to try")
		})
		t.Run("Enable", func(t *testing.T) {
			res := me.send(http.MethodPost, "/console/admins/bob/enable", form)
			res.Body.Close()
			require.Equal(t, http.StatusSeeOther, res.StatusCode)
			require.Contains(t, text(me.get(res.Header.Get("Location")).one(t, "flash")), "Enabled bob again")
		})
		t.Run("SignOut", func(t *testing.T) {
			bob = signInAs(t, s, "bob", "bobs-long-password")
			res := me.send(http.MethodPost, "/console/admins/bob/sign-out", form)
			res.Body.Close()
			require.Equal(t, http.StatusSeeOther, res.StatusCode)
			gone := bob.send(http.MethodGet, "/console/", nil)
			gone.Body.Close()
			require.Equal(t, http.StatusSeeOther, gone.StatusCode)
		})
		t.Run("UnknownIsNotFound", func(t *testing.T) {
			res := me.post("/console/admins/nobody/disable", form)
			require.Equal(t, http.StatusNotFound, res.status)
		})
		t.Run("WithoutTheFormsTokenNothingHappens", func(t *testing.T) {
			res := me.post("/console/admins/bob/disable", url.Values{"csrf_token": {"forged"}})
			require.Equal(t, http.StatusForbidden, res.status)
			require.Equal(t, "enabled", text(byTestIDIn(t, me.get("/console/admins").one(t, "admin-bob"), "admin-status")))
		})
	})
}

// TestConsoleAccount: an administrator changes their own password from
// the account page (every session ends; this browser gets a new one) and
// signs out their other sessions.
func TestConsoleAccount(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		me, elsewhere := signIn(t, s), signIn(t, s)
		page := me.get("/console/account")
		require.Equal(t, http.StatusOK, page.status)
		require.Equal(t, apitest.AdminUsername, text(page.one(t, "account-username")))
		require.Contains(t, text(page.one(t, "other-sessions")), "1 other open console")
		form := page.form(t, "password-form")
		const next = "a-brand-new-passphrase"

		for name, c := range map[string]struct {
			current, next, confirm, field, says string
		}{
			"WrongCurrent": {"not-the-password", next, next, "current_password-error", "not your current password"},
			"Mismatch":     {apitest.AdminPassword, next, next + "x", "confirm_password-error", "Does not match"},
			"TooShort":     {apitest.AdminPassword, "short", "short", "new_password-error", "At least 12"},
		} {
			res := me.post("/console/account/password", with(form, "current_password", c.current, "new_password", c.next, "confirm_password", c.confirm))
			require.Equal(t, http.StatusUnprocessableEntity, res.status, name)
			require.Contains(t, text(res.one(t, c.field)), c.says, name)
			require.NotContains(t, res.raw, c.current, "%s: no password on the page", name)
		}

		old := me.cookie
		res := me.send(http.MethodPost, "/console/account/password",
			with(form, "current_password", apitest.AdminPassword, "new_password", next, "confirm_password", next))
		res.Body.Close()
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		for _, c := range res.Cookies() {
			if c.Name == handlers.SessionCookie {
				me.cookie = c.Value
			}
		}
		require.NotEqual(t, old, me.cookie, "this browser gets a new session")
		stale := &consoleUser{t: t, s: s, cookie: old, client: me.client}
		gone := stale.send(http.MethodGet, "/console/", nil)
		gone.Body.Close()
		require.Equal(t, http.StatusSeeOther, gone.StatusCode, "the old cookie died with the old password")
		page = me.get(res.Header.Get("Location"))
		require.Equal(t, http.StatusOK, page.status, "this browser carries on")
		require.Contains(t, text(page.one(t, "flash")), "Your password is changed")
		require.Contains(t, text(page.one(t, "other-sessions")), "only open console session")
		gone = elsewhere.send(http.MethodGet, "/console/", nil)
		gone.Body.Close()
		require.Equal(t, http.StatusSeeOther, gone.StatusCode, "the other session ended")

		third := signInAs(t, s, apitest.AdminUsername, next)
		page = me.get("/console/account")
		res = me.send(http.MethodPost, "/console/account/sign-out-others", page.form(t, "password-form"))
		res.Body.Close()
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		require.Contains(t, text(me.get(res.Header.Get("Location")).one(t, "flash")), "other console sessions have ended")
		gone = third.send(http.MethodGet, "/console/", nil)
		gone.Body.Close()
		require.Equal(t, http.StatusSeeOther, gone.StatusCode)
	})
}

// byTestIDIn answers the one element with that data-testid inside n.
func byTestIDIn(t *testing.T, n *html.Node, testid string) *html.Node {
	t.Helper()
	ns := byTestID(n, testid)
	require.Len(t, ns, 1, "data-testid=%s", testid)
	return ns[0]
}

// TestConsoleTokenFormSentTwice: the create-token form sent again (a double
// click, a reload) mints one token; the second answer says it was shown.
func TestConsoleTokenFormSentTwice(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		me := signIn(t, s)
		form := with(me.get("/console/tokens").form(t, "token-create-form"), "name", "twice")
		require.NotEmpty(t, form.Get("request_id"))
		before := rowCounts(t, s)

		first := me.post("/console/tokens", form)
		require.Equal(t, http.StatusOK, first.status)
		token := attr(first.one(t, "new-token"), "value")
		require.True(t, strings.HasPrefix(token, "nwa_"))

		res := me.send(http.MethodPost, "/console/tokens", form)
		res.Body.Close()
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		again := me.get(res.Header.Get("Location"))
		require.Contains(t, text(again.one(t, "flash")), "That form was sent already")
		require.NotContains(t, again.raw, token, "shown once")
		after := rowCounts(t, s)
		require.Equal(t, before[0]+1, after[0], "one token")
		require.Equal(t, before[1]+1, after[1], "one audit row")

		// A fresh form is a fresh token.
		second := me.post("/console/tokens", with(again.form(t, "token-create-form"), "name", "twice"))
		require.Equal(t, http.StatusOK, second.status)
		require.NotEqual(t, token, attr(second.one(t, "new-token"), "value"))
	})
}

// TestConsoleUnknownFilters: a listing page whose link carries a filter
// it does not know says so (400) instead of showing everything; the
// filters it knows still work.
func TestConsoleUnknownFilters(t *testing.T) {
	t.Parallel()
	s := apitest.Start(t)
	me := signIn(t, s)
	for _, c := range []struct{ good, bad string }{
		{"/console/nodes?state=ready", "/console/nodes?stat=ready"},
		{"/console/operations?state=failed", "/console/operations?states=failed"},
		{"/console/secret-audit?outcome=denied", "/console/secret-audit?outcom=denied"},
		{"/console/audit", "/console/audit?page=2"},
		{"/console/config/lagging", "/console/config/lagging?x=1"},
	} {
		require.Equal(t, http.StatusOK, me.get(c.good).status, c.good)
		page := me.get(c.bad)
		require.Equal(t, http.StatusBadRequest, page.status, c.bad)
		require.Contains(t, page.raw, "This page has no filter", c.bad)
	}
	page := me.get("/console/nodes?%3Cscript%3E=1")
	require.Equal(t, http.StatusBadRequest, page.status)
	require.NotContains(t, page.raw, "<script>", "escaped, never markup")
}
