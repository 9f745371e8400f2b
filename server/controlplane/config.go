// Package controlplane is the control plane's wiring and lifecycle:
// configuration from flags and environment, opening and migrating the
// database, building the services, serving HTTP, running the background
// sweepers, and draining on shutdown. It holds no business rules. Tests start
// the real server through New and Serve.
package controlplane

import (
	"crypto/rand"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nodeward/nodeward/diagnose"
	"github.com/nodeward/nodeward/handlers"
	"github.com/nodeward/nodeward/keys"
)

// Config is everything the server is told. Names of flags and environment
// variables are stable: scripts depend on them.
type Config struct {
	Listen        string // NODEWARD_LISTEN
	DataDir       string // NODEWARD_DATA_DIR
	DatabaseURL   string // NODEWARD_DATABASE_URL
	PublicURL     string // NODEWARD_PUBLIC_URL
	MasterKey     string // NODEWARD_MASTER_KEY (never a flag: flags show in ps)
	MasterKeyFile string // NODEWARD_MASTER_KEY_FILE
	AgentVersion  string // NODEWARD_AGENT_VERSION
	TLSCertFile   string // NODEWARD_TLS_CERT_FILE
	TLSKeyFile    string // NODEWARD_TLS_KEY_FILE
	TLSCAFile     string // NODEWARD_TLS_CA_FILE: a private CA handed to agents in bootstraps
	ShutdownGrace time.Duration
	LogLevel      string
	LogFormat     string        // json or text
	ReplicaID     string        // NODEWARD_REPLICA_ID; default hostname-pid
	Lease         time.Duration // NODEWARD_LEASE; default 90s
	SessionTTL    time.Duration // NODEWARD_SESSION_TTL; default 30m
	// ReadTimeout bounds the time a client may take to send a request's
	// headers, and again its body (NODEWARD_READ_TIMEOUT; default 10s).
	// Long-polls and other waits are not bounded by it.
	ReadTimeout time.Duration
	// LedgerWorkers bounds the local operations this replica runs at once
	// (NODEWARD_LEDGER_WORKERS; default 16). Node commands hold no slot.
	LedgerWorkers int
	// DBMaxConns bounds this replica's database connections
	// (NODEWARD_DB_MAX_CONNS); 0 is the dialect's default, 32 on Postgres
	// and 8 on SQLite (whose write transactions have one more of their
	// own, models.DB). Every replica holds up to this many, so replicas ×
	// DBMaxConns must stay under the server's max_connections.
	DBMaxConns int
	// dbMaxConns is the setting as given, checked by Validate (so a bad
	// value from the environment or a flag stops the server with one line
	// naming it).
	dbMaxConns poolSize
	// DBWriteLanes is how many write batches a Postgres replica commits
	// at once (NODEWARD_DB_WRITE_LANES; models/group.go); 0 is the
	// default, a quarter of the pool and at most 4; 1 commits one batch at
	// a time. SQLite commits one.
	DBWriteLanes int
	dbWriteLanes poolSize
	// envErrs holds environment values that did not parse, by variable
	// name; Validate refuses the first (a flag given for it clears it).
	envErrs map[string]error
	// DiagnoseAllow is where diagnose.endpoint may probe: CIDRs and host
	// names, comma-separated (NODEWARD_DIAGNOSE_ALLOW); empty refuses
	// every destination.
	DiagnoseAllow string
	// TrustedProxies are the balancers or reverse proxies in front of
	// this replica, CIDRs and addresses, comma-separated
	// (NODEWARD_TRUSTED_PROXIES): a request from one is taken to come from
	// the address it forwards in X-Forwarded-For (the sign-in limit, the
	// audit and the access log). Empty, the default: the header is ignored.
	TrustedProxies string
	// DebugAddr is where the debug listener serves the runtime's profiles
	// (net/http/pprof), on its own loopback address, never the public one
	// (NODEWARD_DEBUG_ADDR; empty, the default: off).
	DebugAddr string

	// CredentialCacheTTL is how long a verified API token, package host
	// token or console session is trusted without a database read (the
	// bound on a revocation whose notification was lost); 0 is
	// auth.DefaultCacheTTL (5 s), negative turns the cache off. Not an
	// operator setting: tests lengthen it to prove that revocations reach
	// the cache by notification rather than by expiry.
	CredentialCacheTTL time.Duration

	// Now is the clock (tests inject one); nil is time.Now.
	Now func() time.Time
	// WrapDBConnector wraps the Postgres driver's connector (the write-path
	// counters of handlers' tests count through it); nil in production.
	WrapDBConnector func(driver.Connector) driver.Connector
}

