// Command ledgerplans seeds a million operations into a throwaway schema of
// a PostgreSQL database, explains every statement of the operations
// ledger's listing and hot paths, and writes the plans as markdown; it
// exits non-zero if any plan reads operations or operation_events with a
// sequential scan. `make plans` runs it and writes docs/ledger-plans.md
// (DECISIONS.md §30); the small version runs in CI as the test of
// internal/ledgerplans.
//
//	go run ./cmd/ledgerplans -database-url "$PG_URL" -out docs/ledger-plans.md
//
// It lives apart from the product's binaries (server, agent) because it
// only measures; the work is in internal/ledgerplans, which its CI test
// shares.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/nodeward/nodeward/internal/ledgerplans"
	"github.com/nodeward/nodeward/models"
)

func main() {
	dbURL := flag.String("database-url", os.Getenv("NODEWARD_TEST_DATABASE_URL"), "PostgreSQL URL (a schema of its own is created and dropped)")
	out := flag.String("out", "", "write the markdown report here (default: standard output)")
	ops := flag.Int("operations", 1_000_000, "operations to seed")
	nodes := flag.Int("nodes", 50_000, "distinct nodes targeted")
	open := flag.Int("open", 4_000, "newest operations left pending or running")
	flag.Parse()
	if err := run(*dbURL, *out, ledgerplans.Scale{Operations: *ops, Nodes: *nodes, Open: *open}); err != nil {
		fmt.Fprintln(os.Stderr, "ledgerplans:", err)
		os.Exit(1)
	}
}

func run(dbURL, out string, sc ledgerplans.Scale) error {
	if dbURL == "" {
		return errors.New("-database-url (or NODEWARD_TEST_DATABASE_URL) is required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	admin, err := models.Open(ctx, models.Options{URL: dbURL, MaxOpenConns: 2})
	if err != nil {
		return err
	}
	defer func() { _ = admin.Close() }()
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "ledgerplans_" + hex.EncodeToString(b[:])
	if err := admin.Exec("CREATE SCHEMA " + schema).Error; err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	// Dropped however the run ends, interrupted included.
	defer func() { _ = admin.WithContext(context.Background()).Exec("DROP SCHEMA " + schema + " CASCADE").Error }()
	u, err := url.Parse(dbURL)
	if err != nil {
		return errors.New("database URL does not parse")
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	db, err := models.Open(ctx, models.Options{URL: u.String(), MaxOpenConns: 2})
	if err != nil {
		return err
	}
	defer func() { _ = db.Close() }()
	if err := db.Migrate(ctx); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	fmt.Fprintf(os.Stderr, "ledgerplans: seeding %d operations into schema %s\n", sc.Operations, schema)
	r, err := ledgerplans.Run(ctx, db, sc)
	if err != nil {
		return err
	}
	r.Machine = machine(ctx, db)
	w := os.Stdout
	if out != "" {
		f, err := os.Create(out)
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		w = f
	}
	if err := r.WriteMarkdown(w); err != nil {
		return err
	}
	if bad := r.Failed(); len(bad) > 0 {
		names := make([]string, len(bad))
		for i, p := range bad {
			names[i] = p.Name
		}
		return fmt.Errorf("sequential scan on the ledger's tables in: %s", strings.Join(names, "; "))
	}
	fmt.Fprintf(os.Stderr, "ledgerplans: %d plans, no sequential scan\n", len(r.Plans))
	return nil
}

func machine(ctx context.Context, db *models.DB) ledgerplans.Machine {
	m := ledgerplans.Machine{Date: time.Now(), CPUs: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH, Memory: "unknown"}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				var kb int64
				_, _ = fmt.Sscan(f[1], &kb)
				m.Memory = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
			}
		}
	}
	_ = db.WithContext(ctx).Raw("SELECT version()").Row().Scan(&m.Postgres)
	for _, s := range []string{"shared_buffers", "work_mem", "effective_cache_size", "random_page_cost", "plan_cache_mode"} {
		var v string
		if err := db.WithContext(ctx).Raw("SELECT current_setting(?)", s).Row().Scan(&v); err == nil {
			m.Settings = append(m.Settings, s+" = "+v)
		}
	}
	return m
}
