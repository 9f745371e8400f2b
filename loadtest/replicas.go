package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nodeward/nodeward/models"
)

// procCluster is the real server binary run as one or more processes on
// loopback (the storm, enroll -binary and -replicas runs): built from this
// module, an administrator and an API token made through its CLI, every
// replica serving the same database with the same master key and its own
// replica id. More than one replica needs Postgres.
type procCluster struct {
	dir, bin string
	env      []string // shared by every replica: database, master key
	Token    string
	Database string // sqlite or postgres
	// SchemaURL is the Postgres URL of the private schema (empty on SQLite).
	SchemaURL string
	Replicas  []*procReplica
	log       io.Writer
	drop      func()
}

// procReplica is one server process.
type procReplica struct {
	ID, Addr, URL string
	// DebugAddr is its debug listener (profiles): with NODEWARD_DEBUG_ADDR
	// host:port in the tool's environment, replica i listens on port+i.
	DebugAddr string
	logPath   string
	cmd       *exec.Cmd
	exited    chan struct{}
	// Starts counts the times this replica was started.
	Starts int
}

// clusterOptions shape a procCluster.
type clusterOptions struct {
	Replicas    int
	DatabaseURL string // Postgres (a private schema, dropped by Close); empty: SQLite
	Log         io.Writer
}

// startCluster builds the server, prepares its database and starts every
// replica, answering once each is ready. Close it even on error.
func startCluster(ctx context.Context, o clusterOptions) (*procCluster, error) {
	if o.Replicas < 1 {
		o.Replicas = 1
	}
	if o.Replicas > 1 && o.DatabaseURL == "" {
		return nil, errors.New("more than one replica needs Postgres (-db postgres)")
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	dir, err := os.MkdirTemp("", "nodeward-procs-")
	if err != nil {
		return nil, err
	}
	c := &procCluster{dir: dir, bin: filepath.Join(dir, "nodeward"), log: o.Log, Database: "sqlite"}
	if err := goBuild(ctx, c.bin, "./server"); err != nil {
		return c, err
	}
	c.env = append(os.Environ(), "NODEWARD_MASTER_KEY="+randomHex(32), "NODEWARD_AGENT_VERSION=loadtest",
		"NODEWARD_LOG_LEVEL=warn", "NODEWARD_LOG_FORMAT=json")
	if o.DatabaseURL != "" {
		schemaURL, drop, err := newSchema(ctx, o.DatabaseURL)
		if err != nil {
			return c, err
		}
		c.drop, c.Database, c.SchemaURL = drop, "postgres", schemaURL
		c.env = append(c.env, "NODEWARD_DATABASE_URL="+schemaURL)
		if o.Replicas > 1 {
			// As the README tells operators: replicas × (pool + 1) must fit
			// the server's connections, with room for this tool's own.
			pool, err := replicaPool(ctx, schemaURL, o.Replicas)
			if err != nil {
				return c, err
			}
			c.env = append(c.env, "NODEWARD_DB_MAX_CONNS="+strconv.Itoa(pool))
			fmt.Fprintf(o.Log, "loadtest: %d replicas, %d database connections each\n", o.Replicas, pool)
		}
	} else {
		c.env = append(c.env, "NODEWARD_DATA_DIR="+filepath.Join(dir, "data"))
	}
	if _, err := c.cli(ctx, "loadtest-password\n", "admin", "create", "--username", "loadtest", "--password-stdin"); err != nil {
		return c, err
	}
	if c.Token, err = c.cli(ctx, "", "token", "create", "--name", "loadtest"); err != nil {
		return c, err
	}
	for i := range o.Replicas {
		addr, err := freeLoopbackAddr()
		if err != nil {
			return c, err
		}
		r := &procReplica{ID: "loadtest-" + strconv.Itoa(i+1), Addr: addr, URL: "http://" + addr,
			DebugAddr: debugAddrOf(i), logPath: filepath.Join(dir, "server-"+strconv.Itoa(i+1)+".log")}
		c.Replicas = append(c.Replicas, r)
		if err := c.Start(ctx, r); err != nil {
			return c, err
		}
	}
	return c, nil
}

func (c *procCluster) cli(ctx context.Context, stdin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, c.bin, args...)
	cmd.Env, cmd.Stdin = c.env, strings.NewReader(stdin)
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("nodeward %s: %w: %s", args[0], err, ee.Stderr)
		}
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}