// maxDBConns bounds DBMaxConns: far above any Postgres max_connections
// in use, low enough that a typo (an extra digit or three) is refused.
const maxDBConns = 10000

// poolSize is the text of the database pool size setting, from the
// environment or the flag; Validate parses it.
// maxWriteLanes bounds DBWriteLanes: each lane holds a connection while
// its batch commits.
const maxWriteLanes = 64

type poolSize struct{ raw string }

func (p *poolSize) String() string {
	if p == nil {
		return ""
	}
	return p.raw
}

func (p *poolSize) Set(v string) error {
	p.raw = v
	return nil
}

// DefaultReadTimeout is the default of Config.ReadTimeout.
const DefaultReadTimeout = 10 * time.Second

// durationSetting is a duration flag whose default may come from the
// environment. An environment value that is not a duration is kept as an
// error for Validate (the server must not start on a silently defaulted
// lease or session lifetime), unless the flag, which wins, replaces it.
type durationSetting struct {
	dst  *time.Duration
	env  string
	errs map[string]error
}

func (d *durationSetting) String() string {
	if d == nil || d.dst == nil {
		return ""
	}
	return d.dst.String()
}

func (d *durationSetting) Set(v string) error {
	n, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil {
		return errors.New("want a duration with its unit, like 90s or 30m")
	}
	*d.dst = n
	delete(d.errs, d.env)
	return nil
}

// bindDuration declares a duration flag defaulting to the environment
// variable env, or def when env is unset.
func bindDuration(fs *flag.FlagSet, c *Config, getenv func(string) string, dst *time.Duration, name, env string, def time.Duration, usage string) {
	if c.envErrs == nil {
		c.envErrs = map[string]error{}
	}
	*dst = def
	if raw := getenv(env); raw != "" {
		n, err := time.ParseDuration(strings.TrimSpace(raw))
		if err != nil {
			c.envErrs[env] = fmt.Errorf("%s %q: want a duration with its unit, like 90s or 30m (--%s sets it too)", env, raw, name)
		} else {
			*dst = n
		}
	}
	fs.Var(&durationSetting{dst: dst, env: env, errs: c.envErrs}, name, usage)
}

// envOr returns the environment value of name, or def.
func envOr(getenv func(string) string, name, def string) string {
	if v := getenv(name); v != "" {
		return v
	}
	return def
}

