package fleet

import (
	"crypto/sha256"
	"sync"
	"time"

	"github.com/nodeward/nodeward/keys"
)

// sessionCache remembers session tokens whose signature verified, so an
// agent's next poll, result or event request skips parsing the JWT and the
// HMAC (together ~6% of the CPU at saturation). What it remembers is what
// the token says (node, fencing token) and what its validity still depends
// on (keys.Stamp: its key and times), which every hit rechecks as Verify
// would; fenced and retired are still judged against the node's record
// (DECISIONS.md §7), never by this cache.
//
// It is keyed by the token's SHA-256 so no bearer credential is held in
// memory longer than its request. Only tokens that verified are stored,
// so forged ones cannot fill it; valid ones are bounded by max, evicting an
// arbitrary entry when full (Go's map iteration order): a miss costs only
// a verification, as before. Expired entries go when next looked up.
//
// It needs no invalidation: a token's claims never change, the node's state
// is not kept here, and a ring's keys are fixed for its life (a rotation is
// a new ring, and Recheck looks the key up in the ring anyway).
type sessionCache struct {
	mu      sync.RWMutex
	max     int
	entries map[[sha256.Size]byte]sessionEntry
}

type sessionEntry struct {
	nodeID  string
	fencing int64
	stamp   keys.Stamp
}

// newSessionCache answers a cache of at most max tokens (none if max < 1:
// every request verifies).
func newSessionCache(max int) *sessionCache {
	if max < 1 {
		return nil
	}
	return &sessionCache{max: max, entries: make(map[[sha256.Size]byte]sessionEntry)}
}

func (c *sessionCache) get(key [sha256.Size]byte) (sessionEntry, bool) {
	if c == nil {
		return sessionEntry{}, false
	}
	c.mu.RLock()
	e, ok := c.entries[key]
	c.mu.RUnlock()
	return e, ok
}

// put remembers e under key. A full cache first drops every token expired
// by now (renewals leave each agent's previous token behind, which nothing
// looks up again), and only when none has evicts an arbitrary live one.
func (c *sessionCache) put(key [sha256.Size]byte, e sessionEntry, now time.Time) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[key]; !ok && len(c.entries) >= c.max {
		for k, old := range c.entries {
			if !now.Before(old.stamp.Expires.Add(keys.Leeway)) {
				delete(c.entries, k)
			}
		}
		if len(c.entries) >= c.max {
			for k := range c.entries {
				delete(c.entries, k)
				break
			}
		}
	}
	c.entries[key] = e
}

func (c *sessionCache) forget(key [sha256.Size]byte) {
	if c == nil {
		return
	}
	c.mu.Lock()
	delete(c.entries, key)
	c.mu.Unlock()
}

// len answers how many tokens are remembered (for tests).
func (c *sessionCache) len() int {
	if c == nil {
		return 0
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.entries)
}
