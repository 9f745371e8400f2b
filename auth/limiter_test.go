package auth

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestLoginLimiter(t *testing.T) {
	t0 := time.Date(2026, 5, 1, 9, 0, 0, 0, time.UTC)
	const window = 15 * time.Minute

	t.Run("AnIPv6ClientIsItsSlash64", func(t *testing.T) {
		require.Equal(t, limiterKey("alice", "2001:db8:1:2::a"), limiterKey("alice", "2001:db8:1:2:ffff::9"),
			"one network, whatever address it picks")
		require.NotEqual(t, limiterKey("alice", "2001:db8:1:2::a"), limiterKey("alice", "2001:db8:1:3::a"))
		require.NotEqual(t, limiterKey("alice", "192.0.2.1"), limiterKey("alice", "192.0.2.2"), "IPv4: each address")
		require.Equal(t, limiterKey("alice", "192.0.2.1"), limiterKey("alice", "::ffff:192.0.2.1"))
	})
	t.Run("RefusesAfterMaxFailures", func(t *testing.T) {
		l := newLoginLimiter(3, window, 100)
		k := limiterKey("Alice", "192.0.2.1")
		require.Equal(t, k, limiterKey("alice", "192.0.2.1"), "usernames compare case-insensitively")
		for range 3 {
			require.True(t, l.reserve(k, t0))
			l.fail(k, t0)
		}
		require.False(t, l.reserve(k, t0))
		require.True(t, l.reserve(limiterKey("alice", "192.0.2.2"), t0), "another client is not refused")
		require.True(t, l.reserve(k, t0.Add(window)), "failures expire with the window")
		l.fail(k, t0)
		l.reset(k)
		require.Zero(t, l.size(), "a success forgets the key")
	})

	t.Run("DistinctHugeUsernamesStayBounded", func(t *testing.T) {
		const maxKeys = 500
		l := newLoginLimiter(5, window, maxKeys)
		big := strings.Repeat("x", 64<<10)
		for i := range 5000 {
			now := t0.Add(time.Duration(i) * time.Millisecond)
			k := limiterKey(fmt.Sprintf("%s-%d", big, i), "192.0.2.1")
			require.True(t, l.reserve(k, now))
			l.fail(k, now)
			require.LessOrEqual(t, l.size(), maxKeys)
		}
		require.Equal(t, maxKeys, l.size())
		// The most recent keys are the ones kept.
		last := limiterKey(fmt.Sprintf("%s-%d", big, 4999), "192.0.2.1")
		_, ok := l.keys[last]
		require.True(t, ok)
		_, ok = l.keys[limiterKey(big+"-0", "192.0.2.1")]
		require.False(t, ok, "the least recently failed key was evicted")
	})

	t.Run("HotKeySurvivesEviction", func(t *testing.T) {
		l := newLoginLimiter(5, window, 10)
		hot := limiterKey("admin", "192.0.2.1")
		for i := range 100 {
			if i%5 == 0 {
				l.fail(hot, t0)
			}
			l.fail(limiterKey(fmt.Sprint("spray", i), "192.0.2.1"), t0)
			if i%5 == 0 {
				l.fail(hot, t0)
			}
		}
		require.False(t, l.reserve(hot, t0), "a key failing recently is kept, and stays refused")
	})

	t.Run("TriesInFlightCount", func(t *testing.T) {
		// Guesses sent together: each is counted when taken, before its
		// password is hashed, so no more than max are ever judged.
		l := newLoginLimiter(3, window, 100)
		k := limiterKey("alice", "192.0.2.1")
		for range 3 {
			require.True(t, l.reserve(k, t0))
		}
		require.False(t, l.reserve(k, t0), "three tries being judged: the fourth waits for none of them")
		l.release(k) // one was shed before its hash: not a guess
		require.True(t, l.reserve(k, t0))
		l.fail(k, t0)
		l.fail(k, t0)
		require.False(t, l.reserve(k, t0), "two failures and one try in flight")
		l.reset(k) // the try in flight succeeded
		require.True(t, l.reserve(k, t0))
		l.release(k)
		require.Empty(t, l.pending, "nothing in flight is kept")
	})

	t.Run("SweepDropsExpiredKeys", func(t *testing.T) {
		l := newLoginLimiter(5, window, 1000)
		for i := range 300 {
			l.fail(limiterKey(fmt.Sprint("u", i), "192.0.2.1"), t0)
		}
		require.Equal(t, 300, l.size())
		// Keys never tried again are dropped by the next failure a window
		// later, not kept until their own key comes back.
		l.fail(limiterKey("late", "192.0.2.9"), t0.Add(window))
		require.Equal(t, 1, l.size())
	})
}