// bindFlags declares the common flags on fs with defaults from the environment.
func bindFlags(fs *flag.FlagSet, c *Config, getenv func(string) string) {
	fs.StringVar(&c.Listen, "listen", envOr(getenv, "NODEWARD_LISTEN", "127.0.0.1:8080"), "address to listen on (NODEWARD_LISTEN)")
	fs.StringVar(&c.DataDir, "data-dir", envOr(getenv, "NODEWARD_DATA_DIR", "data"), "data folder for the embedded database and generated key (NODEWARD_DATA_DIR)")
	fs.StringVar(&c.DatabaseURL, "database-url", envOr(getenv, "NODEWARD_DATABASE_URL", ""), "PostgreSQL URL; empty uses embedded SQLite (NODEWARD_DATABASE_URL)")
	fs.StringVar(&c.PublicURL, "public-url", envOr(getenv, "NODEWARD_PUBLIC_URL", ""), "URL agents use to reach this control plane (NODEWARD_PUBLIC_URL)")
	fs.StringVar(&c.MasterKeyFile, "master-key-file", envOr(getenv, "NODEWARD_MASTER_KEY_FILE", ""), "file holding the master key(s) (NODEWARD_MASTER_KEY_FILE)")
	fs.StringVar(&c.AgentVersion, "agent-version", envOr(getenv, "NODEWARD_AGENT_VERSION", ""), "agent version pinned in bootstraps (NODEWARD_AGENT_VERSION)")
	fs.StringVar(&c.TLSCertFile, "tls-cert", envOr(getenv, "NODEWARD_TLS_CERT_FILE", ""), "TLS certificate file (NODEWARD_TLS_CERT_FILE)")
	fs.StringVar(&c.TLSKeyFile, "tls-key", envOr(getenv, "NODEWARD_TLS_KEY_FILE", ""), "TLS key file (NODEWARD_TLS_KEY_FILE)")
	fs.StringVar(&c.TLSCAFile, "tls-ca", envOr(getenv, "NODEWARD_TLS_CA_FILE", ""), "private CA certificate handed to agents in bootstraps (NODEWARD_TLS_CA_FILE)")
	bindDuration(fs, c, getenv, &c.ShutdownGrace, "shutdown-grace", "NODEWARD_SHUTDOWN_GRACE", 15*time.Second, "how long shutdown waits for requests (NODEWARD_SHUTDOWN_GRACE)")
	fs.StringVar(&c.LogLevel, "log-level", envOr(getenv, "NODEWARD_LOG_LEVEL", "info"), "debug, info, warn or error (NODEWARD_LOG_LEVEL)")
	fs.StringVar(&c.LogFormat, "log-format", envOr(getenv, "NODEWARD_LOG_FORMAT", "json"), "json or text (NODEWARD_LOG_FORMAT)")
	fs.StringVar(&c.ReplicaID, "replica-id", envOr(getenv, "NODEWARD_REPLICA_ID", ""), "this replica's name in session listings (NODEWARD_REPLICA_ID)")
	bindDuration(fs, c, getenv, &c.Lease, "lease", "NODEWARD_LEASE", 90*time.Second, "node lease; heartbeats are asked for every third of it (NODEWARD_LEASE)")
	bindDuration(fs, c, getenv, &c.SessionTTL, "session-ttl", "NODEWARD_SESSION_TTL", 30*time.Minute, "agent session credential lifetime: an agent away longer than this needs a reinvite (NODEWARD_SESSION_TTL)")
	bindDuration(fs, c, getenv, &c.ReadTimeout, "read-timeout", "NODEWARD_READ_TIMEOUT", DefaultReadTimeout, "time a client may take to send a request's headers, and its body (NODEWARD_READ_TIMEOUT)")
	workers, err := strconv.Atoi(envOr(getenv, "NODEWARD_LEDGER_WORKERS", "16"))
	if err != nil {
		workers = -1 // refused by Validate, naming the setting
	}
	fs.IntVar(&c.LedgerWorkers, "ledger-workers", workers, "local operations run at once by this replica (NODEWARD_LEDGER_WORKERS)")
	c.dbMaxConns = poolSize{raw: getenv("NODEWARD_DB_MAX_CONNS")}
	fs.Var(&c.dbMaxConns, "db-max-conns", "database connections this replica holds at most; replicas × this must stay under Postgres max_connections (NODEWARD_DB_MAX_CONNS; default 32 on PostgreSQL, 8 on SQLite)")
	c.dbWriteLanes = poolSize{raw: getenv("NODEWARD_DB_WRITE_LANES")}
	fs.Var(&c.dbWriteLanes, "db-write-lanes", "write batches a PostgreSQL replica commits at once, each on its own connection (NODEWARD_DB_WRITE_LANES; default a quarter of the pool, at most 4)")
	fs.StringVar(&c.DiagnoseAllow, "diagnose-allow", envOr(getenv, "NODEWARD_DIAGNOSE_ALLOW", ""), "CIDRs and host names diagnose.endpoint may probe, comma-separated; empty refuses all (NODEWARD_DIAGNOSE_ALLOW)")
	fs.StringVar(&c.TrustedProxies, "trusted-proxies", envOr(getenv, "NODEWARD_TRUSTED_PROXIES", ""), "balancers or proxies in front, CIDRs and addresses, comma-separated: their X-Forwarded-For names the client; empty ignores the header (NODEWARD_TRUSTED_PROXIES)")
	fs.StringVar(&c.DebugAddr, "debug-addr", envOr(getenv, "NODEWARD_DEBUG_ADDR", ""), "loopback host:port serving Go profiles under /debug/pprof/; empty is off (NODEWARD_DEBUG_ADDR)")
	c.MasterKey = getenv("NODEWARD_MASTER_KEY")
}

