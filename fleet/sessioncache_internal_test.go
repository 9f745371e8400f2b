package fleet

import (
	"crypto/sha256"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSessionCacheBounded: a flood of distinct valid tokens never grows
// the cache past its bound.
func TestSessionCacheBounded(t *testing.T) {
	c := newSessionCache(3)
	for i := range 100 {
		k := sha256.Sum256([]byte(strconv.Itoa(i)))
		c.put(k, sessionEntry{nodeID: strconv.Itoa(i), fencing: 1})
		require.LessOrEqual(t, c.len(), 3)
		e, ok := c.get(k)
		require.True(t, ok, "the newest is kept")
		require.Equal(t, strconv.Itoa(i), e.nodeID)
	}
	require.Nil(t, newSessionCache(-1), "disabled")
	_, ok := newSessionCache(-1).get([sha256.Size]byte{})
	require.False(t, ok)
}
