package handlers

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/metrics"
)

// TestLongPollPanicAnswersWithTheEdgeHeaders: the long-poll's edge sets
// the headers every answer carries only as it answers (lateHeaders), so
// the 500 a panic in the poll turns into goes through it and carries them
// too, with the caller's request id.
func TestLongPollPanicAnswersWithTheEdgeHeaders(t *testing.T) {
	t.Parallel()
	h := &handler{log: slog.New(slog.DiscardHandler), metrics: metrics.New(nil)}
	e := &edgeHandler{h: h, route: pollPath, limit: DefaultBodyLimit, bodyTimeout: time.Second, cop: http.NewCrossOriginProtection(),
		next: http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("a bug") })}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, pollPath, nil)
	req.Header.Set("X-Request-Id", "panic-1")
	e.ServeHTTP(rec, req)
	require.Equal(t, http.StatusInternalServerError, rec.Code)
	require.Contains(t, rec.Body.String(), `"code":"internal"`)
	require.Equal(t, "panic-1", rec.Header().Get("X-Request-Id"))
	require.Equal(t, "nosniff", rec.Header().Get("X-Content-Type-Options"))
	require.Equal(t, "DENY", rec.Header().Get("X-Frame-Options"))
}