// Validate checks the configuration and fills derived defaults. Each error
// is one clear line.
func (c *Config) Validate() error {
	if len(c.envErrs) > 0 {
		names := make([]string, 0, len(c.envErrs))
		for name := range c.envErrs {
			names = append(names, name)
		}
		sort.Strings(names)
		return c.envErrs[names[0]]
	}
	if c.ShutdownGrace <= 0 {
		return errors.New("shutdown grace must be a positive duration, like 15s")
	}
	if c.Lease != 0 && c.Lease < 3*time.Second {
		return errors.New("lease must be at least 3s")
	}
	if c.LedgerWorkers < 0 || c.LedgerWorkers > 1024 {
		return errors.New("ledger workers must be a whole number from 1 to 1024 (0 is the default, 16)")
	}
	if c.dbMaxConns.raw != "" {
		n, err := strconv.Atoi(strings.TrimSpace(c.dbMaxConns.raw))
		if err != nil || n < 1 || n > maxDBConns {
			return fmt.Errorf("database pool size (NODEWARD_DB_MAX_CONNS, --db-max-conns) %q: want a whole number from 1 to %d", c.dbMaxConns.raw, maxDBConns)
		}
		c.DBMaxConns = n
	}
	if c.dbWriteLanes.raw != "" {
		n, err := strconv.Atoi(strings.TrimSpace(c.dbWriteLanes.raw))
		if err != nil || n < 1 || n > maxWriteLanes {
			return fmt.Errorf("write lanes (NODEWARD_DB_WRITE_LANES, --db-write-lanes) %q: want a whole number from 1 to %d", c.dbWriteLanes.raw, maxWriteLanes)
		}
		c.DBWriteLanes = n
	}
	if c.DBWriteLanes < 0 || c.DBWriteLanes > maxWriteLanes {
		return fmt.Errorf("write lanes %d: want a whole number from 1 to %d", c.DBWriteLanes, maxWriteLanes)
	}
	if c.DBMaxConns < 0 || c.DBMaxConns > maxDBConns {
		return fmt.Errorf("database pool size %d: want a whole number from 1 to %d", c.DBMaxConns, maxDBConns)
	}
	if c.SessionTTL != 0 && c.SessionTTL < time.Minute {
		return errors.New("session TTL must be at least 1m")
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = DefaultReadTimeout
	}
	if c.ReadTimeout < 0 {
		return errors.New("read timeout must be a positive duration, like 10s")
	}
	if _, err := diagnose.ParseAllowlist(c.DiagnoseAllow); err != nil {
		return err
	}
	if _, err := handlers.ParseTrustedProxies(c.TrustedProxies); err != nil {
		return err
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("listen address %q is not host:port", c.Listen)
	}
	if err := checkDebugAddr(c.DebugAddr); err != nil {
		return err
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return errors.New("TLS needs both a certificate file and a key file")
	}
	for _, f := range []string{c.TLSCertFile, c.TLSKeyFile, c.TLSCAFile, c.MasterKeyFile} {
		if f == "" {
			continue
		}
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("cannot read %s: %v", f, errors.Unwrap(err))
		}
	}
	if c.DatabaseURL != "" {
		u, err := url.Parse(c.DatabaseURL)
		if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
			return errors.New("database URL must start with postgres:// (empty selects the embedded SQLite)")
		}
	} else if c.DataDir == "" {
		return errors.New("the embedded database needs a data folder")
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("log level %q: want debug, info, warn or error", c.LogLevel)
	}
	switch c.LogFormat {
	case "json", "text":
	default:
		return fmt.Errorf("log format %q: want json or text", c.LogFormat)
	}
	if c.PublicURL == "" {
		scheme := "http"
		if c.TLSCertFile != "" {
			scheme = "https"
		}
		c.PublicURL = scheme + "://" + c.Listen
	}
	if u, err := url.Parse(c.PublicURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("public URL %q must be an absolute http(s) URL", c.PublicURL)
	}
	c.PublicURL = strings.TrimRight(c.PublicURL, "/")
	if c.ReplicaID == "" {
		host, _ := os.Hostname()
		c.ReplicaID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	return nil
}

