// Package apitest starts the real control plane in-process, on a real
// loopback listener and a fresh database of either dialect, and drives it
// over real HTTP with a client whose every request and response is checked
// against openapi.yaml. Tests anywhere in the repository use it:
//
//	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
//		var who struct{ Username string }
//		s.Admin(t, "GET", "/api/v1/whoami", nil, http.StatusOK, &who)
//	})
//
// A contract violation fails the test that made the request, naming the
// method, path, status and what the validator found (see Transport). The
// agent's client checks its exchanges too when handed s.Client:
//
//	client.New(client.Options{BaseURL: s.URL, AllowInsecureHTTP: true, HTTPClient: s.Client})
//
// Postgres servers need dbtest.EnvURL (NODEWARD_TEST_DATABASE_URL); Each
// runs SQLite always and Postgres when it is set (and fails under CI=true
// without it).
package apitest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
	"github.com/nodeward/nodeward/server/controlplane"
)

// TestMasterKey is the master key of every Postgres test server (SQLite
// servers generate their own into the data folder, as in production).
const TestMasterKey = "6e6f64657761726420746573742d6f6e6c79206d6173746572206b657920303031"

// Administrator credentials created on every server.
const (
	AdminUsername = "admin"
	AdminPassword = "correct-horse-battery-staple"
)

// Server is one running control plane.
type Server struct {
	// URL is the base URL, http://127.0.0.1:PORT.
	URL string
	// App is the running application (its DB, Auth, Config, ...).
	App *controlplane.App
	// Dialect is models.SQLite or models.Postgres.
	Dialect string
	// Client checks every exchange against openapi.yaml; its Transport is
	// a *Transport.
	Client *http.Client
	// AdminToken is an API token of the administrator AdminUsername.
	AdminToken string
	// AdminUserID is that administrator's id.
	AdminUserID string

	cancel context.CancelFunc
	served chan error
}

type options struct {
	dialect string
	mutate  []func(*controlplane.Config)
	logTo   io.Writer
	peer    *Server
}

// Option configures Start.
type Option func(*options)

// WithDialect picks the database: models.SQLite (default) or
// models.Postgres (skipped unless dbtest.EnvURL is set).
func WithDialect(d string) Option { return func(o *options) { o.dialect = d } }

// WithConfig changes the configuration before the server opens (after the
// defaults, the listen address, data folder and database are set).
func WithConfig(fn func(*controlplane.Config)) Option {
	return func(o *options) { o.mutate = append(o.mutate, fn) }
}

// WithReplicaOf starts a second replica of peer (a Postgres server): the
// same database and master key, its own replica id; it shares peer's
// administrator and API token instead of creating them.
func WithReplicaOf(peer *Server) Option {
	return func(o *options) { o.dialect, o.peer = models.Postgres, peer }
}

// WithLog sends the server's log to w as it is written (default: kept in
// memory and printed with t.Log only when the test fails).
func WithLog(w io.Writer) Option { return func(o *options) { o.logTo = w } }

// Each runs fn as a subtest on a fresh server of every dialect of this run
// (dbtest.Dialects: SQLite always, Postgres when configured).
func Each(t *testing.T, fn func(t *testing.T, s *Server), opts ...Option) {
	t.Helper()
	for _, d := range dbtest.Dialects(t) {
		t.Run(d, func(t *testing.T) {
			fn(t, Start(t, append(append([]Option(nil), opts...), WithDialect(d))...))
		})
	}
}

// Start opens the control plane on a fresh database, serves it on
// 127.0.0.1 on a free port, creates an administrator with an API token,
// and stops it (drain, wait for Serve to return, close) when t ends.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	o := options{dialect: models.SQLite}
	for _, fn := range opts {
		fn(&o)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()

	cfg := controlplane.Config{
		Listen:        addr,
		PublicURL:     "http://" + addr,
		AgentVersion:  "0.0.0-test",
		ShutdownGrace: 10 * time.Second,
		LogLevel:      "debug",
		LogFormat:     "text",
		ReplicaID:     "apitest",
	}
	switch o.dialect {
	case models.SQLite:
		cfg.DataDir = t.TempDir()
	case models.Postgres:
		if o.peer != nil {
			cfg.DatabaseURL = o.peer.App.Config.DatabaseURL
			cfg.ReplicaID = o.peer.App.Config.ReplicaID + "-b"
		} else {
			cfg.DatabaseURL = dbtest.NewSchema(t)
		}
		cfg.MasterKey = TestMasterKey
	default:
		_ = ln.Close()
		t.Fatalf("apitest: unknown dialect %q", o.dialect)
	}
	for _, fn := range o.mutate {
		fn(&cfg)
	}

	var log *slog.Logger
	if o.logTo != nil {
		log = slog.New(slog.NewTextHandler(o.logTo, &slog.HandlerOptions{Level: slog.LevelDebug}))
	} else {
		buf := &LogBuffer{}
		log = slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("server log:\n%s", buf.String())
			}
		})
	}

	ctx, cancel := context.WithCancel(context.Background())
	app, err := controlplane.Open(ctx, cfg, log)
	if err != nil {
		cancel()
		_ = ln.Close()
		t.Fatalf("apitest: open control plane: %v", err)
	}
	s := &Server{URL: "http://" + addr, App: app, Dialect: o.dialect, cancel: cancel, served: make(chan error, 1)}
	go func() { s.served <- app.Serve(ctx, ln) }()

	tr := NewTransport(t, nil)
	s.Client = &http.Client{
		Transport: tr,
		// The API never redirects; show a redirect to the test as it is.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	t.Cleanup(func() {
		s.cancel()
		select {
		case err := <-s.served:
			if err != nil {
				t.Errorf("apitest: Serve returned %v", err)
			}
		case <-time.After(2*cfg.ShutdownGrace + 10*time.Second):
			t.Errorf("apitest: Serve did not return after the server was stopped")
		}
		tr.CloseIdleConnections()
		_ = app.Close()
	})

	if o.peer != nil {
		s.AdminUserID, s.AdminToken = o.peer.AdminUserID, o.peer.AdminToken
		return s
	}
	u, err := app.Auth.CreateAdmin(ctx, AdminUsername, AdminPassword)
	require.NoError(t, err, "create administrator")
	s.AdminUserID = u.ID
	s.AdminToken, _, err = app.Auth.CreateTokenFor(ctx, AdminUsername, "apitest")
	require.NoError(t, err, "create API token")
	return s
}

