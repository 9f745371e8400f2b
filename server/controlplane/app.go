package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/nodeward/nodeward"
	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/diagnose"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/handlers"
	"github.com/nodeward/nodeward/internal/memorypolicy"
	"github.com/nodeward/nodeward/keys"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/ledger/testkinds"
	"github.com/nodeward/nodeward/metrics"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/secrets"
	"github.com/nodeward/nodeward/static"
)

// App is one running control plane: its database, services and HTTP server.
type App struct {
	Config  Config
	Log     *slog.Logger
	DB      *models.DB
	Keys    *keys.Ring
	Auth    *auth.Service
	Fleet   *fleet.Service
	Ledger  *ledger.Service
	Secrets *secrets.Service
	Metrics *metrics.Metrics
	Handler http.Handler

	fleetStore *models.FleetStore
	debugLn    net.Listener // ListenDebug; served by Serve
	tlsCert    *tls.Certificate
	draining   atomic.Bool
	bg         sync.WaitGroup
}

// pendingCommands is scraped for the pending-commands gauge.
func (a *App) pendingCommands() float64 {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	n, err := a.fleetStore.CountPendingCommands(ctx)
	if err != nil {
		return -1
	}
	return float64(n)
}

// Open validates cfg, opens and migrates the database and builds the
// services; it does not listen. Close releases what it opened.
func Open(ctx context.Context, cfg Config, log *slog.Logger) (*App, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ring, generated, err := cfg.loadKeyRing()
	if err != nil {
		return nil, err
	}
	// The certificate is loaded before anything is opened or announced:
	// a server that cannot serve TLS must not print a setup link first.
	var cert *tls.Certificate
	if cfg.TLSCertFile != "" {
		c, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("load TLS certificate (NODEWARD_TLS_CERT_FILE, NODEWARD_TLS_KEY_FILE): %w", err)
		}
		cert = &c
	}
	if generated != "" {
		log.Warn("generated a new master key; back it up with the database: losing it invalidates every credential",
			"path", generated)
	}
	db, err := models.Open(ctx, models.Options{URL: cfg.DatabaseURL, DataDir: cfg.DataDir, WrapConnector: cfg.WrapDBConnector,
		MaxOpenConns: cfg.DBMaxConns, WriteLanes: cfg.DBWriteLanes})
	if err != nil {
		return nil, err
	}
	if err := db.Migrate(ctx); err != nil {
		_ = db.Close()
		return nil, err
	}
	a := &App{Config: cfg, Log: log, DB: db, Keys: ring, tlsCert: cert}
	caPEM := ""
	if cfg.TLSCAFile != "" {
		b, err := os.ReadFile(cfg.TLSCAFile)
		if err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("read TLS CA file: %w", err)
		}
		caPEM = string(b)
	}
	a.fleetStore = models.NewFleetStore(db, cfg.ReplicaID, nil)
	a.Metrics = metrics.New(a.pendingCommands)
	// The database pools' use and waits (go_sql_*): db_name "pool" is the
	// shared pool, "writer" SQLite's write connection.
	a.Metrics.Registry.MustRegister(collectors.NewDBStatsCollector(db.SQL(), "pool"))
	if w := db.WriterSQL(); w != nil {
		a.Metrics.Registry.MustRegister(collectors.NewDBStatsCollector(w, "writer"))
	}
	// What holds the write path back: batches spanning many nodes
	// (releasing a fan-out's held children, the dispatcher, the sweep) run
	// in the exclusive lane while no per-node lane commits (on SQLite every
	// batch does).
	a.Metrics.Registry.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "nodeward_write_exclusive_seconds_total",
			Help: "Time this replica's write batches ran in the exclusive lane, every per-node lane held back (on SQLite every write batch: the writer's busy time).",
		}, func() float64 { return a.fleetStore.GroupStats().Exclusive.Seconds() }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "nodeward_write_lane_gate_wait_seconds_total",
			Help: "Time per-node write lanes' batches waited for exclusive batches to finish, summed over the lanes (PostgreSQL).",
		}, func() float64 { return a.fleetStore.GroupStats().LaneGateWait.Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "nodeward_write_queued_requests",
			Help: "Write requests waiting for their batch now, over every lane (an enrollment that waits past the enrollment queue bound is shed).",
		}, func() float64 { return float64(a.fleetStore.GroupStats().Queued) }),
		// Settlements per statement: on PostgreSQL a write batch settles
		// every agent's results it carries in one statement.
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "nodeward_write_settle_statements_total",
			Help: "Statements that settled agents' results, each for every result request of its write batch (PostgreSQL).",
		}, func() float64 { return float64(a.fleetStore.GroupStats().SettleStatements) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "nodeward_write_settle_requests_total",
			Help: "Agents' result requests settled by those statements (PostgreSQL).",
		}, func() float64 { return float64(a.fleetStore.GroupStats().SettlesMerged) }),
		// Command submits per statement: on PostgreSQL a write batch
		// records its administrators' command submits together.
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "nodeward_write_issue_statements_total",
			Help: "Statements that recorded several command submits of a write batch ahead of its other requests (PostgreSQL).",
		}, func() float64 { return float64(a.fleetStore.GroupStats().IssueStatements) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "nodeward_write_issue_requests_total",
			Help: "Command submits recorded by those statements (PostgreSQL); the others ran a statement each.",
		}, func() float64 { return float64(a.fleetStore.GroupStats().IssuesMerged) }))
	// How long each write batch took, commit included: on SQLite the one
	// writer's transactions, so its tail is the tail every write queued
	// behind it waits (a slow disk sync shows here first).
	writeBatch := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "nodeward_write_batch_seconds",
		Help:    "Duration of this replica's group-committed write batches: one transaction from its begin to the end of its commit.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 13), // 0.5 ms … 2 s
	})
	a.Metrics.Registry.MustRegister(writeBatch)
	a.fleetStore.SetOnBatch(func(d time.Duration) { writeBatch.Observe(d.Seconds()) })
	if db.Dialect == models.SQLite {
		a.Metrics.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "nodeward_sqlite_checkpoint_frames_total",
			Help: "Pages of SQLite's write-ahead log copied into the database file by the background checkpointer, off the writer.",
		}, func() float64 { return float64(db.CheckpointStats().Frames) }))
	}
	// The collector: the GC percent in force (the memory policy's, set by
	// `serve`, or the operator's GOGC), whether the policy runs, and the
	// CPU the collector has cost.
	a.Metrics.Registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "nodeward_gc_percent",
			Help: "The Go collector's GC percent in force in this process: the memory policy's while it runs (nodeward_memory_policy_active), else GOGC's (-1: off).",
		}, memorypolicy.GCPercent),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "nodeward_memory_policy_active",
			Help: "1 while the memory policy sets the GC percent from the live heap (off with NODEWARD_MEMORY_POLICY=off, GOGC or GOMEMLIMIT set).",
		}, func() float64 {
			if memorypolicy.Active() {
				return 1
			}
			return 0
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "nodeward_memory_policy_releases_total",
			Help: "Times the memory policy returned the heap a busy spell grew to the OS when the spell ended (one full collection each).",
		}, func() float64 { return float64(memorypolicy.Releases()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "nodeward_gc_cpu_seconds_total",
			Help: "CPU the Go collector spent in this process (the runtime's estimate: assists, dedicated mark workers, pauses; idle-time marking left out).",
		}, memorypolicy.GCCPUSeconds))
	// On Postgres other replicas may revoke credentials this one cached:
	// the cache is on only while their notifications are heard.
	a.Auth = auth.New(auth.Options{Store: models.NewAuthStore(db).WithReplica(cfg.ReplicaID), Keys: ring, Now: cfg.Now,
		CacheTTL: cfg.CredentialCacheTTL, CrossReplica: db.Dialect == models.Postgres})
	a.Fleet = fleet.New(fleet.Options{
		Store: a.fleetStore,
		Keys:  ring,
		Settings: fleet.Settings{
			PublicURL:        cfg.PublicURL,
			AgentVersion:     cfg.AgentVersion,
			CACertificatePEM: caPEM,
			ReplicaID:        cfg.ReplicaID,
			Lease:            cfg.Lease,
			SessionTTL:       cfg.SessionTTL,
		},
		Now:          cfg.Now,
		Logger:       log,
		Metrics:      a.Metrics,
		CrossReplica: db.Dialect == models.Postgres,
		// Node failure text and workload output are scrubbed of the
		// values their commands were given (a fan-out child's are its
		// parent's).
		SecretValues: func(ctx context.Context, ids ...string) ([]string, error) {
			var all []string
			for _, id := range ids {
				op, err := a.Ledger.Get(ctx, ledger.Principal{Kind: ledger.PrincipalAdmin}, id)
				if errors.Is(err, ledger.ErrNotFound) {
					continue
				}
				if err != nil {
					return nil, err
				}
				vs, err := a.Secrets.Values(ctx, op.ID, op.ParentID)
				if err != nil {
					return nil, err
				}
				all = append(all, vs...)
			}
			return all, nil
		},
	})
	a.Secrets = secrets.New(secrets.Options{Store: models.NewSecretsStore(db), Keys: ring, Now: cfg.Now, Logger: log})
	ledgerStore := models.NewLedgerStore(a.fleetStore)
	// The owner of what this process runs is the process, not only its
	// replica name: a replica restarted under the same NODEWARD_REPLICA_ID
	// after a crash would otherwise count what its predecessor left running
	// as its own live work, and nothing would ever recover it.
	// Yet a replica name is one running process's at a time (it names
	// the replica's session listing; the default, host-pid, is unique by
	// itself), so the owners under this name are such predecessors: their
	// leases are dropped at start, not waited out.
	owner := cfg.ReplicaID + "/" + uuid.NewString()[:8]
	a.Ledger = ledger.New(ledger.Options{
		Store:        ledgerStore,
		Kinds:        ledger.NewRegistry(ledger.ServedKinds(a.Fleet)...),
		Settings:     ledger.Settings{Workers: cfg.LedgerWorkers, SingleProcess: db.Dialect == models.SQLite},
		Replica:      owner,
		Predecessors: cfg.ReplicaID + "/",
		Now:          cfg.Now,
		Logger:       log,
		Metrics:      a.Metrics,
		CrossReplica: db.Dialect == models.Postgres,
		// A package host's token revoked while its request was in flight
		// records nothing.
		CheckPrincipal: ledger.CheckPackageHostCurrent,
		Secrets:        a.Secrets,
		// Kinds naming an agent capability are refused for nodes that
		// lack it (DECISIONS.md §45).
		RequireCapability: a.Fleet.RequireCapability,
	})
	// The credential kinds carry out their work through the auth service.
	for _, k := range ledger.CredentialKinds(a.Auth) {
		a.Ledger.Kinds().Register(k)
	}
	// Desired configuration: documents are kept sealed at rest, and their
	// sealed values are resolved through the secrets service.
	a.Fleet.UseDocumentSealer(a.Secrets)
	for _, k := range ledger.ConfigKinds(a.Fleet, a.Secrets) {
		a.Ledger.Kinds().Register(k)
	}
	a.Metrics.ConfigLagging = func() (float64, bool) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		n, err := a.Fleet.CountLagging(ctx)
		return float64(n), err == nil
	}
	// diagnose.endpoint probes only where the operator allowed (checked by
	// Validate).
	allow, err := diagnose.ParseAllowlist(cfg.DiagnoseAllow)
	if err != nil {
		return nil, err
	}
	a.Ledger.Kinds().Register(ledger.EndpointKind(&diagnose.Prober{Allow: allow, Now: cfg.Now}, a.Secrets))
	// Only a build tagged nodeward_testkinds adds anything here.
	testkinds.Register(a.Ledger.Kinds(), cfg.ReplicaID)
	a.Metrics.OperationStates = func() (map[string]float64, bool) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		counts, err := ledgerStore.CountOpen(ctx)
		if err != nil {
			return nil, false
		}
		out := map[string]float64{}
		for st, n := range counts {
			out[string(st)] = float64(n)
		}
		return out, true
	}
	a.Metrics.CredentialCache = func() metrics.CredentialCacheCounts {
		st := a.Auth.CacheStats()
		return metrics.CredentialCacheCounts{Hits: st.Hits, StoreReads: st.StoreReads, Shared: st.Shared, Invalidations: st.Invalidations}
	}
	a.fleetStore.SetOnCommit(func(notes []fleet.Notification) { a.notifications().Deliver(notes, "local") })
	proxies, err := handlers.ParseTrustedProxies(cfg.TrustedProxies) // checked by Validate
	if err != nil {
		return nil, err
	}
	a.Handler = handlers.New(handlers.Deps{
		Logger:   log,
		Ready:    db,
		Auth:     a.Auth,
		Fleet:    a.Fleet,
		Ledger:   a.Ledger,
		Secrets:  a.Secrets,
		Metrics:  a.Metrics,
		OpenAPI:  nodeward.OpenAPI,
		Static:   static.Files,
		Draining: a.draining.Load,
		// Browsers reach the console over https when this server serves
		// TLS, or when its public URL is https (a proxy terminating TLS
		// in front, as the README suggests): either way the cookie is
		// Secure and answers carry HSTS.
		SecureCookies: cfg.TLSCertFile != "" || strings.HasPrefix(cfg.PublicURL, "https://"),
		// The same bound for the body as the server sets for the headers.
		BodyReadTimeout: cfg.ReadTimeout,
		TrustedProxies:  proxies,
	})
	return a, nil
}

