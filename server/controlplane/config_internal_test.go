package controlplane

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// parseServe parses the serve command's flags with only the environment
// variable key set (to env), and validates the result.
func parseServe(t *testing.T, key, env string, args ...string) (Config, error) {
	t.Helper()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var c Config
	bindFlags(fs, &c, func(k string) string {
		if k == key {
			return env
		}
		return ""
	})
	c.DataDir = t.TempDir()
	require.NoError(t, fs.Parse(args))
	return c, c.Validate()
}

// TestDBMaxConns: the pool size comes from NODEWARD_DB_MAX_CONNS or
// --db-max-conns (the flag wins), reaches the pool, and anything but a
// whole number from 1 up is refused at start with a line naming it.
func TestDBMaxConns(t *testing.T) {
	parse := func(env string, args ...string) (Config, error) {
		return parseServe(t, "NODEWARD_DB_MAX_CONNS", env, args...)
	}
	for _, tc := range []struct {
		env  string
		args []string
		want int
	}{
		{"", nil, 0}, // the dialect's default
		{"5", nil, 5},
		{" 12 ", nil, 12},
		{"5", []string{"--db-max-conns", "7"}, 7},
		{"", []string{"--db-max-conns", "100"}, 100},
	} {
		c, err := parse(tc.env, tc.args...)
		require.NoError(t, err, "%q %v", tc.env, tc.args)
		require.Equal(t, tc.want, c.DBMaxConns, "%q %v", tc.env, tc.args)
	}
	for _, tc := range []struct {
		env  string
		args []string
	}{
		{"0", nil}, {"-3", nil}, {"ten", nil}, {"1.5", nil}, {"32k", nil}, {"100000", nil},
		{"", []string{"--db-max-conns", "0"}},
		{"", []string{"--db-max-conns", "many"}},
		{"8", []string{"--db-max-conns", "-1"}},
	} {
		_, err := parse(tc.env, tc.args...)
		require.Error(t, err, "%q %v", tc.env, tc.args)
		require.Contains(t, err.Error(), "NODEWARD_DB_MAX_CONNS")
		require.Contains(t, err.Error(), "whole number from 1")
	}

	pool := func(c Config) int {
		app, err := Open(context.Background(), c, slog.New(slog.DiscardHandler))
		require.NoError(t, err)
		defer app.Close()
		sqlDB, err := app.DB.DB.DB()
		require.NoError(t, err)
		return sqlDB.Stats().MaxOpenConnections
	}
	c, err := parse("3")
	require.NoError(t, err)
	require.Equal(t, 3, pool(c))
	c, err = parse("")
	require.NoError(t, err)
	require.Equal(t, 8, pool(c), "SQLite's default")
}

// TestDBWriteLanes: the write lanes come from NODEWARD_DB_WRITE_LANES or
// --db-write-lanes (the flag wins); anything but a whole number from 1 to
// 64 is refused at start with a line naming it.
func TestDBWriteLanes(t *testing.T) {
	parse := func(env string, args ...string) (Config, error) {
		return parseServe(t, "NODEWARD_DB_WRITE_LANES", env, args...)
	}
	for _, tc := range []struct {
		env  string
		args []string
		want int
	}{
		{"", nil, 0}, // a quarter of the pool, at most 4
		{"1", nil, 1},
		{" 6 ", nil, 6},
		{"2", []string{"--db-write-lanes", "3"}, 3},
	} {
		c, err := parse(tc.env, tc.args...)
		require.NoError(t, err, "%q %v", tc.env, tc.args)
		require.Equal(t, tc.want, c.DBWriteLanes, "%q %v", tc.env, tc.args)
	}
	for _, tc := range []struct {
		env  string
		args []string
	}{
		{"0", nil}, {"-1", nil}, {"four", nil}, {"65", nil},
		{"", []string{"--db-write-lanes", "0"}},
	} {
		_, err := parse(tc.env, tc.args...)
		require.Error(t, err, "%q %v", tc.env, tc.args)
		require.Contains(t, err.Error(), "NODEWARD_DB_WRITE_LANES")
		require.Contains(t, err.Error(), "whole number from 1")
	}
}

// TestDurationSettings: a duration from the environment that does not
// parse (a bare number, a word) stops the server with a line naming the
// variable, rather than starting on the default; the flag, which wins,
// replaces it.
func TestDurationSettings(t *testing.T) {
	settings := []struct {
		env, flag string
		field     func(Config) time.Duration
	}{
		{"NODEWARD_LEASE", "--lease", func(c Config) time.Duration { return c.Lease }},
		{"NODEWARD_SESSION_TTL", "--session-ttl", func(c Config) time.Duration { return c.SessionTTL }},
		{"NODEWARD_READ_TIMEOUT", "--read-timeout", func(c Config) time.Duration { return c.ReadTimeout }},
		{"NODEWARD_SHUTDOWN_GRACE", "--shutdown-grace", func(c Config) time.Duration { return c.ShutdownGrace }},
	}
	for _, s := range settings {
		t.Run(s.env, func(t *testing.T) {
			c, err := parseServe(t, s.env, " 2h ")
			require.NoError(t, err)
			require.Equal(t, 2*time.Hour, s.field(c))

			for _, bad := range []string{"300", "abc", "5 minutes"} {
				_, err := parseServe(t, s.env, bad)
				require.Error(t, err, bad)
				require.Contains(t, err.Error(), s.env)
				require.Contains(t, err.Error(), bad)
			}
			c, err = parseServe(t, s.env, "300", s.flag, "3h")
			require.NoError(t, err, "the flag replaces a bad environment value")
			require.Equal(t, 3*time.Hour, s.field(c))

			fs := flag.NewFlagSet("serve", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			var cfg Config
			bindFlags(fs, &cfg, func(string) string { return "" })
			require.Error(t, fs.Parse([]string{s.flag, "300"}), "a flag without a unit is refused too")
		})
	}
	c, err := parseServe(t, "", "")
	require.NoError(t, err)
	require.Equal(t, 90*time.Second, c.Lease)
	require.Equal(t, 30*time.Minute, c.SessionTTL)
}
