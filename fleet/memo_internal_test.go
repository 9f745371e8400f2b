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
