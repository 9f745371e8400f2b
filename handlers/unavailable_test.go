package handlers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/errcode"
	_ "github.com/nodeward/nodeward/models" // registers the database's unavailable errors
)

// TestDatabaseDownIs503: an error that says the database is unreachable
// or shutting down answers 503 unavailable with Retry-After — a condition
// clients retry — never a 500 (found by the Postgres restart torture test,
// where every admin read answered 500 while the database was down).
func TestDatabaseDownIs503(t *testing.T) {
	for name, err := range map[string]error{
		"admin shutdown":     fmt.Errorf("list nodes: %w", &pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}),
		"cannot connect now": fmt.Errorf("lookup token: %w", &pgconn.PgError{Code: "57P03"}),
		"connection failure": &pgconn.PgError{Code: "08006"},
		"connect refused":    fmt.Errorf("begin: %w", &pgconn.ConnectError{}),
		"conn closed":        errors.New("conn closed"),
	} {
		t.Run(name, func(t *testing.T) {
			var log bytes.Buffer
			w := httptest.NewRecorder()
			writeError(w, requestWithLog(&log), err)
			require.Equal(t, http.StatusServiceUnavailable, w.Code)
			require.NotEmpty(t, w.Header().Get("Retry-After"))
			var p problem
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p))
			require.Equal(t, errcode.Unavailable, p.Code)
		})
	}
	// A database error that is the request's or the code's fault stays 500.
	w := httptest.NewRecorder()
	var log bytes.Buffer
	writeError(w, requestWithLog(&log), fmt.Errorf("insert: %w", &pgconn.PgError{Code: "23505"}))
	require.Equal(t, http.StatusInternalServerError, w.Code)
}