// loadKeyRing finds the master key: the environment, then the key file,
// then (embedded database only) a key generated into the data folder.
// generated reports that a new key was written.
func (c *Config) loadKeyRing() (ring *keys.Ring, generated string, err error) {
	switch {
	case c.MasterKey != "":
		ring, err = keys.ParseRing(c.MasterKey)
		if err != nil {
			return nil, "", fmt.Errorf("NODEWARD_MASTER_KEY: %w", err)
		}
	case c.MasterKeyFile != "":
		b, err := os.ReadFile(c.MasterKeyFile)
		if err != nil {
			return nil, "", fmt.Errorf("read master key file: %w", err)
		}
		ring, err = keys.ParseRing(string(b))
		if err != nil {
			return nil, "", fmt.Errorf("master key file %s: %w", c.MasterKeyFile, err)
		}
	case c.DatabaseURL != "":
		return nil, "", errors.New("a master key is required with PostgreSQL: set NODEWARD_MASTER_KEY or NODEWARD_MASTER_KEY_FILE (every replica needs the same key)")
	default:
		path := filepath.Join(c.DataDir, "master.key")
		b, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
				return nil, "", fmt.Errorf("create data folder: %w", err)
			}
			text, err := writeNewKey(path, false)
			if err != nil {
				return nil, "", fmt.Errorf("write master key: %w", err)
			}
			b, generated = []byte(text), path
		} else if err != nil {
			return nil, "", fmt.Errorf("read master key: %w", err)
		}
		ring, err = keys.ParseRing(string(b))
		if err != nil {
			return nil, "", fmt.Errorf("master key %s: %w", path, err)
		}
	}
	if ring.Empty() {
		return nil, "", errors.New("the master key is empty")
	}
	return ring, generated, nil
}

// ErrKeyFileExists refuses to replace a master key file without --force.
var ErrKeyFileExists = errors.New("already exists: a new key there would stop every credential signed with it from verifying " +
	"(--force replaces it; to rotate instead, put a new key on the first line and keep the old ones below)")

// writeNewKey writes a new random master key (32 bytes, hex, one line) to
// path with mode 0600, creating its folder 0700, and answers the text. The
// file appears whole or not at all; an existing one is refused unless
// replace.
func writeNewKey(path string, replace bool) (string, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	if _, err := os.Lstat(path); err == nil && !replace {
		return "", fmt.Errorf("%s %w", path, ErrKeyFileExists)
	}
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return "", err
	}
	text := hex.EncodeToString(k) + "\n"
	f, err := os.CreateTemp(dir, ".master.key-*") // mode 0600
	if err != nil {
		return "", err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	_, werr := io.WriteString(f, text)
	serr := f.Sync()
	if cerr := f.Close(); werr == nil && serr == nil {
		werr = cerr
	}
	if werr != nil || serr != nil {
		return "", errors.Join(werr, serr)
	}
	if replace {
		err = os.Rename(tmp, path)
	} else {
		// A link never replaces: a file that appeared meanwhile is kept.
		err = os.Link(tmp, path)
		if errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("%s %w", path, ErrKeyFileExists)
		}
	}
	if err != nil {
		return "", err
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return text, nil
}
