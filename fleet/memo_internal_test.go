package fleet

import (
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/internal/testclock"
)

// TestMemoFallback: a memo with a fallback age (the node cache) keeps what
// it read while notifications may be missed, for that age only; a change of
// the notifier's health either way voids everything.
func TestMemoFallback(t *testing.T) {
	clk := testclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	m := newMemo[string](5*time.Minute, 10*time.Second, 10, false, clk.Now)
	m.put("n", m.begin("n"), "down", true)
	clk.Advance(10*time.Second - time.Nanosecond)
	v, ok := m.get("n")
	require.True(t, ok)
	require.Equal(t, "down", v)
	clk.Advance(time.Nanosecond)
	_, ok = m.get("n")
	require.False(t, ok, "past the fallback age")

	m.put("n", m.begin("n"), "down", true)
	m.setHealthy(true)
	_, ok = m.get("n")
	require.False(t, ok, "kept while down: not trusted for the max age")
	m.put("n", m.begin("n"), "up", true)
	clk.Advance(5*time.Minute - time.Nanosecond)
	v, ok = m.get("n")
	require.True(t, ok)
	require.Equal(t, "up", v)
	m.setHealthy(false)
	_, ok = m.get("n")
	require.False(t, ok, "void once notifications may be missed")

	m.put("n", m.begin("n"), "x", false)
	require.Zero(t, m.count(), "a read not kept takes no room")

	off := newMemo[string](-1, 10*time.Second, 10, false, clk.Now)
	require.Zero(t, off.begin("n"), "disabled: nothing kept, down or up")
}

// TestMemoWarm: a warm-up fills only nodes nothing was said of since it
// began — not one forgotten meanwhile (a write announced during its read),
// not one a read of its own began or filled meanwhile (newer), nothing at
// all once everything was forgotten (the notifier's health changed) — and
// its entries age from when its read began.
func TestMemoWarm(t *testing.T) {
	clk := testclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	m := newMemo[string](5*time.Minute, 0, 10, true, clk.Now)
	require.True(t, m.beginWarm())
	require.False(t, m.beginWarm(), "one warm-up at a time")
	m.forget("written")
	own := m.begin("own")
	m.put("done", m.begin("done"), "its own read", true)
	clk.Advance(time.Minute)
	for _, id := range []string{"a", "written", "own", "done"} {
		m.fill(id, "warm")
	}
	m.endWarm()
	v, ok := m.get("a")
	require.True(t, ok)
	require.Equal(t, "warm", v)
	_, ok = m.get("written")
	require.False(t, ok, "forgotten during the warm-up's read")
	_, ok = m.get("own")
	require.False(t, ok, "a read of its own is in flight: not the warm-up's to fill")
	m.put("own", own, "own", true)
	v, _ = m.get("own")
	require.Equal(t, "own", v, "the node's own read keeps its answer")
	v, _ = m.get("done")
	require.Equal(t, "its own read", v)
	m.fill("late", "warm")
	_, ok = m.get("late")
	require.False(t, ok, "no warm-up in flight: nothing filled")

	clk.Advance(4*time.Minute - time.Nanosecond)
	_, ok = m.get("a")
	require.True(t, ok)
	clk.Advance(time.Nanosecond)
	_, ok = m.get("a")
	require.False(t, ok, "aged from when the warm-up's read began")

	require.True(t, m.beginWarm())
	m.setHealthy(false)
	m.setHealthy(true)
	m.fill("b", "warm")
	m.endWarm()
	_, ok = m.get("b")
	require.False(t, ok, "everything was forgotten since it began")

	full := newMemo[string](5*time.Minute, 0, 1, true, clk.Now)
	require.True(t, full.beginWarm())
	full.fill("x", "warm")
	full.fill("y", "warm")
	full.endWarm()
	require.Equal(t, 1, full.count(), "bounded like any read")

	down := newMemo[string](5*time.Minute, 0, 10, false, clk.Now)
	require.False(t, down.beginWarm(), "nothing would be kept while notifications may be missed")
}

// TestMemoWarmConcurrent: writes (a version bump, then the node's forget)
// race a warm-up's read and fills across the memo's shards (run with
// -race). Once every write is announced, whatever the warm-up left known
// is what the store holds: a fill a forget overlapped is never kept.
func TestMemoWarmConcurrent(t *testing.T) {
	clk := testclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	for round := range 20 {
		m := newMemo[int](time.Hour, 0, 1000, true, clk.Now)
		const nodes = 200
		var mu sync.Mutex
		version := make([]int, nodes)
		var writers sync.WaitGroup
		start := make(chan struct{})
		for w := range 4 {
			writers.Add(1)
			go func() {
				defer writers.Done()
				<-start
				for i := range 300 {
					n := (w*7 + i*13 + round) % nodes
					mu.Lock()
					version[n]++
					mu.Unlock()
					m.forget(strconv.Itoa(n))
				}
			}()
		}
		require.True(t, m.beginWarm())
		close(start)
		mu.Lock()
		snapshot := slices.Clone(version) // the warm-up's read
		mu.Unlock()
		for n, v := range snapshot {
			m.fill(strconv.Itoa(n), v)
			if n%16 == 0 {
				runtime.Gosched()
			}
		}
		m.endWarm()
		writers.Wait()
		for n := range nodes {
			if v, ok := m.get(strconv.Itoa(n)); ok {
				require.Equal(t, version[n], v, "round %d: node %d kept a fill older than its last write", round, n)
			}
		}
	}
}

// BenchmarkMemoParallel: the session doors' pattern (a lookup, a read's
// begin and put on a miss) from many goroutines over many nodes.
func BenchmarkMemoParallel(b *testing.B) {
	m := newMemo[int](time.Hour, 10*time.Second, 1<<20, true, time.Now)
	const nodes = 50_000
	ids := make([]string, nodes)
	for i := range ids {
		ids[i] = "node-" + strconv.Itoa(i)
	}
	b.SetParallelism(256)
	var seq atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		i := int(seq.Add(7919))
		for pb.Next() {
			id := ids[i%nodes]
			if _, ok := m.get(id); !ok || i%50 == 0 {
				m.put(id, m.begin(id), i, true)
			}
			if i%100 == 0 {
				m.forget(id)
			}
			i += 31
		}
	})
}
