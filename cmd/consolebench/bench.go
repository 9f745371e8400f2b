package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/server/controlplane"
)

// page is one console address measured.
type page struct {
	Name, Path string
	// cursorOf names a page whose "older" link this page follows (its
	// Path is then filled in after that page is read).
	cursorOf string
	// anonymous pages are asked without the session.
	anonymous bool
}

// timed is one page's measurements.
type timed struct {
	page
	Server, Client []time.Duration
	Bytes          int
	// Scans are the sequential scans the page's one request in the scan
	// pass made, by table, with the rows they read.
	Scans []scan
	// RowsRead is every row and index entry the page's one request read
	// in the scan pass: the measure that does not depend on how busy the
	// machine is, and should not grow with the tables.
	RowsRead int64
	// ReadFrom is RowsRead by table, most first.
	ReadFrom []scan
}

type scan struct {
	Table      string
	Scans      int64
	TuplesRead int64
	// IndexRead is the index entries read, index-only scans included.
	IndexRead int64
}

// timing wraps the control plane's handler and reports how long each
// request spent inside it.
type timing struct {
	next http.Handler
	took chan time.Duration
}

func (t *timing) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	t.next.ServeHTTP(w, r)
	t.took <- time.Since(start)
}

const benchPassword = "consolebench correct horse"