// Close sends the notifications still held back, then releases the
// database.
func (a *App) Close() error {
	a.fleetStore.Flush()
	return a.DB.Close()
}

// Serve answers on ln until ctx ends, then drains: it refuses new work,
// answers held long-polls at once, and waits at most the shutdown grace for
// requests in flight. It returns nil after a clean drain.
func (a *App) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler: a.Handler,
		// Headers are bounded here; bodies per request by the handler, so
		// that long-polls and waits, which have no body, are not (a
		// whole-request ReadTimeout would also end their hang-up watch).
		ReadHeaderTimeout: a.Config.ReadTimeout,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          slog.NewLogLogger(a.Log.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	if a.tlsCert != nil {
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{*a.tlsCert}, MinVersion: tls.VersionTLS12}
		ln = tls.NewListener(ln, srv.TLSConfig)
	}
	bgCtx, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	// Connections already wait in ln's backlog; recovery goes first, while
	// it has the database to itself (ledger.Service.TakeOver). A stop
	// asked meanwhile cuts it short: the next owner takes over the rest.
	a.Ledger.TakeOver(ctx)
	a.startBackground(bgCtx)
	stopSocket := a.serveSocket()
	defer stopSocket()
	stopDebug := a.serveDebug()
	defer stopDebug()

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		stopBackground()
		a.bg.Wait()
		return err
	case <-ctx.Done():
	}

	start := time.Now()
	a.Log.Info("draining", "grace", a.Config.ShutdownGrace.String())
	a.draining.Store(true)
	a.drainLongPolls()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), a.Config.ShutdownGrace)
	defer cancel()
	err := srv.Shutdown(shutdownCtx)
	stopBackground()
	a.bg.Wait()
	if errors.Is(err, context.DeadlineExceeded) {
		_ = srv.Close()
		a.Log.Warn("grace period ended with requests in flight; closed them", "elapsed", time.Since(start).String())
		return nil
	}
	a.Log.Info("stopped", "elapsed_ms", time.Since(start).Milliseconds())
	if err == nil || errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// startBackground starts the fleet's background work and, on Postgres, the
