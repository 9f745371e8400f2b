package controlplane_test

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/migrations"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
	"github.com/nodeward/nodeward/server/controlplane"
)

type run struct {
	code           int
	stdout, stderr string
}

// mainRun runs the binary's Main in-process. A command that should fail
// fast but serves instead fails the test rather than hanging it.
func mainRun(t *testing.T, stdin string, args ...string) run {
	t.Helper()
	var out, errb bytes.Buffer
	done := make(chan int, 1)
	go func() { done <- controlplane.Main(args, strings.NewReader(stdin), &out, &errb) }()
	select {
	case code := <-done:
		return run{code: code, stdout: out.String(), stderr: errb.String()}
	case <-time.After(2 * time.Minute):
		t.Fatalf("nodeward %v did not return", args)
		return run{}
	}
}

// cleanEnv keeps the developer's NODEWARD_* settings out of the CLI.
func cleanEnv(t *testing.T) {
	for _, k := range []string{
		"NODEWARD_LISTEN", "NODEWARD_DATA_DIR", "NODEWARD_DATABASE_URL", "NODEWARD_PUBLIC_URL",
		"NODEWARD_MASTER_KEY", "NODEWARD_MASTER_KEY_FILE", "NODEWARD_LOG_LEVEL", "NODEWARD_LOG_FORMAT",
		"NODEWARD_TLS_CERT_FILE", "NODEWARD_TLS_KEY_FILE", "NODEWARD_TLS_CA_FILE", "NODEWARD_SHUTDOWN_GRACE",
		"NODEWARD_READ_TIMEOUT", "NODEWARD_DIAGNOSE_ALLOW", "NODEWARD_DB_MAX_CONNS", "NODEWARD_DEBUG_ADDR", "NODEWARD_DB_WRITE_LANES",
		"NODEWARD_TRUSTED_PROXIES",
		"NODEWARD_LEASE", "NODEWARD_SESSION_TTL", "NODEWARD_LEDGER_WORKERS",
	} {
		t.Setenv(k, "")
	}
}

func oneLine(t *testing.T, s string) string {
	t.Helper()
	s = strings.TrimSuffix(s, "\n")
	require.NotEmpty(t, s)
	require.NotContains(t, s, "\n", "want exactly one line, got:\n%s", s)
	return s
}

