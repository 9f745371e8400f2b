package auth

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestSanitizeActor(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"alice", "alice"},
		{"", ""},
		{"ops@example.com", "ops@example.com"},
		{"bob\nadmin login ok", `bob\x0aadmin login ok`},
		{"\x1b[31mred\x1b[0m", `\x1b[31mred\x1b[0m`},
		{"a\u2028b\u200bc", `a\u2028b\u200bc`},
		{`back\slash`, `back\\slash`},
		{"bad\xffbyte", `bad\xffbyte`},
		{"ünï", "ünï"},
		{"\uFFFD", "\uFFFD"},
		{strings.Repeat("a", maxActorLen), strings.Repeat("a", maxActorLen)},
		{strings.Repeat("a", maxActorLen+1), strings.Repeat("a", maxActorLen) + "…"},
	} {
		require.Equal(t, tc.want, sanitizeActor(tc.in), "%q", tc.in)
	}
	// However long or hostile the name, the stored actor is bounded.
	huge := sanitizeActor(strings.Repeat("\x00", 1<<20))
	require.LessOrEqual(t, len(huge), maxActorLen*len(`\x00`)+len("…"))
	require.True(t, utf8.ValidString(huge))
}

func TestFoldUsername(t *testing.T) {
	d := ""
	for _, name := range []string{"root", "admin", "root", `a "quoted", name`, "admin"} {
		d = foldUsername(d, name)
	}
	require.Equal(t, `last_username="admin" tried="root","admin","a \"quoted\", name"`, d, "distinct, in first-tried order")
	for i := range 20 {
		d = foldUsername(d, fmt.Sprintf("guess%02d", i))
	}
	require.True(t, strings.HasSuffix(d, `"guess04",…`), d)
	names, more := triedNames(d)
	require.Len(t, names, maxTried)
	require.True(t, more)
	require.Equal(t, d[strings.Index(d, " tried="):], foldUsername(d, "guess19")[strings.Index(foldUsername(d, "guess19"), " tried="):],
		"nothing more once full")

	t.Run("SubmittedTextCannotPoseAsTheList", func(t *testing.T) {
		d := ""
		for _, name := range []string{`z tried="","","","","","","","",""`, "alice", `bob tried="ops"`, "carol"} {
			d = foldUsername(d, name)
		}
		names, more := triedNames(d)
		require.False(t, more)
		require.Equal(t, []string{`z tried="","","","","","","","",""`, "alice", `bob tried="ops"`, "carol"}, names)
	})
	t.Run("AnOlderDetailStartsAfresh", func(t *testing.T) {
		require.Equal(t, `last_username="bob" tried="bob"`, foldUsername("last_username=alice", "bob"))
	})
}
