package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/server/controlplane"
)

// localServer is the control plane the tool starts in its own process
// (controlplane.Open + Serve, the same wiring as the binary), on a fresh
// SQLite data folder or a fresh schema of a Postgres database.
type localServer struct {
	URL     string
	Token   string
	App     *controlplane.App
	Dialect string
	// SchemaURL is the Postgres URL of the private schema (empty on SQLite).
	SchemaURL string

	masterKey string
	cancel    context.CancelFunc
	served    chan error
	cleanup   []func()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// startLocal starts the server. baseURL selects Postgres (a schema of its
// own is created in that database and dropped by Close); empty is SQLite.
func startLocal(ctx context.Context, baseURL string, logTo io.Writer) (*localServer, error) {
	return startLocalWith(ctx, localOptions{BaseURL: baseURL, LogTo: logTo})
}

// localOptions shape a server the tool starts.
type localOptions struct {
	// BaseURL selects Postgres (a fresh schema in that database); empty is
	// SQLite.
	BaseURL string
	// Join starts another replica on the database of an earlier one.
	Join *localServer
	// Replica names the replica (default "loadtest").
	Replica       string
	LedgerWorkers int
	// Setup runs after the control plane is built, before it serves (the
	// ledger scenario registers its no-op kind here).
	Setup func(*controlplane.App)
	LogTo io.Writer
}

func startLocalWith(ctx context.Context, o localOptions) (*localServer, error) {
	baseURL, logTo := o.BaseURL, o.LogTo
	s := &localServer{Dialect: models.SQLite}
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	replica := o.Replica
	if replica == "" {
		replica = "loadtest"
	}
	cfg := controlplane.Config{Listen: addr, PublicURL: "http://" + addr, AgentVersion: "loadtest",
		ShutdownGrace: 10 * time.Second, LogLevel: "warn", LogFormat: "text", ReplicaID: replica, LedgerWorkers: o.LedgerWorkers}
	// The in-process server takes the write lanes from the environment, as
	// the binary does (to compare one lane with several in one sitting).
	if n, err := strconv.Atoi(os.Getenv("NODEWARD_DB_WRITE_LANES")); err == nil {
		cfg.DBWriteLanes = n
	}
	// The node lease, as the binary reads it (NODEWARD_LEASE; default 90 s):
	// a short one fits several renewal periods into one window.
	if v := os.Getenv("NODEWARD_LEASE"); v != "" {
		lease, err := time.ParseDuration(v)
		if err != nil {
			_ = ln.Close()
			return nil, fmt.Errorf("NODEWARD_LEASE: %w", err)
		}
		cfg.Lease = lease
	}
	switch {
	case o.Join != nil:
		if o.Join.Dialect != models.Postgres {
			_ = ln.Close()
			return nil, errors.New("only Postgres is shared by replicas")
		}
		s.Dialect, s.SchemaURL = models.Postgres, o.Join.SchemaURL
		cfg.DatabaseURL, cfg.MasterKey = o.Join.SchemaURL, o.Join.masterKey
	case baseURL == "":
		dir, err := os.MkdirTemp("", "nodeward-loadtest-")
		if err != nil {
			_ = ln.Close()
			return nil, err
		}
		s.cleanup = append(s.cleanup, func() { _ = os.RemoveAll(dir) })
		cfg.DataDir = dir
	default:
		s.Dialect = models.Postgres
		schemaURL, drop, err := newSchema(ctx, baseURL)
		if err != nil {
			_ = ln.Close()
			return nil, err
		}
		s.cleanup = append(s.cleanup, drop)
		s.SchemaURL = schemaURL
		cfg.DatabaseURL = schemaURL
		cfg.MasterKey = randomHex(32)
	}
	s.masterKey = cfg.MasterKey
	log := slog.New(slog.NewTextHandler(logTo, &slog.HandlerOptions{Level: slog.LevelWarn}))
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	app, err := controlplane.Open(sctx, cfg, log)
	if err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("open control plane: %w", err)
	}
	s.App = app
	s.cleanup = append(s.cleanup, func() { _ = app.Close() })
	if o.Setup != nil {
		o.Setup(app)
	}
	s.served = make(chan error, 1)
	go func() { s.served <- app.Serve(sctx, ln) }()
	s.URL = "http://" + addr
	if o.Join != nil {
		s.Token = o.Join.Token
		ok = true
		return s, nil
	}
	if _, err := app.Auth.CreateAdmin(sctx, "loadtest", randomHex(16)); err != nil {
		return nil, fmt.Errorf("create administrator: %w", err)
	}
	if s.Token, _, err = app.Auth.CreateTokenFor(sctx, "loadtest", "loadtest"); err != nil {
		return nil, fmt.Errorf("create API token: %w", err)
	}
	ok = true
	return s, nil
}

// Close drains and stops the server and removes its database.
func (s *localServer) Close() {
	if s.cancel != nil {
		s.cancel()
	}
	if s.served != nil {
		select {
		case <-s.served:
		case <-time.After(30 * time.Second):
		}
	}
	for i := len(s.cleanup) - 1; i >= 0; i-- {
		s.cleanup[i]()
	}
}

// newSchema creates a private schema in the database at baseURL and
// answers a URL whose connections use it, and a func that drops it.
func newSchema(ctx context.Context, baseURL string) (string, func(), error) {
	admin, err := models.Open(ctx, models.Options{URL: baseURL, MaxOpenConns: 2})
	if err != nil {
		return "", nil, err
	}
	schema := "nwload_" + randomHex(6)
	if err := admin.WithContext(ctx).Exec("CREATE SCHEMA " + schema).Error; err != nil {
		_ = admin.Close()
		return "", nil, fmt.Errorf("create schema: %w", err)
	}
	drop := func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = admin.WithContext(dctx).Exec("DROP SCHEMA " + schema + " CASCADE").Error
		_ = admin.Close()
	}
	u, err := url.Parse(baseURL)
	if err != nil {
		drop()
		return "", nil, errors.New("database URL does not parse")
	}
	q := u.Query()
	q.Set("search_path", schema)
	q.Set("application_name", schema) // the load tool's wait sampling picks its backends by it
	u.RawQuery = q.Encode()
	return u.String(), drop, nil
}

// pgCommits answers the database's committed transactions so far
// (pg_stat_database.xact_commit; the statistics lag by up to the stats
// interval, fine over a run of many seconds).
func pgCommits(ctx context.Context, db *models.DB) (int64, error) {
	var n int64
	err := db.WithContext(ctx).Raw("SELECT pg_stat_get_db_xact_commit(oid) FROM pg_database WHERE datname = current_database()").Scan(&n).Error
	return n, err
}
