package handlers

import (
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nodeward/nodeward/errcode"
)

// query reads a request's query parameters strictly. Every listing filter
// and option is one value: a parameter given empty (`class=`) or more than
// once is a 400 invalid_parameter naming it, never read as absent or as
// its first value, and so is one that is not plain text (invalid UTF-8,
// control characters). A query string that is not well formed is refused.
type query struct {
	values url.Values
	err    error
}

func queryOf(r *http.Request) query {
	v, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		e := errcode.New(errcode.InvalidParameter, "the query string is not well formed")
		e.Fields = []errcode.FieldError{{Field: "query", Message: e.Message}}
		return query{err: e}
	}
	return query{values: v}
}

// get answers the value of name, "" when it is absent.
func (q query) get(name string) (string, error) {
	if q.err != nil {
		return "", q.err
	}
	vs, ok := q.values[name]
	switch {
	case !ok:
		return "", nil
	case len(vs) > 1:
		return "", invalidParameter(name, "given more than once")
	case vs[0] == "":
		return "", invalidParameter(name, "given empty; leave it out instead")
	case !plainText(vs[0]):
		return "", invalidParameter(name, "not valid UTF-8 text without control characters")
	}
	return vs[0], nil
}

// wholeNumber parses s as a decimal whole number from 0 to max: digits
// only, no sign, no spaces (strconv would take "+5").
func wholeNumber(s string, max int64) (int64, bool) {
	if s == "" || len(s) > 19 {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n > max {
		return 0, false
	}
	return n, true
}

// parseCursor accepts a cursor as next_before wrote it: decimal digits, no
// sign, no padding.
func parseCursor(s string) (int64, error) {
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, errors.New("a cursor from next_before")
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || strconv.FormatInt(n, 10) != s {
		return 0, errors.New("a cursor from next_before")
	}
	return n, nil
}

// cursor reads name as a keyset cursor as a listing's next_before wrote
// it (parseCursor); 0 when it is absent. A bad one is refused saying
// format.
func (q query) cursor(name, format string) (int64, error) {
	s, err := q.get(name)
	if err != nil || s == "" {
		return 0, err
	}
	n, err := parseCursor(s)
	if err != nil {
		return 0, invalidParameter(name, "%s", format)
	}
	return n, nil
}

// keyCursor reads name as a keyset cursor encodeKeyCursor wrote (a
// time and an id); ok is false when it is absent.
func (q query) keyCursor(name string) (at time.Time, id string, ok bool, err error) {
	s, err := q.get(name)
	if err != nil || s == "" {
		return time.Time{}, "", false, err
	}
	at, id, ok = decodeKeyCursor(s)
	if !ok {
		return time.Time{}, "", false, invalidParameter(name, "a cursor from next_before")
	}
	return at, id, true, nil
}

// number reads name as a whole number from min to max; ok is false when
// it is absent.
func (q query) number(name string, min, max int64, format string, args ...any) (n int64, ok bool, err error) {
	s, err := q.get(name)
	if err != nil || s == "" {
		return 0, false, err
	}
	n, valid := wholeNumber(s, max)
	if !valid || n < min {
		return 0, false, invalidParameter(name, format, args...)
	}
	return n, true, nil
}

// boolean reads name as true or false (those words only: "1", "yes" or
// "True" are refused rather than guessed at); ok is false when it is
// absent.
func (q query) boolean(name string) (b, ok bool, err error) {
	s, err := q.get(name)
	switch {
	case err != nil || s == "":
		return false, false, err
	case s == "true":
		return true, true, nil
	case s == "false":
		return false, true, nil
	}
	return false, false, invalidParameter(name, "true or false")
}

// onlyQuery refuses a request naming a query parameter outside names:
// 400 invalid_parameter naming the first such, in the order given.
func onlyQuery(names []string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.RawQuery == "" {
				next.ServeHTTP(w, r)
				return
			}
			q := queryOf(r)
			if q.err != nil {
				writeError(w, r, q.err)
				return
			}
			for _, kv := range strings.Split(r.URL.RawQuery, "&") {
				name, _, _ := strings.Cut(kv, "=")
				name, _ = url.QueryUnescape(name)
				if name != "" && !slices.Contains(names, name) {
					if len(names) == 0 {
						writeError(w, r, invalidParameter(name, "this endpoint takes no query parameters"))
					} else {
						writeError(w, r, invalidParameter(name, "not a parameter of this endpoint (it takes %s)", strings.Join(names, ", ")))
					}
					return
				}
			}
			next.ServeHTTP(w, r)
		})
	}
}
