// Package dbtest opens fresh, migrated databases for tests: SQLite always,
// PostgreSQL when NODEWARD_TEST_DATABASE_URL is set. Every Postgres database
// is a schema of its own (dropped when the test ends), so test packages that
// run in parallel never see each other's rows. Under CI=true a missing
// Postgres URL is a failure, never a silent skip.
package dbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"

	"gorm.io/gorm"

	"github.com/nodeward/nodeward/models"
)

// EnvURL names the variable holding the test Postgres URL.
const EnvURL = "NODEWARD_TEST_DATABASE_URL"

// Dialects returns the dialects this run covers.
func Dialects(t testing.TB) []string {
	if os.Getenv(EnvURL) != "" {
		return []string{models.SQLite, models.Postgres}
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is not set: CI must run the Postgres suite", EnvURL)
	}
	return []string{models.SQLite}
}

// Each runs fn as a subtest on a fresh database of every dialect.
func Each(t *testing.T, fn func(t *testing.T, db *models.DB)) {
	t.Helper()
	for _, d := range Dialects(t) {
		t.Run(d, func(t *testing.T) { fn(t, Open(t, d)) })
	}
}

// Open returns a fresh, migrated database of the dialect, closed when the
// test ends.
func Open(t testing.TB, dialect string) *models.DB {
	t.Helper()
	opts := Options(t, dialect)
	db, err := models.Open(context.Background(), opts)
	if err != nil {
		t.Fatalf("open %s: %v", dialect, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	if err := db.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate %s: %v", dialect, err)
	}
	return db
}

// Options returns models.Options for a fresh, empty database of the dialect
// (not opened, not migrated): a temp data folder for SQLite, a new schema for
// Postgres. Tests that start real server processes pass these on.
func Options(t testing.TB, dialect string) models.Options {
	t.Helper()
	switch dialect {
	case models.SQLite:
		return models.Options{DataDir: t.TempDir()}
	case models.Postgres:
		return models.Options{URL: NewSchema(t)}
	}
	t.Fatalf("unknown dialect %q", dialect)
	return models.Options{}
}

// NewSchema creates an empty schema on the test Postgres, dropped when the
// test ends, and returns a URL whose connections use it.
func NewSchema(t testing.TB) string {
	t.Helper()
	base := os.Getenv(EnvURL)
	if base == "" {
		t.Skipf("PostgreSQL not configured: set %s to run this test", EnvURL)
	}
	admin, err := models.Open(context.Background(), models.Options{URL: base, MaxOpenConns: 2})
	if err != nil {
		t.Fatalf("connect to test postgres: %v", err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "nwtest_" + hex.EncodeToString(b[:])
	if err := admin.Exec("CREATE SCHEMA " + schema).Error; err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		_ = admin.Exec("DROP SCHEMA " + schema + " CASCADE").Error
		_ = admin.Close()
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("parse %s: %v", EnvURL, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// Count returns the number of rows of model matching where, for assertions
// that a refusal wrote nothing.
func Count(t testing.TB, db *gorm.DB, model any, where ...any) int64 {
	t.Helper()
	var n int64
	q := db.Model(model)
	if len(where) > 0 {
		q = q.Where(where[0], where[1:]...)
	}
	if err := q.Count(&n).Error; err != nil {
		t.Fatalf("count: %v", err)
	}
	return n
}
