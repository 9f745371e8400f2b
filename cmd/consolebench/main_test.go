package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/models/dbtest"
)

// TestConsoleBenchSmall runs the benchmark at a tiny size: every page
// answers 200 to a signed-in administrator on the seeded data, the report
// names each, and the schema is dropped afterwards. It asserts nothing
// about time.
func TestConsoleBenchSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("seeds a database: not with -short")
	}
	url := os.Getenv(dbtest.EnvURL)
	if url == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set: CI must run the console benchmark's smoke test", dbtest.EnvURL)
		}
		t.Skipf("%s is not set", dbtest.EnvURL)
	}
	out := filepath.Join(t.TempDir(), "timings.md")
	var progress bytes.Buffer
	err := run(context.Background(), options{dbURL: url, out: out, requests: 1, progress: &progress,
		scale: scale{Nodes: 60, Operations: 2_000, Open: 40}})
	require.NoError(t, err, progress.String())
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	report := string(b)
	for _, page := range []string{"overview", "nodes, page 2", "nodes, halfway down", "node detail (busy node)",
		"operations: parent", "operation detail (fan-out parent)", "secret audit: denied", "admin audit, page 2"} {
		require.Contains(t, report, "| "+page+" |", "the report measures %s", page)
	}
	require.Contains(t, report, "A reduced run")
	require.NotContains(t, progress.String(), "skipping", "every paged listing has an older page")

	schema := strings.Fields(strings.SplitN(progress.String(), "into schema ", 2)[1])[0]
	db, err := openAdmin(url)
	require.NoError(t, err)
	defer func() { _ = db.Close() }()
	var n int
	require.NoError(t, db.Raw(`SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?`, schema).Row().Scan(&n))
	require.Zero(t, n, "the schema is dropped")
}
