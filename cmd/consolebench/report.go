package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/nodeward/nodeward/models"
)

type machineInfo struct {
	Date     time.Time
	CPUs     int
	OS       string
	Memory   string
	Postgres string
	Settings []string
}

type report struct {
	Pages    []*timed
	Requests int
	Scale    scale
	Counts   []string
	Machine  machineInfo
}

// slowerThan names the pages whose p95 server time exceeds max.
func (r *report) slowerThan(max time.Duration) []string {
	var out []string
	for _, p := range r.Pages {
		if quantile(p.Server, 0.95) > max {
			out = append(out, p.Name)
		}
	}
	return out
}

func (r *report) writeMarkdown(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Console page timings\n\n")
	fmt.Fprintf(&b, "Written by `make console-bench` (cmd/consolebench). Issue 12: every console page answers in under 50 ms of server time with 50,000 nodes and a million operations in the database.\n\n")
	if r.Scale.Nodes < 50_000 || r.Scale.Operations < 1_000_000 {
		fmt.Fprintf(&b, "**A reduced run**, below the issue's sizes: the times here are not the issue's measure; `make console-bench` is.\n\n")
	}
	fmt.Fprintf(&b, "Seeded: %d nodes, %d operations (%d left open). Rows: %s.\n\n", r.Scale.Nodes, r.Scale.Operations, r.Scale.Open, strings.Join(r.Counts, ", "))
	fmt.Fprintf(&b, "**Server time** is measured inside the process around the control plane's whole HTTP handler (routing, session check, every query, rendering) — the handler's own time, without the network. "+
		"**Client** is the same request's time seen by the Go client on loopback. Each page is requested once untimed, then %d times in a row by one signed-in client; "+
		"times are in milliseconds (p95 by nearest rank).\n\n", r.Requests)
	b.WriteString("| page | address | server median | server p95 | server max | client median | KiB | rows read | read most from | sequential scans (rows) |\n")
	b.WriteString("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |\n")
	for _, p := range r.Pages {
		var scans []string
		for _, s := range p.Scans {
			scans = append(scans, fmt.Sprintf("%s ×%d (%d)", s.Table, s.Scans, s.TuplesRead))
		}
		sc := "none"
		if len(scans) > 0 {
			sc = strings.Join(scans, ", ")
		}
		fmt.Fprintf(&b, "| %s | `%s` | %.2f | %.2f | %.2f | %.2f | %.0f | %d | %s | %s |\n", p.Name, clip(p.Path, 70),
			ms(quantile(p.Server, 0.5)), ms(quantile(p.Server, 0.95)), ms(quantile(p.Server, 1)),
			ms(quantile(p.Client, 0.5)), float64(p.Bytes)/1024, p.RowsRead, p.readFrom(), sc)
	}
	b.WriteString("\n**Rows read** and **sequential scans** are counted in a second pass, one request per page on connections that close after use (so PostgreSQL publishes their statistics at once), from `pg_stat_user_tables` and `pg_stat_user_indexes` of the run's schema: every heap row read by a sequential scan plus every index entry read (index-only scans included). Unlike the times, they do not depend on how busy the machine is, and on a page that is keyset-paged and counts from indexes or counters they stay the same as the tables grow. A sequential scan of a table of a few rows (package hosts, API tokens, the folded node counter) is expected; one of nodes, operations, operation_events, commands, node_audit or secret_audit is a page to fix.\n")
	m := r.Machine
	fmt.Fprintf(&b, "\n## Machine\n\n- date: %s\n- CPUs: %d, memory: %s, %s\n- %s\n", m.Date.UTC().Format(time.RFC3339), m.CPUs, m.Memory, m.OS, m.Postgres)
	for _, s := range m.Settings {
		fmt.Fprintf(&b, "- %s\n", s)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// tableCounts are the big tables' sizes, as seeded.
func tableCounts(ctx context.Context, db *models.DB) []string {
	var out []string
	for _, t := range []string{"nodes", "operations", "operation_events", "commands", "node_audit", "node_configs", "secret_audit", "admin_audit"} {
		var n int64
		if err := db.WithContext(ctx).Raw("SELECT COUNT(*) FROM " + t).Row().Scan(&n); err == nil {
			out = append(out, fmt.Sprintf("%s %d", t, n))
		}
	}
	return out
}

func machine(ctx context.Context, db *models.DB) machineInfo {
	m := machineInfo{Date: time.Now(), CPUs: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH, Memory: "unknown"}
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
	for _, s := range []string{"shared_buffers", "work_mem", "effective_cache_size", "random_page_cost"} {
		var v string
		if err := db.WithContext(ctx).Raw("SELECT current_setting(?)", s).Row().Scan(&v); err == nil {
			m.Settings = append(m.Settings, s+" = "+v)
		}
	}
	return m
}