// cross-replica notification listener; they stop when ctx ends.
func (a *App) startBackground(ctx context.Context) {
	a.bg.Add(1)
	go func() { defer a.bg.Done(); a.Fleet.Run(ctx) }()
	a.bg.Add(1)
	go func() { defer a.bg.Done(); a.Ledger.Run(ctx) }()
	a.bg.Add(1)
	go func() { defer a.bg.Done(); a.Secrets.RunSweeper(ctx, time.Minute) }()
	if a.DB.Dialect == models.Postgres {
		l := &models.Listener{URL: a.DB.URL, Channel: models.NotifyChannel(a.DB), Replica: a.Config.ReplicaID, Sink: a.notifications(), Log: a.Log}
		a.bg.Add(1)
		go func() { defer a.bg.Done(); l.Run(ctx) }()
		k := &models.TableKeeper{DB: a.DB, Log: a.Log, Maintained: func(m models.TableMaintenance) {
			action := "analyze"
			if m.Vacuum {
				action = "vacuum"
			}
			a.Metrics.TablesMaintained.WithLabelValues(m.Table, action).Inc()
		}}
		a.bg.Add(1)
		go func() { defer a.bg.Done(); k.Run(ctx) }()
	}
}

// drainLongPolls answers every held long-poll, waiting submit and watch at
// once.
func (a *App) drainLongPolls() {
	a.Fleet.Drain()
	a.Ledger.Drain()
}

