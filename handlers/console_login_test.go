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

		// Past the body limit the form is 413, as an API body is, and a
		// page a person can read, not the problem+json scripts get.
		huge := c.post("/console/login", "", url.Values{"username": {adminName}, "password": {strings.Repeat("p", 2<<20)}})
		require.Equal(t, http.StatusRequestEntityTooLarge, huge.StatusCode)
		require.Nil(t, sessionCookie(huge))
		require.Contains(t, text(one(t, c.page(huge), "error-page")), "exceeds 1048576 bytes")
	})
}
