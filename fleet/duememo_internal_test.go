package fleet

import (
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/internal/testclock"
)

// TestDueMemo: what a read found is kept only if nothing was forgotten
// between its start and its end, only at its fencing token, only while
// the notifier is healthy, and only for maxAge; at most limit nodes.
func TestDueMemo(t *testing.T) {
	clk := testclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	newMemo := func() *dueMemo { return newDueMemo(5*time.Minute, 3, true, clk.Now) }

	t.Run("Kept", func(t *testing.T) {
		m := newMemo()
		require.False(t, m.quiet("n", 1), "nothing known")
		m.put("n", m.begin("n"), 1, true, false)
		require.True(t, m.quiet("n", 1))
		require.False(t, m.quiet("n", 2), "another fencing token")
	})
	t.Run("AwaitingThenSettled", func(t *testing.T) {
		m := newMemo()
		m.put("n", m.begin("n"), 1, false, true) // commands delivered, unsettled
		require.False(t, m.quiet("n", 1), "awaiting is not quiet: polls still read")
		m.settled("n", 2)
		require.False(t, m.quiet("n", 1), "a settlement at another fencing token changes nothing")
		m.settled("n", 1)
		require.True(t, m.quiet("n", 1), "settled with nothing pending left")
		m.put("n", m.begin("n"), 1, false, true)
		m.forget("n") // a command recorded for the node since
		m.settled("n", 1)
		require.False(t, m.quiet("n", 1), "announced since: nothing to settle")
		m.put("n", m.begin("n"), 1, true, false)
		m.settled("n", 1)
		require.True(t, m.quiet("n", 1), "quiet stays quiet")
		clk.Advance(5 * time.Minute)
		m.settled("n", 1)
		require.False(t, m.quiet("n", 1), "aged out")
	})
	t.Run("NotQuietNotKept", func(t *testing.T) {
		m := newMemo()
		m.put("n", m.begin("n"), 1, true, false)
		m.put("n", m.begin("n"), 1, false, false)
		require.False(t, m.quiet("n", 1))
		require.Zero(t, m.count(), "a busy node takes no room")
	})
	t.Run("ForgetDuringRead", func(t *testing.T) {
		m := newMemo()
		tok := m.begin("n")
		m.forget("n") // a write committed and was announced while reading
		m.put("n", tok, 1, true, false)
		require.False(t, m.quiet("n", 1))
		tok = m.begin("n")
		m.forgetAll()
		m.put("n", tok, 1, true, false)
		require.False(t, m.quiet("n", 1))
	})
	t.Run("BeginVoids", func(t *testing.T) {
		m := newMemo()
		m.put("n", m.begin("n"), 1, true, false)
		first := m.begin("n")
		require.False(t, m.quiet("n", 1), "a read in flight: not known")
		second := m.begin("n")
		m.put("n", first, 1, true, false) // overtaken by the second read
		require.False(t, m.quiet("n", 1))
		m.put("n", second, 1, true, false)
		require.True(t, m.quiet("n", 1))
	})
	t.Run("Notifier", func(t *testing.T) {
		m := newMemo()
		m.put("n", m.begin("n"), 1, true, false)
		tok := m.begin("m")
		m.setHealthy(false)
		require.False(t, m.quiet("n", 1), "void once notifications may be missed")
		m.put("m", tok, 1, true, false)
		require.False(t, m.quiet("m", 1), "a read begun before the drop")
		require.Zero(t, m.begin("n"), "nothing kept while down")
		m.setHealthy(true)
		require.False(t, m.quiet("n", 1), "not back by itself")
		m.put("n", m.begin("n"), 1, true, false)
		require.True(t, m.quiet("n", 1))
		cross := newDueMemo(time.Minute, 10, false, clk.Now)
		require.Zero(t, cross.begin("n"), "a replica starts unhealthy until its listener connects")
	})
	t.Run("AgesOut", func(t *testing.T) {
		m := newMemo()
		m.put("n", m.begin("n"), 1, true, false)
		clk.Advance(5*time.Minute - time.Nanosecond)
		require.True(t, m.quiet("n", 1))
		clk.Advance(time.Nanosecond)
		require.False(t, m.quiet("n", 1))
	})
	t.Run("Bounded", func(t *testing.T) {
		m := newMemo()
		for i := range 3 {
			id := strconv.Itoa(i)
			m.put(id, m.begin(id), 1, true, false)
		}
		require.Zero(t, m.begin("x"), "full of fresh entries: not kept")
		require.Equal(t, 3, m.count())
		require.NotZero(t, m.begin("1"), "a node already known is read anew in place")
		clk.Advance(5 * time.Minute)
		tok := m.begin("x")
		require.NotZero(t, tok, "expired entries pruned to make room")
		m.put("x", tok, 1, true, false)
		require.True(t, m.quiet("x", 1))
		require.Equal(t, 1, m.count())
	})
	t.Run("Disabled", func(t *testing.T) {
		m := newDueMemo(-1, 10, true, clk.Now)
		m.put("n", m.begin("n"), 1, true, false)
		require.False(t, m.quiet("n", 1))
	})
}

// TestDueMemoConcurrent: reads, writes' forgets and notifier drops from
// many goroutines (run with -race). Each writer bumps its node's version
// (the commit), then forgets the node (the notification, delivered after
// the commit); each reader notes the version its read saw under its token.
// Once every write is announced, a node the memo calls quiet was kept from
// a read that saw its last write: a read a forget overlapped is never kept.
func TestDueMemoConcurrent(t *testing.T) {
	clk := testclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	m := newDueMemo(time.Hour, 1000, true, clk.Now)
	const nodes = 3
	var mu sync.Mutex
	version := make([]int, nodes) // the store: writes commit here
	seen := map[uint64]int{}      // per read token, the version it saw
	var writers, readers sync.WaitGroup
	var writing atomic.Bool
	writing.Store(true)
	for w := range 4 {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for i := range 500 {
				n := (w + i) % nodes
				mu.Lock()
				version[n]++
				mu.Unlock()
				m.forget(strconv.Itoa(n))
				if i == 250 {
					m.setHealthy(false)
					m.setHealthy(true)
				}
			}
		}()
	}
	for r := range 4 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			// Read on until the writers are done, and a while after.
			for i, after := 0, 0; after < 100; i++ {
				if !writing.Load() {
					after++
				}
				n := (r + i) % nodes
				id := strconv.Itoa(n)
				if m.quiet(id, 1) {
					runtime.Gosched()
					continue
				}
				tok := m.begin(id)
				mu.Lock()
				seen[tok] = version[n]
				mu.Unlock()
				runtime.Gosched() // let writes and other reads overlap this one
				m.put(id, tok, 1, true, false)
			}
		}()
	}
	writers.Wait()
	writing.Store(false)
	readers.Wait()
	quiet := 0
	for n := range nodes {
		id := strconv.Itoa(n)
		if !m.quiet(id, 1) {
			continue
		}
		quiet++
		sh := m.shard(id)
		sh.mu.Lock()
		tok := sh.entries[id].token
		sh.mu.Unlock()
		require.Equal(t, version[n], seen[tok], "node %d kept a read older than its last write", n)
	}
	// Reads after the last write of each node are kept: the check above
	// has something to check.
	for n := range nodes {
		id := strconv.Itoa(n)
		if !m.quiet(id, 1) {
			tok := m.begin(id)
			seen[tok] = version[n]
			m.put(id, tok, 1, true, false)
		}
		require.True(t, m.quiet(id, 1))
	}
	t.Logf("%d of %d nodes quiet at the end of the race", quiet, nodes)
}
