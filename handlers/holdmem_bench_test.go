package handlers_test

// Memory per held long-poll (issue 13, item 2), measured in-process: the
// goroutine stacks and live heap one held GET /agent/v1/commands costs the
// real handler, beside a bare net/http waiter measured the same way in the
// same process. The figures are reported, never asserted (they move with
// the Go release and the machine); BENCHMARKS.md explains them. Run:
//
//	go test -run '^$' -bench HeldPollMemory -benchtime 1x ./handlers

import (
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/internal/testwait"
	"github.com/nodeward/nodeward/models/dbtest"
)

const heldPollsMeasured = 300

// holdRaw opens one connection per token and sends a long-poll on each
// (raw, so the client side costs no goroutines or buffers here), reading
// nothing back.
func holdRaw(b testing.TB, addr string, tokens []string) []net.Conn {
	b.Helper()
	conns := make([]net.Conn, len(tokens))
	for i, tok := range tokens {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		req := "GET /agent/v1/commands?wait=60 HTTP/1.1\r\nHost: " + addr + "\r\nUser-Agent: nodeward-agent/0.0.0-test\r\n"
		if tok != "" {
			req += "Authorization: Bearer " + tok + "\r\n"
		}
		if _, err := io.WriteString(c, req+"\r\n"); err != nil {
			b.Fatal(err)
		}
		conns[i] = c
	}
	return conns
}

// heldMemory holds one poll per token and answers what they cost: stack
// and heap bytes per held poll as held, and the stacks once the collector
// has had the chance to shrink them (each cycle halves a stack at most once).
func heldMemory(b testing.TB, addr string, tokens []string, held func() int) (stack, stackShrunk, heap float64) {
	b.Helper()
	var m0, m1, m2 runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m0)
	conns := holdRaw(b, addr, tokens)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	testwait.For(b, "every poll held", testwait.Patience, func() bool { return held() == len(tokens) })
	runtime.ReadMemStats(&m1)
	for range 5 {
		runtime.GC()
	}
	runtime.ReadMemStats(&m2)
	n := float64(len(tokens))
	return float64(int64(m1.StackInuse)-int64(m0.StackInuse)) / n,
		float64(int64(m2.StackInuse)-int64(m0.StackInuse)) / n,
		float64(int64(m2.HeapAlloc)-int64(m0.HeapAlloc)) / n
}

// BenchmarkHeldPollMemory reports stack-B/poll (as held), shrunk-stack-B/poll
// (after five collections) and heap-B/poll (live, after them) for the real
// handler and for the bare waiter.
func BenchmarkHeldPollMemory(b *testing.B) {
	b.Run("bare", func(b *testing.B) {
		var held atomic.Int64
		mux := http.NewServeMux()
		mux.HandleFunc("GET /agent/v1/commands", func(w http.ResponseWriter, r *http.Request) {
			wait, _ := strconv.Atoi(r.URL.Query().Get("wait"))
			held.Add(1)
			t := time.NewTimer(time.Duration(wait) * time.Second)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
			}
			held.Add(-1)
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"commands":[]}`))
		})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		reportHeld(b, ln.Addr().String(), make([]string, heldPollsMeasured), func() int { return int(held.Load()) })
	})
	for _, d := range dbtest.Dialects(b) {
		b.Run(d, func(b *testing.B) {
			s := apitest.Start(b, apitest.WithDialect(d), apitest.WithLog(io.Discard))
			tr := http.DefaultTransport.(*http.Transport).Clone()
			b.Cleanup(tr.CloseIdleConnections)
			bs := &benchServer{Server: s, hc: &http.Client{Transport: tr}}
			tokens := make([]string, heldPollsMeasured)
			for i := range tokens {
				c, _ := bs.enrolled(b)
				tokens[i] = c.SessionToken()
			}
			tr.CloseIdleConnections()
			addr := s.URL[len("http://"):]
			reportHeld(b, addr, tokens, s.App.Fleet.Hub().Held)
		})
	}
}

func reportHeld(b *testing.B, addr string, tokens []string, held func() int) {
	for i := 0; i < b.N; i++ {
		stack, shrunk, heap := heldMemory(b, addr, tokens, held)
		testwait.For(b, "polls released", testwait.Patience, func() bool { return held() == 0 })
		b.ReportMetric(stack, "stack-B/poll")
		b.ReportMetric(shrunk, "shrunk-stack-B/poll")
		b.ReportMetric(heap, "heap-B/poll")
	}
}