// URLs answers every replica's base URL.
func (c *procCluster) URLs() []string {
	out := make([]string, len(c.Replicas))
	for i, r := range c.Replicas {
		out[i] = r.URL
	}
	return out
}

// toolConnections are the connections this tool and a person watching the
// run may hold on the database beside the replicas' (the schema's owner,
// pgbench's, a psql).
const toolConnections = 8

// replicaPool answers the pool each of n replicas may hold so that they,
// each with its notification connection, fit Postgres's max_connections
// (less the superusers' reserve and toolConnections); at most the
// server's default of 32.
func replicaPool(ctx context.Context, url string, n int) (int, error) {
	db, err := models.Open(ctx, models.Options{URL: url, MaxOpenConns: 1})
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var avail int
	if err := db.WithContext(ctx).Raw(`SELECT current_setting('max_connections')::int
		- current_setting('superuser_reserved_connections')::int`).Scan(&avail).Error; err != nil {
		return 0, err
	}
	pool := min(32, (avail-toolConnections)/n-1)
	if pool < 4 {
		return 0, fmt.Errorf("%d replicas do not fit Postgres's %d connections: raise max_connections", n, avail)
	}
	return pool, nil
}

// debugAddrOf answers replica i's debug listener: NODEWARD_DEBUG_ADDR's
// port plus i (so several replicas can each be profiled), or "" when the
// tool's environment sets none.
func debugAddrOf(i int) string {
	host, port, err := net.SplitHostPort(os.Getenv("NODEWARD_DEBUG_ADDR"))
	if err != nil {
		return ""
	}
	p, err := strconv.Atoi(port)
	if err != nil || p == 0 {
		return ""
	}
	return net.JoinHostPort(host, strconv.Itoa(p+i))
}

// Start starts a replica (again, after Stop) on its address and waits
// until it is ready.
func (c *procCluster) Start(ctx context.Context, r *procReplica) error {
	if err := c.Spawn(r); err != nil {
		return err
	}
	if err := waitReady(ctx, &http.Client{Transport: transportFor(""), Timeout: 5 * time.Second}, r.URL); err != nil {
		return fmt.Errorf("replica %s: %w; log:\n%s", r.ID, err, r.LogTail(20))
	}
	return nil
}

// Spawn starts a replica's process without waiting for it to be ready.
func (c *procCluster) Spawn(r *procReplica) error {
	logFile, err := os.OpenFile(r.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(c.bin, "serve")
	cmd.Env = append(c.env, "NODEWARD_LISTEN="+r.Addr, "NODEWARD_PUBLIC_URL="+r.URL, "NODEWARD_REPLICA_ID="+r.ID)
	if r.DebugAddr != "" {
		cmd.Env = append(cmd.Env, "NODEWARD_DEBUG_ADDR="+r.DebugAddr)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return err
	}
	r.cmd, r.exited = cmd, make(chan struct{})
	r.Starts++
	go func() { _ = cmd.Wait(); _ = logFile.Close(); close(r.exited) }()
	return nil
}

// Stop signals a replica (SIGKILL, or SIGTERM for a drain; a drain that
// takes over 30 s is killed) and waits until it exited.
func (c *procCluster) Stop(r *procReplica, sig syscall.Signal) {
	if r.cmd == nil {
		return
	}
	select {
	case <-r.exited:
		return
	default:
	}
	_ = r.cmd.Process.Signal(sig)
	select {
	case <-r.exited:
	case <-time.After(30 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.exited
	}
}

// PID answers the replica's process id (0 when not running).
func (r *procReplica) PID() int {
	if r.cmd == nil || r.cmd.Process == nil {
		return 0
	}
	return r.cmd.Process.Pid
}

// LogTail answers the last n lines of the replica's log.
func (r *procReplica) LogTail(n int) string {
	b, _ := os.ReadFile(r.logPath)
	return lastLines(string(b), n)
}

// Errors answers the last n error lines of the replica's log.
func (r *procReplica) Errors(n int) string {
	b, _ := os.ReadFile(r.logPath)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, `"level":"ERROR"`) {
			out = append(out, l)
		}
	}
	return strings.Join(out[max(0, len(out)-n):], "\n")
}

// Close stops every replica (SIGTERM: a drain) and removes the database.
func (c *procCluster) Close() {
	for _, r := range c.Replicas {
		c.Stop(r, syscall.SIGTERM)
	}
	if c.drop != nil {
		c.drop()
	}
	_ = os.RemoveAll(c.dir)
}

