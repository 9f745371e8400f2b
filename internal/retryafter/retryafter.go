// Package retryafter reads an HTTP Retry-After header for both of the
// project's clients (the agent's and the admin API's).
package retryafter

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Parse reads delay-seconds or an HTTP date (RFC 9110 §10.2.3) as a wait
// from now; 0 when the value is absent, malformed, negative or past.
func Parse(v string) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, time.Until(t))
	}
	return 0
}