func TestCLIAdminAndTokenCreate(t *testing.T) {
	cleanEnv(t)
	dir := t.TempDir()

	r := mainRun(t, "a-long-enough-password\n", "admin", "create", "--username", "ops", "--password-stdin", "--data-dir", dir)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	require.Equal(t, "created administrator ops\n", r.stdout)

	r = mainRun(t, "", "token", "create", "--name", "ci", "--data-dir", dir)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	token := oneLine(t, r.stdout)
	require.True(t, strings.HasPrefix(token, "nwa_"), "stdout carries the token and nothing else: %q", r.stdout)
	require.NotContains(t, r.stderr, token, "the token goes to stdout only")

	// With no server holding the folder the commands opened the database
	// themselves; the server opens it only now.
	s := apitest.Start(t, apitest.WithConfig(func(c *controlplane.Config) { c.DataDir = dir }))
	var who struct {
		Username string `json:"username"`
		Via      string `json:"via"`
	}
	s.JSON(t, http.MethodGet, "/api/v1/whoami", nil, token, http.StatusOK, &who)
	require.Equal(t, "ops", who.Username)
	require.Equal(t, "token", who.Via)

	var audit struct {
		Entries []struct {
			Actor, Action, RemoteAddr string
		} `json:"entries"`
	}
	s.Admin(t, http.MethodGet, "/api/v1/admin-audit", nil, http.StatusOK, &audit)
	var actions []string
	for _, e := range audit.Entries {
		actions = append(actions, e.Action)
	}
	require.Contains(t, actions, "token.create")
	require.Contains(t, actions, "admin.create")

	t.Run("ThroughTheRunningServer", func(t *testing.T) {
		// SQLite locks the folder; the commands go through the server's
		// socket, which only this user may open.
		fi, err := os.Stat(controlplane.SocketPath(dir))
		require.NoError(t, err)
		require.Equal(t, os.ModeSocket, fi.Mode().Type())
		require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

		r := mainRun(t, "another-long-password\n", "admin", "create", "--username", "ops2", "--password-stdin", "--data-dir", dir)
		require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
		require.Equal(t, "created administrator ops2\n", r.stdout)

		r = mainRun(t, "", "token", "create", "--name", "second", "--username", "ops2", "--data-dir", dir)
		require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
		second := oneLine(t, r.stdout)
		require.Empty(t, r.stderr, "an owner named is not announced")
		s.JSON(t, http.MethodGet, "/api/v1/whoami", nil, second, http.StatusOK, &who)
		require.Equal(t, "ops2", who.Username, "the token works over TCP")

		r = mainRun(t, "", "token", "create", "--name", "third", "--data-dir", dir)
		require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
		third := oneLine(t, r.stdout)
		require.Contains(t, oneLine(t, r.stderr), "administrator ops,", "says whose token it is")
		s.JSON(t, http.MethodGet, "/api/v1/whoami", nil, third, http.StatusOK, &who)
		require.Equal(t, "ops", who.Username)

		// Refusals come back with the domain's words.
		r = mainRun(t, "another-long-password\n", "admin", "create", "--username", "ops2", "--password-stdin", "--data-dir", dir)
		require.Equal(t, 1, r.code)
		require.Empty(t, r.stdout)
		require.Contains(t, oneLine(t, r.stderr), "username exists")
		r = mainRun(t, "short\n", "admin", "create", "--username", "ops3", "--password-stdin", "--data-dir", dir)
		require.Equal(t, 1, r.code)
		require.Contains(t, oneLine(t, r.stderr), "password: at least")
		r = mainRun(t, "", "token", "create", "--name", "x", "--username", "nobody", "--data-dir", dir)
		require.Equal(t, 1, r.code)
		require.Contains(t, oneLine(t, r.stderr), `no administrator named "nobody"`)
	})

	t.Run("DeepDataFolder", func(t *testing.T) {
		// A socket path longer than a socket address holds (108 bytes):
		// the server still serves it and the commands still reach it.
		deep := filepath.Join(t.TempDir(), strings.Repeat("deep-folder-", 12))
		require.Greater(t, len(controlplane.SocketPath(deep)), 108)
		r := mainRun(t, "a-long-enough-password\n", "admin", "create", "--username", "ops", "--password-stdin", "--data-dir", deep)
		require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
		apitest.Start(t, apitest.WithConfig(func(c *controlplane.Config) { c.DataDir = deep }))
		fi, err := os.Stat(controlplane.SocketPath(deep))
		require.NoError(t, err)
		require.Equal(t, os.ModeSocket, fi.Mode().Type())
		r = mainRun(t, "", "token", "create", "--name", "deep", "--data-dir", deep)
		require.Equal(t, 0, r.code, "through the running server's socket; stderr: %s", r.stderr)
		require.True(t, strings.HasPrefix(oneLine(t, r.stdout), "nwa_"))
	})

	t.Run("UnknownOwner", func(t *testing.T) {
		other := t.TempDir()
		r := mainRun(t, "", "token", "create", "--name", "ci", "--data-dir", other)
		require.NotEqual(t, 0, r.code)
		require.Empty(t, r.stdout)
		require.Contains(t, lastLine(r.stderr), "admin create", "says how to get an administrator")
	})

	t.Run("ShortPassword", func(t *testing.T) {
		other := t.TempDir()
		r := mainRun(t, "short\n", "admin", "create", "--username", "ops", "--password-stdin", "--data-dir", other)
		require.NotEqual(t, 0, r.code)
		require.Contains(t, lastLine(r.stderr), "password")
	})
}