// notifications hands what a commit here, or another replica, announced to
// the fleet, the ledger and the administrators' credential cache.
func (a *App) notifications() notifySink {
	return notifySink{fleet: a.Fleet, ledger: a.Ledger, auth: a.Auth}
}

type notifySink struct {
	fleet  *fleet.Service
	ledger *ledger.Service
	auth   *auth.Service
}

func (n notifySink) Deliver(notes []fleet.Notification, source string) {
	// Revocations first: an operation's end (which answers the request
	// that revoked) must not be heard before the revocation it carries.
	for _, note := range notes {
		if note.Kind == fleet.NotifyCredentials {
			n.auth.CredentialsChanged(note.NodeID, source)
		}
	}
	n.fleet.Deliver(notes, source)
	for _, note := range notes {
		switch note.Kind {
		case fleet.NotifyOperation:
			n.ledger.Changed(context.Background(), note.NodeID)
		case fleet.NotifyChildEnded:
			n.ledger.ChildEnded(note.NodeID)
		case fleet.NotifyDispatch:
			n.ledger.Dispatchable(note.NodeID)
		case fleet.NotifyResync:
			n.ledger.Resync()
			n.auth.Resync()
		}
	}
}

func (n notifySink) SetNotifierHealthy(ok bool) {
	n.fleet.SetNotifierHealthy(ok)
	n.ledger.SetNotifierHealthy(ok)
	n.auth.SetNotifierHealthy(ok)
}
