package handlers

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Once the body has arrived, the body's read bound is lifted: a handler that
// then waits longer (a waiting submit) keeps its request context.
func TestBodyReadTimeoutEndsWithTheBody(t *testing.T) {
	t.Parallel()
	const bound = 100 * time.Millisecond
	srv := httptest.NewServer(bodyReadTimeout(bound)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		// Wait well past the bound, as a waiting submit would.
		select {
		case <-r.Context().Done():
			w.WriteHeader(http.StatusInternalServerError)
		case <-time.After(10 * bound):
			w.WriteHeader(http.StatusOK)
		}
	})))
	defer srv.Close()
	resp, err := http.Post(srv.URL, "application/json", strings.NewReader(`{"wait":true}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "the request's context outlived the body's bound")
}