// lastLine is the error line after whatever the server logged first (a
// generated master key is announced on stderr).
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func TestCLIMigrate(t *testing.T) {
	cleanEnv(t)
	t.Run("sqlite", func(t *testing.T) {
		dir := t.TempDir()
		for range 2 { // applying again is a no-op
			r := mainRun(t, "", "migrate", "--data-dir", dir)
			require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
			require.Equal(t, "migrations applied\n", r.stdout)
		}
		db, err := models.Open(context.Background(), models.Options{DataDir: dir})
		require.NoError(t, err)
		defer db.Close()
		ok, err := db.MigrationsCurrent(context.Background())
		require.NoError(t, err)
		require.True(t, ok)
	})
	t.Run("postgres", func(t *testing.T) {
		url := dbtest.NewSchema(t)
		t.Setenv("NODEWARD_MASTER_KEY", apitest.TestMasterKey)
		r := mainRun(t, "", "migrate", "--database-url", url)
		require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
		require.Equal(t, "migrations applied\n", r.stdout)
		db, err := models.Open(context.Background(), models.Options{URL: url})
		require.NoError(t, err)
		defer db.Close()
		ok, err := db.MigrationsCurrent(context.Background())
		require.NoError(t, err)
		require.True(t, ok)
	})
}

// TestCLIRefusesADatabaseANewerReleaseMigrated: a build whose migrations
// stop short of the database's neither migrates nor serves it (rows may
// mean what it cannot read); it says why and exits non-zero.
func TestCLIRefusesADatabaseANewerReleaseMigrated(t *testing.T) {
	cleanEnv(t)
	dir := t.TempDir()
	r := mainRun(t, "", "migrate", "--data-dir", dir)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	db, err := models.Open(context.Background(), models.Options{DataDir: dir})
	require.NoError(t, err)
	require.NoError(t, db.Exec(`INSERT INTO goose_db_version (version_id, is_applied) VALUES (99999, TRUE)`).Error)
	ok, err := db.MigrationsCurrent(context.Background())
	require.ErrorIs(t, err, migrations.ErrAhead)
	require.False(t, ok)
	require.NoError(t, db.Close())
	for _, args := range [][]string{{"migrate", "--data-dir", dir}, {"serve", "--data-dir", dir, "--listen", "127.0.0.1:0"}} {
		r = mainRun(t, "", args...)
		require.NotEqual(t, 0, r.code, args[0])
		require.Contains(t, r.stderr, "migrated by a newer release", args[0])
		require.Contains(t, r.stderr, "99999", args[0])
	}
}

func TestCLIVersion(t *testing.T) {
	r := mainRun(t, "", "version")
	require.Equal(t, 0, r.code)
	require.True(t, strings.HasPrefix(oneLine(t, r.stdout), "nodeward "), r.stdout)
	require.Empty(t, r.stderr)
}