// Body is a request body sent exactly as given, with its Content-Type
// ("" sends none). Do sends any other non-nil body as JSON.
type Body struct {
	ContentType string
	Data        []byte
}

// Raw is a body sent as it is, labelled application/json: for malformed
// JSON, unknown fields and trailing data.
func Raw(s string) Body { return Body{ContentType: "application/json", Data: []byte(s)} }

// NewRequest builds a request to path (which may carry a query). body is
// nil (none), a Body, or a value marshalled as JSON; token, when not empty,
// is sent as a Bearer credential.
func (s *Server) NewRequest(t testing.TB, method, path string, body any, token string) *http.Request {
	t.Helper()
	var rd io.Reader
	contentType := ""
	switch b := body.(type) {
	case nil:
	case Body:
		rd, contentType = bytes.NewReader(b.Data), b.ContentType
	case *Body:
		rd, contentType = bytes.NewReader(b.Data), b.ContentType
	default:
		data, err := json.Marshal(body)
		require.NoError(t, err, "marshal request body")
		rd, contentType = bytes.NewReader(data), "application/json"
	}
	req, err := http.NewRequest(method, s.URL+path, rd)
	require.NoError(t, err)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return req
}

// Send sends req with s.Client and answers the status, headers and body.
func (s *Server) Send(t testing.TB, req *http.Request) (status int, header http.Header, raw []byte) {
	t.Helper()
	resp, err := s.Client.Do(req)
	require.NoError(t, err, "%s %s", req.Method, req.URL.Path)
	defer resp.Body.Close()
	raw, err = io.ReadAll(resp.Body)
	require.NoError(t, err, "read answer to %s %s", req.Method, req.URL.Path)
	return resp.StatusCode, resp.Header, raw
}

// Do sends one request (see NewRequest) and answers the status, headers
// and body.
func (s *Server) Do(t testing.TB, method, path string, body any, token string) (status int, header http.Header, raw []byte) {
	t.Helper()
	return s.Send(t, s.NewRequest(t, method, path, body, token))
}

// JSON sends one request, requires the answer's status to be wantStatus
// (showing the body when it is not) and decodes the body into out (when
// out is not nil).
func (s *Server) JSON(t testing.TB, method, path string, body any, token string, wantStatus int, out any) {
	t.Helper()
	status, _, raw := s.Do(t, method, path, body, token)
	require.Equal(t, wantStatus, status, "%s %s answered %s", method, path, raw)
	if out != nil {
		require.NoError(t, json.Unmarshal(raw, out), "decode answer to %s %s: %s", method, path, raw)
	}
}

// Admin is JSON with the administrator's API token.
func (s *Server) Admin(t testing.TB, method, path string, body any, wantStatus int, out any) {
	t.Helper()
	s.JSON(t, method, path, body, s.AdminToken, wantStatus, out)
}

// Problem is a decoded problem+json answer.
type Problem struct {
	Type      string `json:"type"`
	Title     string `json:"title"`
	Status    int    `json:"status"`
	Detail    string `json:"detail"`
	Code      string `json:"code"`
	Instance  string `json:"instance"`
	RequestID string `json:"request_id"`
	Errors    []struct {
		Field   string `json:"field"`
		Message string `json:"message"`
	} `json:"errors"`
	// Capability is capability_missing's member.
	Capability string `json:"capability"`
	// Raw is the whole body, for assertions that something is absent.
	Raw string `json:"-"`
}

// Problem sends one request and requires a problem+json answer with
// wantStatus and wantCode; it answers the decoded problem.
func (s *Server) Problem(t testing.TB, method, path string, body any, token string, wantStatus int, wantCode string) Problem {
	t.Helper()
	status, h, raw := s.Do(t, method, path, body, token)
	return RequireProblem(t, status, h, raw, wantStatus, wantCode)
}

// RequireProblem requires status, headers and body to be a problem+json
// answer with wantStatus and wantCode, and decodes it.
func RequireProblem(t testing.TB, status int, h http.Header, raw []byte, wantStatus int, wantCode string) Problem {
	t.Helper()
	require.Equal(t, wantStatus, status, "answer: %s", raw)
	require.True(t, strings.HasPrefix(h.Get("Content-Type"), "application/problem+json"),
		"Content-Type %q, want application/problem+json; answer: %s", h.Get("Content-Type"), raw)
	var p Problem
	require.NoError(t, json.Unmarshal(raw, &p), "decode problem: %s", raw)
	p.Raw = string(raw)
	require.Equal(t, wantCode, p.Code, "answer: %s", raw)
	require.Equal(t, wantStatus, p.Status, "answer: %s", raw)
	return p
}

// RandomID returns a fresh identifier with prefix, for ids tests choose.
func RandomID(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// LogBuffer is an io.Writer safe for a server's goroutines, for tests that
// read back what a server logged.
type LogBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