// ReplicaStat is one server process over a measuring window.
type ReplicaStat struct {
	ID        string  `json:"id"`
	URL       string  `json:"url"`
	PID       int     `json:"pid"`
	Cores     float64 `json:"cores"`      // CPU over the window
	RSSKB     int64   `json:"rss_kb"`     // at the end of the window
	OpenFiles int     `json:"open_files"` // at the end of the window
	Held      int     `json:"long_polls_held"`
	// Enrollments the replica answered over the window, and how many of
	// them took it over 1 s and over 4 s (its request-duration
	// histogram's buckets): a client-side tail the server did not see is
	// the client's or the machine's.
	Enrolls       int `json:"enrollments,omitempty"`
	EnrollsOver1s int `json:"enrollments_over_1s,omitempty"`
	EnrollsOver4s int `json:"enrollments_over_4s,omitempty"`
	// What held its writes back over the window, in seconds: its batches
	// in the exclusive lane (every per-node lane held back meanwhile), its
	// lanes' waits for them, and requests' waits for a pooled connection.
	ExclusiveS float64 `json:"exclusive_s"`
	GateWaitS  float64 `json:"lane_gate_wait_s"`
	PoolWaitS  float64 `json:"pool_wait_s"`
}

// replicaWindow measures the replicas' CPU over a window: call begin at
// its start and end at its end.
type replicaWindow struct {
	c    *procCluster
	t0   time.Time
	cpu0 []float64
	m0   []map[string]float64
}

func (c *procCluster) begin() *replicaWindow {
	w := &replicaWindow{c: c, t0: time.Now()}
	for _, r := range c.Replicas {
		w.cpu0 = append(w.cpu0, processCPU(r.PID()))
		m, _ := scrape(context.Background(), r.URL)
		w.m0 = append(w.m0, m)
	}
	return w
}

func (w *replicaWindow) end(ctx context.Context) []ReplicaStat {
	secs := time.Since(w.t0).Seconds()
	var out []ReplicaStat
	for i, r := range w.c.Replicas {
		s := ReplicaStat{ID: r.ID, URL: r.URL, PID: r.PID(), RSSKB: rssKB(r.PID()), OpenFiles: openFiles(r.PID())}
		if secs > 0 {
			s.Cores = (processCPU(r.PID()) - w.cpu0[i]) / secs
		}
		if m, err := scrape(ctx, r.URL); err == nil {
			s.Held = int(m["nodeward_open_long_polls"])
			delta := func(le string) int {
				k := `nodeward_http_request_duration_seconds_bucket{route="/agent/v1/enroll",le="` + le + `"}`
				return int(m[k] - w.m0[i][k])
			}
			since := func(k string) float64 { return m[k] - w.m0[i][k] }
			s.ExclusiveS = since("nodeward_write_exclusive_seconds_total")
			s.GateWaitS = since("nodeward_write_lane_gate_wait_seconds_total")
			s.PoolWaitS = since(`go_sql_wait_duration_seconds_total{db_name="pool"}`)
			s.Enrolls = delta("+Inf")
			s.EnrollsOver1s = s.Enrolls - delta("1.024")
			s.EnrollsOver4s = s.Enrolls - delta("4.096")
		}
		out = append(out, s)
	}
	return out
}

// openFiles answers a process's open file descriptors (from /proc), or 0.
func openFiles(pid int) int {
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		return 0
	}
	return len(ents)
}

// scrapeClient is the one transport every scrape of a replica's /metrics
// goes through (a transport per scrape would leave an idle connection
// each, on both sides, for the idle timeout).
var scrapeClient = &adminClient{tr: transportFor(""), hc: &http.Client{Timeout: 10 * time.Second}}

func init() { scrapeClient.hc.Transport = scrapeClient.tr }

// scrape reads a server's /metrics (open to all: no token).
func scrape(ctx context.Context, url string) (map[string]float64, error) {
	a := *scrapeClient
	a.url = url
	return a.metrics(ctx)
}

// sampleServers sums, over every replica, the long-polls held now, the
// resuming polls taken and the commands pending (a replica that does not
// answer counts nothing); the storm's own fields are left to it.
func sampleServers(ctx context.Context, urls []string) StormSample {
	var smp StormSample
	for _, u := range urls {
		if m, err := scrape(ctx, u); err == nil {
			smp.Held += int(m["nodeward_open_long_polls"])
			smp.Resumed += int(m["nodeward_long_poll_resumes_total"])
			smp.Pending += int(m["nodeward_pending_commands"])
		}
	}
	return smp
}