func TestCLIBadConfigurationFailsFast(t *testing.T) {
	cleanEnv(t)
	dir := t.TempDir()
	// A migrated folder with its key, so a command that gets as far as
	// opening it has nothing to announce but its error.
	require.Equal(t, 0, mainRun(t, "", "migrate", "--data-dir", dir).code)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	notPEM := filepath.Join(t.TempDir(), "garbage.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600))

	cases := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"LogLevel", nil, []string{"serve", "--log-level", "nope", "--data-dir", dir}, "log level"},
		{"LogFormat", nil, []string{"serve", "--log-format", "xml", "--data-dir", dir}, "log format"},
		{"ListenNotHostPort", nil, []string{"serve", "--listen", "nope", "--data-dir", dir}, "listen address"},
		{"ListenBusy", nil, []string{"serve", "--listen", busy.Addr().String(), "--data-dir", dir}, "listen on"},
		{"ShutdownGrace", nil, []string{"serve", "--shutdown-grace", "0s", "--data-dir", dir}, "shutdown grace"},
		{"ReadTimeout", nil, []string{"serve", "--read-timeout", "-1s", "--data-dir", dir}, "read timeout"},
		{"LeaseWithoutUnit", map[string]string{"NODEWARD_LEASE": "300"}, []string{"serve", "--data-dir", dir}, "NODEWARD_LEASE"},
		{"SessionTTLNotADuration", map[string]string{"NODEWARD_SESSION_TTL": "abc"}, []string{"serve", "--data-dir", dir}, "NODEWARD_SESSION_TTL"},
		{"DBMaxConnsZero", map[string]string{"NODEWARD_DB_MAX_CONNS": "0"}, []string{"serve", "--data-dir", dir}, "NODEWARD_DB_MAX_CONNS"},
		{"DBMaxConnsNotANumber", nil, []string{"serve", "--db-max-conns", "lots", "--data-dir", dir}, "whole number"},
		{"DatabaseScheme", nil, []string{"serve", "--database-url", "mysql://db/x"}, "postgres://"},
		{"PostgresWithoutMasterKey", nil, []string{"serve", "--database-url", "postgres://nobody:hunter2@127.0.0.1:1/x"}, "master key"},
		{"MasterKeyTooShort", map[string]string{"NODEWARD_MASTER_KEY": "abc"}, []string{"serve", "--database-url", "postgres://nobody:hunter2@127.0.0.1:1/x"}, "too short"},
		{"TLSHalf", nil, []string{"serve", "--tls-cert", "/nonexistent/cert.pem", "--data-dir", dir}, "TLS"},
		{"TLSMissingFiles", nil, []string{"serve", "--tls-cert", "/nonexistent/cert.pem", "--tls-key", "/nonexistent/key.pem", "--data-dir", dir}, "cannot read"},
		{"TLSNotACertificate", nil, []string{"serve", "--tls-cert", notPEM, "--tls-key", notPEM, "--data-dir", dir}, "load TLS certificate"},
		{"PublicURL", nil, []string{"serve", "--public-url", "ftp://x", "--data-dir", dir}, "public URL"},
		{"DiagnoseAllow", nil, []string{"serve", "--diagnose-allow", "10.0.0.0/8, not a host!", "--data-dir", dir}, "diagnose allowlist"},
		{"DiagnoseAllowEnv", map[string]string{"NODEWARD_DIAGNOSE_ALLOW": "300.1.1.1/8"}, []string{"serve", "--data-dir", dir}, "diagnose allowlist"},
		{"TrustedProxies", nil, []string{"serve", "--trusted-proxies", "10.0.0.0/8, lb.internal", "--data-dir", dir}, "NODEWARD_TRUSTED_PROXIES"},
		{"TrustedProxiesEnv", map[string]string{"NODEWARD_TRUSTED_PROXIES": "10.0.0.0/40"}, []string{"serve", "--data-dir", dir}, "NODEWARD_TRUSTED_PROXIES"},
		{"DebugAddrEveryInterface", nil, []string{"serve", "--debug-addr", ":6060", "--data-dir", dir}, "NODEWARD_DEBUG_ADDR"},
		{"DebugAddrNotHostPort", map[string]string{"NODEWARD_DEBUG_ADDR": "6060"}, []string{"serve", "--data-dir", dir}, "NODEWARD_DEBUG_ADDR"},
		{"DebugAddrBusy", nil, []string{"serve", "--listen", "127.0.0.1:0", "--debug-addr", busy.Addr().String(), "--data-dir", dir}, "debug listener (NODEWARD_DEBUG_ADDR, --debug-addr) on"},
		{"MigrateLogLevel", nil, []string{"migrate", "--log-level", "nope", "--data-dir", dir}, "log level"},
		{"TokenWithoutName", nil, []string{"token", "create", "--data-dir", dir}, "--name"},
		{"AdminWithoutStdin", nil, []string{"admin", "create", "--username", "x", "--data-dir", dir}, "--password-stdin"},
		{"UnexpectedArgument", nil, []string{"serve", "extra"}, "unexpected argument"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			r := mainRun(t, "", tc.args...)
			require.NotEqual(t, 0, r.code)
			require.Empty(t, r.stdout)
			line := oneLine(t, r.stderr)
			require.True(t, strings.HasPrefix(line, "nodeward: "), line)
			require.Contains(t, line, tc.want)
			require.NotContains(t, line, "hunter2", "a database password is never echoed")
		})
	}

	t.Run("UnknownCommand", func(t *testing.T) {
		r := mainRun(t, "", "frobnicate")
		require.Equal(t, 2, r.code)
		require.Contains(t, r.stderr, `unknown command "frobnicate"`)
	})
	t.Run("UnknownFlag", func(t *testing.T) {
		r := mainRun(t, "", "serve", "--no-such-flag")
		require.Equal(t, 2, r.code)
		require.Contains(t, r.stderr, "no-such-flag")
	})
}

