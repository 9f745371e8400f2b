// Command consolebench measures the console's pages against a large
// fleet: it seeds a throwaway schema of a PostgreSQL database with 50,000
// nodes and a million operations (internal/ledgerplans's seeding, plus
// nodes, commands, audit trails, configuration and the secret audit),
// starts the real control plane's HTTP handler on it, signs in as an
// administrator over real HTTP, requests every console page and its
// filtered and paged variants N times each, and writes the server time
// per page (median, p95, max) as markdown. `make console-bench` runs it at
// full size into docs/console-timings.md (issue 12: every page under
// 50 ms); it is a benchmark, not a test, so nothing fails on a slow page
// unless -max is given.
//
//	go run ./cmd/consolebench -database-url "$PG_URL" -out docs/console-timings.md
//
// Server time is measured inside the process, around the control plane's
// whole handler (routing, session check, every query and rendering the
// page), from the request reaching the handler to the handler returning;
// the client's time on loopback is reported beside it. A second pass asks
// each page once more on connections that close after every use (so
// PostgreSQL publishes their statistics at once) and reports the
// sequential scans and rows they read per page.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nodeward/nodeward/models"
)

func main() {
	var o options
	flag.StringVar(&o.dbURL, "database-url", os.Getenv("NODEWARD_TEST_DATABASE_URL"), "PostgreSQL URL (a schema of its own is created and dropped)")
	flag.StringVar(&o.out, "out", "", "write the markdown report here (default: standard output)")
	flag.IntVar(&o.scale.Nodes, "nodes", 50_000, "nodes to seed")
	flag.IntVar(&o.scale.Operations, "operations", 1_000_000, "operations to seed")
	flag.IntVar(&o.scale.Open, "open", 4_000, "newest operations left pending or running")
	flag.IntVar(&o.requests, "n", 50, "timed requests per page (after one untimed)")
	flag.DurationVar(&o.max, "max", 0, "exit non-zero if any page's p95 server time exceeds this (0: never)")
	flag.BoolVar(&o.verbose, "v", false, "log the control plane's warnings")
	flag.StringVar(&o.reuse, "reuse", "", "measure a schema kept by an earlier -keep run instead of seeding one (it is kept)")
	flag.BoolVar(&o.keep, "keep", false, "keep the seeded schema afterwards (to EXPLAIN a slow page's queries); drop it by hand")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "consolebench:", err)
		os.Exit(1)
	}
}

type options struct {
	dbURL    string
	out      string
	scale    scale
	requests int
	max      time.Duration
	verbose  bool
	keep     bool
	reuse    string
	// progress is where steps are narrated (default standard error).
	progress io.Writer
}

func (o options) logf(format string, args ...any) {
	w := o.progress
	if w == nil {
		w = os.Stderr
	}
	fmt.Fprintf(w, "consolebench: "+format+"\n", args...)
}

func run(ctx context.Context, o options) error {
	if o.dbURL == "" {
		return errors.New("-database-url (or NODEWARD_TEST_DATABASE_URL) is required")
	}
	if o.scale.Nodes < 2 || o.scale.Operations < 2000 {
		return errors.New("at least 2 nodes and 2,000 operations (the seeded fan-out parents are every 1,000th)")
	}
	if o.requests < 1 {
		return errors.New("-n is at least 1")
	}
	admin, err := openAdmin(o.dbURL)
	if err != nil {
		return err
	}
	defer func() { _ = admin.Close() }()
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "consolebench_" + hex.EncodeToString(b[:])
	if o.reuse != "" {
		schema, o.keep = o.reuse, true
	} else if err := admin.Exec("CREATE SCHEMA " + schema).Error; err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	// Dropped however the run ends, interrupted included.
	defer func() {
		if o.keep {
			o.logf("kept schema %s: DROP SCHEMA %s CASCADE when done", schema, schema)
			return
		}
		_ = admin.WithContext(context.Background()).Exec("DROP SCHEMA " + schema + " CASCADE").Error
	}()
	u, err := url.Parse(o.dbURL)
	if err != nil {
		return errors.New("database URL does not parse")
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	schemaURL := u.String()

	db, err := models.Open(ctx, models.Options{URL: schemaURL, MaxOpenConns: 2})
	if err != nil {
		return err
	}
	defer func() { _ = db.Close() }()
	if err := db.Migrate(ctx); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if o.reuse == "" {
		o.logf("seeding %d nodes and %d operations into schema %s", o.scale.Nodes, o.scale.Operations, schema)
		start := time.Now()
		if err := seed(ctx, db, o.scale); err != nil {
			return err
		}
		// The counter's log of 50,000 inserts folded, as the fleet's
		// background work keeps it.
		if err := models.NewFleetStore(db, "consolebench", nil).FoldNodeCounts(ctx); err != nil {
			return fmt.Errorf("fold node counts: %w", err)
		}
		o.logf("seeded in %s", time.Since(start).Round(time.Second))
	} else if err := db.WithContext(ctx).Raw("SELECT COUNT(*) FROM nodes").Row().Scan(&o.scale.Nodes); err != nil {
		return fmt.Errorf("reuse %s: %w", schema, err)
	} else {
		_ = db.WithContext(ctx).Raw("SELECT COUNT(*) FROM operations").Row().Scan(&o.scale.Operations)
		_ = db.WithContext(ctx).Raw("SELECT COUNT(*) FROM operations WHERE terminal = FALSE").Row().Scan(&o.scale.Open)
	}

	level := slog.LevelError
	if o.verbose {
		level = slog.LevelWarn
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	rep, err := bench(ctx, o, db, schema, schemaURL, log)
	if err != nil {
		return err
	}
	rep.Machine = machine(ctx, db)
	rep.Scale = o.scale
	rep.Counts = tableCounts(ctx, db)
	w := os.Stdout
	if o.out != "" {
		f, err := os.Create(o.out)
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		w = f
	}
	if err := rep.writeMarkdown(w); err != nil {
		return err
	}
	if o.max > 0 {
		if slow := rep.slowerThan(o.max); len(slow) > 0 {
			return fmt.Errorf("p95 server time over %s: %v", o.max, slow)
		}
	}
	return nil
}

// openAdmin opens the database itself (not the run's schema), where the
// schema is created and dropped.
func openAdmin(dbURL string) (*models.DB, error) {
	return models.Open(context.Background(), models.Options{URL: dbURL, MaxOpenConns: 2})
}
