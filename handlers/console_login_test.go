package handlers_test

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// TestConsoleLoginLimits: the sign-in form refuses over-long fields as an
// ordinary failed sign-in, with the same message, and never echoes them.
func TestConsoleLoginLimits(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		c := newConsole(t, db, consoleOpts{})
		wrong := c.post("/console/login", "", url.Values{"username": {adminName}, "password": {"not the password"}})
		require.Equal(t, http.StatusUnauthorized, wrong.StatusCode)
		want := text(one(t, c.page(wrong), "flash"))

		longName := strings.Repeat("n", 256<<10)
		for name, form := range map[string]url.Values{
			"username": {"username": {longName}, "password": {adminPassword}},
			"password": {"username": {adminName}, "password": {adminPassword + strings.Repeat("p", auth.MaxPasswordLen)}},
		} {
			res := c.post("/console/login", "", form)
			require.Equal(t, http.StatusUnauthorized, res.StatusCode, name)
			require.Nil(t, sessionCookie(res), name)
			body, err := io.ReadAll(res.Body)
			require.NoError(t, err)
			require.Contains(t, string(body), want, name)
			require.NotContains(t, string(body), longName[:auth.MaxUsernameLen+1], "%s: not echoed", name)
		}
	})
}
