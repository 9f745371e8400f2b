package fleet

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMemoFallback: a memo with a fallback age (the node cache) keeps what
// it read while notifications may be missed, for that age only; a change of
// the notifier's health either way voids everything.
func TestMemoFallback(t *testing.T) {
	clk := &memoClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	m := newMemo[string](5*time.Minute, 10*time.Second, 10, false, clk.now)
	m.put("n", m.begin("n"), "down", true)
	clk.advance(10*time.Second - time.Nanosecond)
	v, ok := m.get("n")
	require.True(t, ok)
	require.Equal(t, "down", v)
	clk.advance(time.Nanosecond)
	_, ok = m.get("n")
	require.False(t, ok, "past the fallback age")

	m.put("n", m.begin("n"), "down", true)
	m.setHealthy(true)
	_, ok = m.get("n")
	require.False(t, ok, "kept while down: not trusted for the max age")
	m.put("n", m.begin("n"), "up", true)
	clk.advance(5*time.Minute - time.Nanosecond)
	v, ok = m.get("n")
	require.True(t, ok)
	require.Equal(t, "up", v)
	m.setHealthy(false)
	_, ok = m.get("n")
	require.False(t, ok, "void once notifications may be missed")

	m.put("n", m.begin("n"), "x", false)
	require.Zero(t, m.size(), "a read not kept takes no room")

	off := newMemo[string](-1, 10*time.Second, 10, false, clk.now)
	require.Zero(t, off.begin("n"), "disabled: nothing kept, down or up")
}

// TestMemoWarm: a warm-up fills only nodes nothing was said of since it
// began — not one forgotten meanwhile (a write announced during its read),
// not one a read of its own began or filled meanwhile (newer), nothing at
// all once everything was forgotten (the notifier's health changed) — and
// its entries age from when its read began.
func TestMemoWarm(t *testing.T) {
	clk := &memoClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	m := newMemo[string](5*time.Minute, 0, 10, true, clk.now)
	require.True(t, m.beginWarm())
	require.False(t, m.beginWarm(), "one warm-up at a time")
	m.forget("written")
	own := m.begin("own")
	m.put("done", m.begin("done"), "its own read", true)
	clk.advance(time.Minute)
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

	clk.advance(4*time.Minute - time.Nanosecond)
	_, ok = m.get("a")
	require.True(t, ok)
	clk.advance(time.Nanosecond)
	_, ok = m.get("a")
	require.False(t, ok, "aged from when the warm-up's read began")

	require.True(t, m.beginWarm())
	m.setHealthy(false)
	m.setHealthy(true)
	m.fill("b", "warm")
	m.endWarm()
	_, ok = m.get("b")
	require.False(t, ok, "everything was forgotten since it began")

	full := newMemo[string](5*time.Minute, 0, 1, true, clk.now)
	require.True(t, full.beginWarm())
	full.fill("x", "warm")
	full.fill("y", "warm")
	full.endWarm()
	require.Equal(t, 1, full.size(), "bounded like any read")

	down := newMemo[string](5*time.Minute, 0, 10, false, clk.now)
	require.False(t, down.beginWarm(), "nothing would be kept while notifications may be missed")
}