func printReplicaStats(w io.Writer, stats []ReplicaStat) {
	for _, s := range stats {
		fmt.Fprintf(w, "replica %-16s pid %d: %.2f cores, RSS %d KB, %d open files, %d long-polls held\n",
			s.ID, s.PID, s.Cores, s.RSSKB, s.OpenFiles, s.Held)
		if s.ExclusiveS+s.GateWaitS+s.PoolWaitS > 0 {
			fmt.Fprintf(w, "  writes held back: exclusive lane %.2f s, lanes waiting for it %.2f s; pool waits %.2f s\n",
				s.ExclusiveS, s.GateWaitS, s.PoolWaitS)
		}
		if s.Enrolls > 0 {
			fmt.Fprintf(w, "  answered %d enrollments: %d took it over 1 s, %d over 4 s\n", s.Enrolls, s.EnrollsOver1s, s.EnrollsOver4s)
		}
		if s.OpenFiles > 19000 {
			fmt.Fprintf(w, "  over 19,000 open files: the 20,000 limit (DECISIONS.md §31) is near; add a replica\n")
		}
	}
}

// holdReplicas is the hold scenario's server side on cfg.Replicas
// processes sharing the Postgres: each replica's RSS idle and holding its
// share of the polls (and its cores) is sampled once every poll is held,
// then commands are delivered at cfg.Rate through all of them.
func holdReplicas(ctx context.Context, cfg HoldConfig, logf func(string, ...any)) ([]HoldSide, Report, error) {
	cl, err := startCluster(ctx, clusterOptions{Replicas: cfg.Replicas, DatabaseURL: cfg.DatabaseURL, Log: cfg.Log})
	if cl != nil {
		defer cl.Close()
	}
	if err != nil {
		return nil, Report{}, err
	}
	sides := make([]HoldSide, len(cl.Replicas))
	for i, r := range cl.Replicas {
		sides[i].IdleRSSKB = rssKB(r.PID())
	}
	urls := cl.URLs()
	logf("%d replicas ready on %v; holding %d agents", len(urls), urls, cfg.Agents)
	dcfg := Config{Agents: cfg.Agents, AgentsPerWorker: cfg.AgentsPerWorker, Rate: cfg.Rate, Duration: cfg.Duration,
		Wait: cfg.Wait, URL: urls[0], Replicas: urls[1:], Token: cl.Token, WorkerCommand: cfg.WorkerCommand, Log: cfg.Log,
		P99Target: cfg.P99Target, PGStatURL: cl.SchemaURL,
		OnHeld: func(ctx context.Context, held int) {
			if !sleepCtx(ctx, cfg.Settle) {
				return
			}
			win := cl.begin()
			peak := make([]int64, len(cl.Replicas))
			for end := time.Now().Add(cfg.Sample); time.Now().Before(end); {
				for i, r := range cl.Replicas {
					peak[i] = max(peak[i], rssKB(r.PID()))
				}
				if !sleepCtx(ctx, time.Second) {
					return
				}
			}
			for i, st := range win.end(ctx) {
				s := &sides[i]
				s.Held, s.Cores, s.HeldRSSKB = st.Held, st.Cores, max(peak[i], st.RSSKB)
				if s.Held > 0 {
					s.PerPollKB = float64(s.HeldRSSKB-s.IdleRSSKB) / float64(s.Held)
				}
				logf("replica %s: %d held, %d KB idle, %d KB holding (%.1f KB a poll), %.2f cores, %d open files",
					st.ID, s.Held, s.IdleRSSKB, s.HeldRSSKB, s.PerPollKB, s.Cores, st.OpenFiles)
			}
		}}
	var mu sync.Mutex
	var win *replicaWindow
	var stats []ReplicaStat
	dcfg.OnWindow = func(ctx context.Context, begin bool) {
		mu.Lock()
		defer mu.Unlock()
		if begin {
			win = cl.begin()
		} else {
			stats = win.end(ctx)
		}
	}
	rep, err := Run(ctx, dcfg)
	mu.Lock()
	rep.Replicas, rep.Database = stats, cl.Database
	mu.Unlock()
	return sides, rep, err
}