// A server killed outright leaves its socket file behind: the commands open
// the database themselves, and the next server replaces the socket.
func TestCLIStaleSocket(t *testing.T) {
	cleanEnv(t)
	dir := t.TempDir()
	require.Equal(t, 0, mainRun(t, "", "migrate", "--data-dir", dir).code)
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: controlplane.SocketPath(dir), Net: "unix"})
	require.NoError(t, err)
	stale.SetUnlinkOnClose(false)
	require.NoError(t, stale.Close())
	_, err = os.Stat(controlplane.SocketPath(dir))
	require.NoError(t, err, "the stale socket file is there")

	r := mainRun(t, "a-long-enough-password\n", "admin", "create", "--username", "ops", "--password-stdin", "--data-dir", dir)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	r = mainRun(t, "", "token", "create", "--name", "ci", "--data-dir", dir)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	token := oneLine(t, r.stdout)

	s := apitest.Start(t, apitest.WithConfig(func(c *controlplane.Config) { c.DataDir = dir }))
	r = mainRun(t, "", "token", "create", "--name", "through-the-new-socket", "--data-dir", dir)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	for _, tok := range []string{token, oneLine(t, r.stdout)} {
		var who struct{ Username string }
		s.JSON(t, http.MethodGet, "/api/v1/whoami", nil, tok, http.StatusOK, &who)
		require.Equal(t, "ops", who.Username)
	}
}

// On PostgreSQL the commands reach the database while servers run.
func TestCLIPostgresWhileServing(t *testing.T) {
	cleanEnv(t)
	s := apitest.Start(t, apitest.WithDialect(models.Postgres))
	url := s.App.Config.DatabaseURL
	t.Setenv("NODEWARD_MASTER_KEY", apitest.TestMasterKey)
	r := mainRun(t, "a-long-enough-password\n", "admin", "create", "--username", "ops", "--password-stdin", "--database-url", url)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	r = mainRun(t, "", "token", "create", "--name", "ci", "--username", "ops", "--database-url", url)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	var who struct{ Username string }
	s.JSON(t, http.MethodGet, "/api/v1/whoami", nil, oneLine(t, r.stdout), http.StatusOK, &who)
	require.Equal(t, "ops", who.Username)
}

