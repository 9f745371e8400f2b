package handlers

import (
	"errors"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/errcode"
)

func TestQueryIsStrict(t *testing.T) {
	t.Parallel()
	cases := []struct {
		raw   string
		want  int64
		given bool
		bad   bool
	}{
		{"", 0, false, false},
		{"limit=5", 5, true, false},
		{"limit=05", 5, true, false},
		{"limit=+5", 0, false, true},
		{"limit=-5", 0, false, true},
		{"limit=%205", 0, false, true},
		{"limit=5%20", 0, false, true},
		{"limit=0x5", 0, false, true},
		{"limit=1e3", 0, false, true},
		{"limit=99999999999999999999", 0, false, true},
		{"limit=", 0, false, true},
		{"limit=5&limit=6", 0, false, true},
		{"limit=5;x=1", 0, false, true},
		{"limit=%zz", 0, false, true},
		{"limit=%00", 0, false, true},
		{"limit=%FF", 0, false, true},
		{"other=1", 0, false, false},
	}
	for _, tc := range cases {
		r := httptest.NewRequest("GET", "/x?"+tc.raw, nil)
		n, ok, err := queryOf(r).number("limit", 0, 1000, "a number")
		if tc.bad {
			require.Equal(t, errcode.InvalidParameter, errcode.Of(err), "%q", tc.raw)
			continue
		}
		require.NoError(t, err, "%q", tc.raw)
		require.Equal(t, tc.given, ok, "%q", tc.raw)
		require.Equal(t, tc.want, n, "%q", tc.raw)
	}
}

// FuzzQuery: no query string makes the parsers panic; a refusal always
// names its parameter; an accepted number is exactly its digits.
func FuzzQuery(f *testing.F) {
	for _, s := range []string{"limit=5", "limit=+5", "class=", "class=a&class=b", "before=MTIzfGlk", "wait=60", "%zz", "limit=5;x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		r := httptest.NewRequest("GET", "/x", nil)
		r.URL.RawQuery = raw
		q := queryOf(r)
		for _, name := range []string{"limit", "class", "before", "wait"} {
			n, ok, err := q.number(name, 0, 1<<40, "a number")
			if err != nil {
				var e *errcode.Error
				require.True(t, errors.As(err, &e))
				require.Equal(t, errcode.InvalidParameter, e.Code)
				require.NotEmpty(t, e.Fields)
				continue
			}
			if ok {
				s, _ := q.get(name)
				require.Empty(t, strings.Trim(s, "0123456789"), "an accepted number is digits only: %q", s)
				m, perr := strconv.ParseInt(s, 10, 64)
				require.NoError(t, perr)
				require.Equal(t, m, n)
			}
			if s, err := q.get(name); err == nil && s != "" {
				_, _, _ = decodeKeyCursor(s)
			}
		}
	})
}
