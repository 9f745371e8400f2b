package auth

import (
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