// TestCLIAdminManagement: from the machine, an operator resets a
// password, disables and enables an administrator and lists them, with the
// server stopped (the database opened directly) and running (through its
// socket); the running server honours each change at once.
func TestCLIAdminManagement(t *testing.T) {
	cleanEnv(t)
	dir := t.TempDir()
	for _, name := range []string{"ops", "dev"} {
		r := mainRun(t, "a-long-enough-password\n", "admin", "create", "--username", name, "--password-stdin", "--data-dir", dir)
		require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	}
	r := mainRun(t, "", "token", "create", "--name", "devs", "--username", "dev", "--data-dir", dir)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	devToken := oneLine(t, r.stdout)

	// Stopped: the commands open the database themselves.
	r = mainRun(t, "", "admin", "disable", "--username", "dev", "--data-dir", dir)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	require.Contains(t, oneLine(t, r.stdout), "administrator dev is disabled")
	r = mainRun(t, "", "admin", "list", "--data-dir", dir)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	require.Regexp(t, `(?m)^dev +\S+ +disabled \S+ +0$`, r.stdout)
	require.Regexp(t, `(?m)^ops +\S+ +enabled +0$`, r.stdout)
	require.Empty(t, r.stderr)

	s := apitest.Start(t, apitest.WithConfig(func(c *controlplane.Config) { c.DataDir = dir }))
	s.Problem(t, http.MethodGet, "/api/v1/whoami", nil, devToken, http.StatusUnauthorized, "unauthenticated")

	// Running: through the socket.
	r = mainRun(t, "", "admin", "enable", "--username", "dev", "--data-dir", dir)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	require.Equal(t, "administrator dev is enabled\n", r.stdout)
	s.JSON(t, http.MethodGet, "/api/v1/whoami", nil, devToken, http.StatusOK, nil)

	r = mainRun(t, "", "admin", "disable", "--username", "dev", "--data-dir", dir)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	s.Problem(t, http.MethodGet, "/api/v1/whoami", nil, devToken, http.StatusUnauthorized, "unauthenticated")

	r = mainRun(t, "a-password-set-by-hand\n", "admin", "password", "--username", "ops", "--password-stdin", "--data-dir", dir)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	require.Contains(t, oneLine(t, r.stdout), "set the password of administrator ops")
	require.NotContains(t, r.stdout+r.stderr, "a-password-set-by-hand")
	require.Empty(t, r.stderr)
	r = mainRun(t, "a-password-set-by-hand\n", "admin", "password", "--username", "dev", "--password-stdin", "--data-dir", dir)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	require.Contains(t, oneLine(t, r.stderr), "dev is disabled and still cannot sign in", "says what else it takes")

	// Refusals, in the domain's words.
	for _, c := range []struct {
		stdin string
		args  []string
		code  int
		says  string
	}{
		{"", []string{"admin", "disable", "--username", "nobody", "--data-dir", dir}, 1, "no such administrator"},
		{"short\n", []string{"admin", "password", "--username", "ops", "--password-stdin", "--data-dir", dir}, 1, "password: at least"},
		{"", []string{"admin", "password", "--username", "ops", "--data-dir", dir}, 2, "--password-stdin"},
		{"", []string{"admin", "disable", "--data-dir", dir}, 2, "needs --username"},
		{"", []string{"token", "create", "--name", "x", "--username", "dev", "--data-dir", dir}, 1, "is disabled"},
		{"", []string{"admin", "remove", "--username", "ops"}, 2, "usage: nodeward admin"},
	} {
		r := mainRun(t, c.stdin, c.args...)
		require.Equal(t, c.code, r.code, "%v: %s", c.args, r.stderr)
		require.Empty(t, r.stdout, "%v", c.args)
		require.Contains(t, oneLine(t, r.stderr), c.says, "%v", c.args)
	}

	// The last enabled administrator stays so (the test server's own is
	// disabled for this, and enabled again).
	r = mainRun(t, "", "admin", "disable", "--username", apitest.AdminUsername, "--data-dir", dir)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	r = mainRun(t, "", "admin", "disable", "--username", "ops", "--data-dir", dir)
	require.Equal(t, 1, r.code)
	require.Contains(t, oneLine(t, r.stderr), "only enabled administrator")
	r = mainRun(t, "", "admin", "enable", "--username", apitest.AdminUsername, "--data-dir", dir)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)

	var audit struct {
		Entries []struct{ Actor, Action, Target, RemoteAddr string } `json:"entries"`
	}
	s.Admin(t, http.MethodGet, "/api/v1/admin-audit", nil, http.StatusOK, &audit)
	var seen []string
	for i := len(audit.Entries) - 1; i >= 0; i-- {
		if e := audit.Entries[i]; e.Actor == "system" && (e.Target == "dev" || e.Target == "ops") && e.Action != "admin.create" {
			seen = append(seen, e.Action+" "+e.Target)
		}
	}
	require.Equal(t, []string{"admin.disable dev", "admin.enable dev", "admin.disable dev", "admin.password_reset ops",
		"admin.password_reset dev"}, seen)

	t.Run("AMistypedFolderIsNotADatabase", func(t *testing.T) {
		typo := filepath.Join(t.TempDir(), "dta")
		for _, args := range [][]string{
			{"admin", "list", "--data-dir", typo},
			{"admin", "disable", "--username", "dev", "--data-dir", typo},
			{"token", "create", "--name", "x", "--data-dir", typo},
		} {
			r := mainRun(t, "", args...)
			require.Equal(t, 1, r.code, "%v", args)
			require.Contains(t, lastLine(r.stderr), "no Nodeward database in "+typo, "%v", args)
			_, err := os.Stat(typo)
			require.ErrorIs(t, err, os.ErrNotExist, "%v left nothing behind", args)
		}
	})
}

