package handlers_test

// What one idle poll costs the server in allocations (issue 13, memory per
// held poll): an agent whose poll finds nothing due re-polls every wait,
// and every byte a cycle allocates is garbage the collector's headroom has
// to hold while the fleet waits. Counted with the runtime's allocation
// counters over whole polls on one keep-alive connection — counters, not
// timings.

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/models/dbtest"
)

// rawPoller polls over one raw keep-alive connection, reading each answer
// with a reused buffer, so the client side allocates next to nothing.
type rawPoller struct {
	c   net.Conn
	br  *bufio.Reader
	req string
}

func newRawPoller(tb testing.TB, addr, token, wait string) *rawPoller {
	tb.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = c.Close() })
	return &rawPoller{c: c, br: bufio.NewReaderSize(c, 8192),
		req: "GET /agent/v1/commands?wait=" + wait + " HTTP/1.1\r\nHost: " + addr +
			"\r\nUser-Agent: nodeward-agent/0.0.0-test\r\nAuthorization: Bearer " + token + "\r\n\r\n"}
}

// poll sends one poll and reads its answer; it answers the status line.
func (p *rawPoller) poll(tb testing.TB) string {
	if _, err := io.WriteString(p.c, p.req); err != nil {
		tb.Fatal(err)
	}
	status, err := p.br.ReadSlice('\n')
	if err != nil {
		tb.Fatal(err)
	}
	line := string(status)
	n := -1
	for {
		h, err := p.br.ReadSlice('\n')
		if err != nil {
			tb.Fatal(err)
		}
		if len(h) <= 2 {
			break
		}
		if v, ok := strings.CutPrefix(string(h), "Content-Length: "); ok {
			n = 0
			for _, d := range strings.TrimSpace(v) {
				n = n*10 + int(d-'0')
			}
		}
	}
	if n >= 0 {
		if _, err := p.br.Discard(n); err != nil {
			tb.Fatal(err)
		}
		return line
	}
	for { // chunked
		size, err := p.br.ReadSlice('\n')
		if err != nil {
			tb.Fatal(err)
		}
		n = 0
		for _, d := range strings.TrimSpace(string(size)) {
			n = n*16 + strings.IndexRune("0123456789abcdef", d|0x20)
		}
		if _, err := p.br.Discard(n + 2); err != nil {
			tb.Fatal(err)
		}
		if n == 0 {
			return line
		}
	}
}

// pollCycleCost answers the bytes and allocations one idle poll costs the
// whole process (the server's request, session check, store read, answer,
// and its share of anything in the background), averaged over polls.
func pollCycleCost(tb testing.TB, p *rawPoller, polls int) (bytes, allocs float64) {
	for range 5 { // warm: pools, caches, the connection's buffers
		require.Equal(tb, "HTTP/1.1 200 OK\r\n", p.poll(tb))
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	for range polls {
		if line := p.poll(tb); line != "HTTP/1.1 200 OK\r\n" {
			tb.Fatalf("poll answered %q", line)
		}
	}
	runtime.ReadMemStats(&m1)
	return float64(m1.TotalAlloc-m0.TotalAlloc) / float64(polls), float64(m1.Mallocs-m0.Mallocs) / float64(polls)
}

// BenchmarkIdlePollCycle reports what one idle poll (wait=0: nothing due,
// answered at once) allocates, per dialect.
func BenchmarkIdlePollCycle(b *testing.B) {
	eachBenchServer(b, func(b *testing.B, s *benchServer) {
		c, _ := s.enrolled(b)
		p := newRawPoller(b, strings.TrimPrefix(s.URL, "http://"), c.SessionToken(), "0")
		b.ResetTimer()
		bytes, allocs := pollCycleCost(b, p, max(b.N, 20))
		b.ReportMetric(bytes, "B/poll")
		b.ReportMetric(allocs, "allocs/poll")
	})
}

// TestIdlePollAllocationBound: an idle poll, from request to answer,
// allocates at most idlePollBytes — the whole process's count over 200
// polls, so the bound has room for the background's share. Measured
// (2026-12-01) at ~17.7 KB on SQLite and ~20.0 KB on Postgres, from
// ~19.3 KB on SQLite before the session check stopped deriving its key
// per token and the access log stopped copying the logger per request.
// Re-measured 2026-12-01 (later) at ~18.9 KB and ~22.3 KB on the same tree
// that gave those figures (the process's background and the test's own
// client count too), so the bounds keep about a tenth of room.
func TestIdlePollAllocationBound(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	for _, d := range dbtest.Dialects(t) {
		t.Run(d, func(t *testing.T) {
			s := apitest.Start(t, apitest.WithDialect(d), apitest.WithLog(io.Discard))
			tr := http.DefaultTransport.(*http.Transport).Clone()
			t.Cleanup(tr.CloseIdleConnections)
			bs := &benchServer{Server: s, hc: &http.Client{Transport: tr}}
			c, _ := bs.enrolled(t)
			p := newRawPoller(t, strings.TrimPrefix(s.URL, "http://"), c.SessionToken(), "0")
			bytes, allocs := pollCycleCost(t, p, 200)
			t.Logf("%s: %.0f B and %.1f allocations per idle poll", d, bytes, allocs)
			require.LessOrEqual(t, bytes, float64(idlePollBytes[d]), "bytes allocated per idle poll")
		})
	}
}

var idlePollBytes = map[string]int{"sqlite": 21_000, "postgres": 24_500}
