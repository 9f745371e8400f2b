package fleet

import (
	"crypto/sha256"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/keys"
)

// TestSessionCacheBounded: a flood of distinct valid tokens never grows
// the cache past its bound.
func TestSessionCacheBounded(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	c := newSessionCache(3)
	for i := range 100 {
		k := sha256.Sum256([]byte(strconv.Itoa(i)))
		c.put(k, sessionEntry{nodeID: strconv.Itoa(i), fencing: 1, stamp: keys.Stamp{Expires: now.Add(time.Hour)}}, now)
		require.LessOrEqual(t, c.len(), 3)
		e, ok := c.get(k)
		require.True(t, ok, "the newest is kept")
		require.Equal(t, strconv.Itoa(i), e.nodeID)
	}
	require.Nil(t, newSessionCache(-1), "disabled")
	_, ok := newSessionCache(-1).get([sha256.Size]byte{})
	require.False(t, ok)
}

// TestSessionCacheFullDropsExpiredFirst: a full cache makes room by
// dropping the tokens that expired (an agent's token before its renewal),
// keeping every live one.
func TestSessionCacheFullDropsExpiredFirst(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	c := newSessionCache(4)
	key := func(i int) [sha256.Size]byte { return sha256.Sum256([]byte(strconv.Itoa(i))) }
	for i := range 4 {
		exp := now.Add(time.Hour)
		if i%2 == 0 {
			exp = now.Add(-time.Minute) // expired, leeway included
		}
		c.put(key(i), sessionEntry{nodeID: strconv.Itoa(i), stamp: keys.Stamp{Expires: exp}}, now)
	}
	c.put(key(4), sessionEntry{nodeID: "4", stamp: keys.Stamp{Expires: now.Add(time.Hour)}}, now)
	require.Equal(t, 3, c.len(), "both expired tokens dropped, nothing live")
	for _, i := range []int{1, 3, 4} {
		_, ok := c.get(key(i))
		require.True(t, ok, "live token %d kept", i)
	}
}