// bench starts the control plane on the seeded schema (its HTTP handler
// only: no background work changes the data while it is measured), signs
// in and measures every page.
func bench(ctx context.Context, o options, db *models.DB, schema, schemaURL string, log *slog.Logger) (*report, error) {
	dir, err := os.MkdirTemp("", "consolebench-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	// A throwaway master key: nothing sealed here outlives the run.
	var key [32]byte
	_, _ = rand.Read(key[:])
	cfg := controlplane.Config{Listen: "127.0.0.1:0", DataDir: dir, DatabaseURL: schemaURL, MasterKey: hex.EncodeToString(key[:]),
		ShutdownGrace: 5 * time.Second, LogLevel: "error", LogFormat: "text"}
	app, err := controlplane.Open(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	defer func() { _ = app.Close() }()
	// A name of its own per run, so a kept schema can be measured again.
	var nb [4]byte
	_, _ = rand.Read(nb[:])
	benchUser := "bench-" + hex.EncodeToString(nb[:])
	if _, err := app.Auth.CreateAdmin(ctx, benchUser, benchPassword); err != nil {
		return nil, fmt.Errorf("create admin: %w", err)
	}
	tm := &timing{next: app.Handler, took: make(chan time.Duration, 1)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: tm, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Close() }()
	base := "http://" + ln.Addr().String()

	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, Timeout: 60 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := client.PostForm(base+"/console/login", url.Values{"username": {benchUser}, "password": {benchPassword}})
	if err != nil {
		return nil, fmt.Errorf("sign in: %w", err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	_ = res.Body.Close()
	<-tm.took
	if res.StatusCode != http.StatusSeeOther {
		return nil, fmt.Errorf("sign in answered %s", res.Status)
	}

	pages, err := pagesFor(ctx, db)
	if err != nil {
		return nil, err
	}
	anonymous := &http.Client{Timeout: 60 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	anon := false
	get := func(path string) (int, string, time.Duration, time.Duration, error) {
		c := client
		if anon {
			c = anonymous
		}
		start := time.Now()
		res, err := c.Get(base + path)
		if err != nil {
			return 0, "", 0, 0, err
		}
		body, err := io.ReadAll(res.Body)
		_ = res.Body.Close()
		client := time.Since(start)
		server := <-tm.took
		return res.StatusCode, string(body), server, client, err
	}
	var out []*timed
	byName := map[string]*timed{}
	for _, p := range pages {
		if p.cursorOf != "" {
			from := byName[p.cursorOf]
			if from == nil || from.Path == "" {
				o.logf("skipping %s: %s has no older page", p.Name, p.cursorOf)
				continue
			}
			next, ok := olderLink(from.body(get))
			if !ok {
				o.logf("skipping %s: %s has no older page", p.Name, p.cursorOf)
				continue
			}
			p.Path = next
		}
		t := &timed{page: p}
		anon = p.anonymous
		for i := 0; i <= o.requests; i++ {
			status, body, server, client, err := get(p.Path)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", p.Path, err)
			}
			if status != http.StatusOK {
				return nil, fmt.Errorf("%s answered %d", p.Path, status)
			}
			if i == 0 {
				t.Bytes = len(body) // the first, untimed: caches warm
				continue
			}
			t.Server, t.Client = append(t.Server, server), append(t.Client, client)
		}
		out = append(out, t)
		byName[p.Name] = t
		o.logf("%-34s median %6.2f ms  p95 %6.2f ms", p.Name, ms(quantile(t.Server, 0.5)), ms(quantile(t.Server, 0.95)))
	}

	// The scan pass: each page once on a connection that closes after use.
	app.DB.SQL().SetMaxIdleConns(0)
	db.SQL().SetMaxIdleConns(0)
	for _, t := range out {
		anon = t.anonymous
		before, err := settledStats(ctx, db, schema)
		if err != nil {
			return nil, err
		}
		if _, _, _, _, err := get(t.Path); err != nil {
			return nil, err
		}
		after, err := settledStats(ctx, db, schema)
		if err != nil {
			return nil, err
		}
		for table, a := range after {
			b := before[table]
			if a.Scans > b.Scans {
				t.Scans = append(t.Scans, scan{Table: table, Scans: a.Scans - b.Scans, TuplesRead: a.TuplesRead - b.TuplesRead})
			}
			if n := a.TuplesRead - b.TuplesRead + a.IndexRead - b.IndexRead; n > 0 {
				t.RowsRead += n
				t.ReadFrom = append(t.ReadFrom, scan{Table: table, TuplesRead: n})
			}
		}
		sort.Slice(t.ReadFrom, func(i, j int) bool { return t.ReadFrom[i].TuplesRead > t.ReadFrom[j].TuplesRead })
		sort.Slice(t.Scans, func(i, j int) bool { return t.Scans[i].TuplesRead > t.Scans[j].TuplesRead })
		o.logf("%-34s read %d rows and index entries (%s)", t.Name, t.RowsRead, t.readFrom())
	}
	return &report{Pages: out, Requests: o.requests}, nil
}

// body reads the page once more (untimed) for its links.
func (t *timed) body(get func(string) (int, string, time.Duration, time.Duration, error)) string {
	_, b, _, _, _ := get(t.Path)
	return b
}

var olderRE = regexp.MustCompile(`href="(/console/[^"]*[?&;]before=[^"]*)"`)

// olderLink is a listing's link to its next (older) page.
func olderLink(body string) (string, bool) {
	m := olderRE.FindStringSubmatch(body)
	if m == nil {
		return "", false
	}
	return html.UnescapeString(m[1]), true
}

// settledStats reads the schema's per-table scan counters once they stop
// changing (a backend publishes its counters as its connection closes).
func settledStats(ctx context.Context, db *models.DB, schema string) (map[string]scan, error) {
	var last map[string]scan
	for i := 0; i < 20; i++ {
		cur := map[string]scan{}
		rows, err := db.WithContext(ctx).Raw(`SELECT t.relname, COALESCE(t.seq_scan, 0), COALESCE(t.seq_tup_read, 0),
				COALESCE((SELECT SUM(i.idx_tup_read) FROM pg_stat_user_indexes i WHERE i.relid = t.relid), 0)
			FROM pg_stat_user_tables t WHERE t.schemaname = ?`, schema).Rows()
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var s scan
			if err := rows.Scan(&s.Table, &s.Scans, &s.TuplesRead, &s.IndexRead); err != nil {
				_ = rows.Close()
				return nil, err
			}
			cur[s.Table] = s
		}
		_ = rows.Close()
		if last != nil && sameStats(last, cur) {
			return cur, nil
		}
		last = cur
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return last, nil
}

func sameStats(a, b map[string]scan) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// pagesFor lists the pages measured, with ids picked from the seeded data:
// the busy node, a fan-out parent, a failed operation, the rarest and the
// commonest kind.
func pagesFor(ctx context.Context, db *models.DB) ([]page, error) {
	var parent, failed, rareKind, commonKind, secretOp string
	row := db.WithContext(ctx).Raw(`SELECT
		(SELECT parent_id FROM operations WHERE parent_id IS NOT NULL ORDER BY seq DESC LIMIT 1),
		(SELECT id FROM operations WHERE state = 'failed' ORDER BY seq DESC LIMIT 1),
		(SELECT kind FROM operations GROUP BY kind ORDER BY COUNT(*), kind LIMIT 1),
		(SELECT kind FROM operations GROUP BY kind ORDER BY COUNT(*) DESC, kind LIMIT 1),
		(SELECT operation_id FROM secret_audit ORDER BY seq DESC LIMIT 1)`).Row()
	if err := row.Scan(&parent, &failed, &rareKind, &commonKind, &secretOp); err != nil {
		return nil, fmt.Errorf("pick pages: %w", err)
	}
	// Cursors halfway down each listing: a keyset page costs the same
	// there as at the top; a page found by skipping rows does not.
	var midCreated time.Time
	var midNode string
	var midOp, midSecret, midAudit int64
	err := db.WithContext(ctx).Raw(`SELECT created_at, id FROM nodes ORDER BY created_at DESC, id DESC
		OFFSET (SELECT COUNT(*) / 2 FROM nodes) LIMIT 1`).Row().Scan(&midCreated, &midNode)
	if err == nil {
		err = db.WithContext(ctx).Raw(`SELECT (SELECT MAX(seq) / 2 FROM operations), (SELECT MAX(seq) / 2 FROM secret_audit),
			(SELECT MAX(id) / 2 FROM admin_audit)`).Row().Scan(&midOp, &midSecret, &midAudit)
	}
	if err != nil {
		return nil, fmt.Errorf("pick cursors: %w", err)
	}
	nodeCursor := base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(midCreated.UnixMicro(), 10) + "|" + midNode))
	q := url.QueryEscape
	return []page{
		{Name: "login form", Path: "/console/login", anonymous: true},
		{Name: "overview", Path: "/console/"},
		{Name: "nodes", Path: "/console/nodes"},
		{Name: "nodes, page 2", cursorOf: "nodes"},
		{Name: "nodes, halfway down", Path: "/console/nodes?before=" + nodeCursor},
		{Name: "nodes: ready", Path: "/console/nodes?state=ready"},
		{Name: "nodes: enrolling", Path: "/console/nodes?state=enrolling"},
		{Name: "nodes: lease about to lapse", Path: "/console/nodes?lease=lapsing"},
		{Name: "node detail (busy node)", Path: "/console/nodes/" + busyNode},
		{Name: "node detail (typical)", Path: "/console/nodes/nod_000040"},
		{Name: "invite form", Path: "/console/nodes/invite"},
		{Name: "operations", Path: "/console/operations"},
		{Name: "operations, page 2", cursorOf: "operations"},
		{Name: "operations, halfway down", Path: "/console/operations?before=" + strconv.FormatInt(midOp, 10)},
		{Name: "operations: failed", Path: "/console/operations?state=failed"},
		{Name: "operations: pending", Path: "/console/operations?state=pending"},
		{Name: "operations: kind (common)", Path: "/console/operations?kind=" + q(commonKind)},
		{Name: "operations: kind (rare)", Path: "/console/operations?kind=" + q(rareKind)},
		{Name: "operations: target node", Path: "/console/operations?target_kind=node&target_id=" + busyNode},
		{Name: "operations: parent", Path: "/console/operations?parent=" + q(parent)},
		{Name: "operations: failed + kind", Path: "/console/operations?state=failed&kind=" + q(commonKind)},
		{Name: "operation detail (fan-out parent)", Path: "/console/operations/" + q(parent)},
		{Name: "operation detail (failed)", Path: "/console/operations/" + q(failed)},
		{Name: "secret audit", Path: "/console/secret-audit"},
		{Name: "secret audit, page 2", cursorOf: "secret audit"},
		{Name: "secret audit, halfway down", Path: "/console/secret-audit?before=" + strconv.FormatInt(midSecret, 10)},
		{Name: "secret audit: denied", Path: "/console/secret-audit?outcome=denied"},
		{Name: "secret audit: reveal", Path: "/console/secret-audit?action=reveal"},
		{Name: "secret audit: operation", Path: "/console/secret-audit?operation_id=" + q(secretOp)},
		{Name: "secret audit: target node", Path: "/console/secret-audit?target_kind=node&target_id=" + busyNode},
		{Name: "package hosts", Path: "/console/package-hosts"},
		{Name: "tokens", Path: "/console/tokens"},
		{Name: "admin audit", Path: "/console/audit"},
		{Name: "admin audit, page 2", cursorOf: "admin audit"},
		{Name: "admin audit, halfway down", Path: "/console/audit?before=" + strconv.FormatInt(midAudit, 10)},
	}, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// quantile is the q-quantile of ds (nearest rank).
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(q*float64(len(s))+0.999999) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(s) {
		i = len(s) - 1
	}
	return s[i]
}

// readFrom names the tables a page read most from.
func (t *timed) readFrom() string {
	var parts []string
	for i, r := range t.ReadFrom {
		if i == 3 {
			parts = append(parts, "…")
			break
		}
		parts = append(parts, fmt.Sprintf("%s %d", r.Table, r.TuplesRead))
	}
	return strings.Join(parts, ", ")
}
