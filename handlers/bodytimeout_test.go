package handlers

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/errcode"
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

// Over HTTP/2 a body that stops midway is answered 408 request_timeout too
// (the stream's read fails with os.ErrDeadlineExceeded, as the connection's
// does on HTTP/1), and only that stream ends: the client's connection, and
// its other streams, carry on.
func TestBodyReadTimeoutOverHTTP2(t *testing.T) {
	t.Parallel()
	const bound = 200 * time.Millisecond
	srv := httptest.NewUnstartedServer(bodyReadTimeout(bound)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var v struct {
			Name string `json:"name"`
		}
		if err := decodeJSON(r, &v, false); err != nil {
			writeError(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	hc := srv.Client()
	hc.Timeout = 30 * time.Second // far above the bound: only a hang fails

	var conns []bool // GotConn's Reused, per request
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { conns = append(conns, i.Reused) }}
	send := func(body io.Reader) *http.Response {
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodPost, srv.URL, body)
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		require.NoError(t, err)
		return resp
	}

	pr, pw := io.Pipe()
	defer pw.Close()
	go func() { _, _ = io.WriteString(pw, `{"name":"half`) }() // and nothing more
	resp := send(pr)
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, 2, resp.ProtoMajor)
	require.Equal(t, http.StatusRequestTimeout, resp.StatusCode, "answer: %s", raw)
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
	var p problem
	require.NoError(t, json.Unmarshal(raw, &p))
	require.Equal(t, errcode.RequestTimeout, p.Code)
	require.Contains(t, p.Detail, "read timeout (0.2 s)")

	resp = send(strings.NewReader(`{"name":"whole"}`))
	resp.Body.Close()
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	require.Equal(t, []bool{false, true}, conns, "the second request rode the same connection")
}