func TestCLIHelp(t *testing.T) {
	cleanEnv(t)
	commands := []string{"serve", "migrate", "admin create", "admin password", "admin disable", "admin enable", "admin list",
		"token create", "keygen", "version", "help"}
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		r := mainRun(t, "", args...)
		require.Equal(t, 0, r.code, "%v", args)
		require.Empty(t, r.stderr)
		for _, c := range commands {
			require.Regexp(t, `(?m)^  `+c+`\b.* \S`, r.stdout, "%v lists %q with a line of its own", args, c)
		}
	}

	flags := map[string][]string{
		"serve":          {"-listen", "-data-dir", "-database-url"},
		"migrate":        {"-data-dir", "-database-url"},
		"admin create":   {"-username", "-password-stdin", "-data-dir"},
		"admin password": {"-username", "-password-stdin", "-data-dir"},
		"admin disable":  {"-username", "-data-dir"},
		"admin enable":   {"-username", "-data-dir"},
		"admin list":     {"-data-dir", "-database-url"},
		"token create":   {"-name", "-username", "-data-dir"},
		"keygen":         {"-master-key-file", "-force"},
		"version":        nil,
	}
	for c, want := range flags {
		words := strings.Fields(c)
		argsets := [][]string{append(words, "--help")}
		// "help admin" and "admin -h" show the group's first command.
		if len(words) == 1 || words[1] == "create" {
			argsets = append(argsets, []string{"help", words[0]})
		}
		if len(words) > 1 && words[1] == "create" {
			argsets = append(argsets, []string{words[0], "-h"})
		}
		for _, args := range argsets {
			r := mainRun(t, "", args...)
			require.Equal(t, 0, r.code, "%v: %s", args, r.stderr)
			require.Empty(t, r.stderr, "%v", args)
			require.True(t, strings.HasPrefix(r.stdout, "usage: nodeward "+c), "%v:\n%s", args, r.stdout)
			for _, f := range want {
				require.Regexp(t, `(?m)^  `+f+`( |$)`, r.stdout, "%v shows %s", args, f)
			}
		}
	}
}

func TestCLIKeygen(t *testing.T) {
	cleanEnv(t)
	path := filepath.Join(t.TempDir(), "etc", "master.key")
	r := mainRun(t, "", "keygen", "--master-key-file", path)
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	require.Contains(t, oneLine(t, r.stdout), path)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	first, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Regexp(t, `^[0-9a-f]{64}\n$`, string(first))

	// The key serves: PostgreSQL needs one, so the server is started on it.
	if os.Getenv(dbtest.EnvURL) != "" {
		s := apitest.Start(t, apitest.WithDialect(models.Postgres), apitest.WithConfig(func(c *controlplane.Config) {
			c.MasterKey, c.MasterKeyFile = "", path
		}))
		s.JSON(t, http.MethodGet, "/api/v1/whoami", nil, s.AdminToken, http.StatusOK, nil)
	}

	t.Run("RefusesToOverwrite", func(t *testing.T) {
		r := mainRun(t, "", "keygen", "--master-key-file", path)
		require.Equal(t, 1, r.code)
		require.Empty(t, r.stdout)
		require.Contains(t, oneLine(t, r.stderr), "already exists")
		got, err := os.ReadFile(path)
		require.NoError(t, err)
		require.Equal(t, first, got, "the key is kept")
	})
	t.Run("Force", func(t *testing.T) {
		r := mainRun(t, "", "keygen", "--force", "--master-key-file", path)
		require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
		got, err := os.ReadFile(path)
		require.NoError(t, err)
		require.Regexp(t, `^[0-9a-f]{64}\n$`, string(got))
		require.NotEqual(t, first, got)
		fi, err := os.Stat(path)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	})
	t.Run("FromTheEnvironment", func(t *testing.T) {
		other := filepath.Join(t.TempDir(), "k")
		t.Setenv("NODEWARD_MASTER_KEY_FILE", other)
		require.Equal(t, 0, mainRun(t, "", "keygen").code)
		_, err := os.Stat(other)
		require.NoError(t, err)
	})
	t.Run("NoPath", func(t *testing.T) {
		r := mainRun(t, "", "keygen")
		require.Equal(t, 2, r.code)
		require.Contains(t, oneLine(t, r.stderr), "--master-key-file")
	})
}
