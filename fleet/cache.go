package fleet

import (
	"slices"
	"sync"
	"time"
)

// nodeCache keeps each node's fencing token and state for the session
// doors, so an agent's poll does not cost a read. Entries are dropped on
// every change this replica commits and on every change another replica
// announces; the TTL bounds staleness if an announcement is lost.
type nodeCache struct {
	ttl time.Duration
	now func() time.Time

	mu      sync.Mutex // guards the following
	entries map[string]cachedNode
	// epoch counts forgets: a record read before a forget must not be
	// cached after it (it may predate the change the forget announced).
	epoch uint64
}

type cachedNode struct {
	state   State
	fencing int64
	// caps are the capabilities of the node's latest facts; capsKnown is
	// false while it never reported any (DECISIONS.md §45).
	caps      []string
	capsKnown bool
	at        time.Time
}

func cachedOf(n Node) cachedNode {
	caps, known := n.Capabilities()
	return cachedNode{state: n.State, fencing: n.FencingToken, caps: caps, capsKnown: known}
}

func newNodeCache(ttl time.Duration, now func() time.Time) *nodeCache {
	return &nodeCache{ttl: ttl, now: now, entries: map[string]cachedNode{}}
}

func (c *nodeCache) get(id string) (cachedNode, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[id]
	if !ok || c.now().Sub(e.at) > c.ttl {
		return cachedNode{}, false
	}
	return e, true
}

// begin answers the epoch to pass to put for a read starting now.
func (c *nodeCache) begin() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.epoch
}

// put caches n, read since epoch, unless something was forgotten meanwhile.
func (c *nodeCache) put(n Node, epoch uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.epoch != epoch {
		return
	}
	e := cachedOf(n)
	e.at = c.now()
	c.entries[n.ID] = e
}

func (c *nodeCache) forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, id)
	c.epoch++
}

// forgetIfCapsChanged drops a node's entry when reported (a fresh facts
// list; nil: the legacy reading) differs from the cached capabilities.
func (c *nodeCache) forgetIfCapsChanged(id string, reported []string) {
	if reported == nil {
		reported = LegacyCapabilities
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[id]
	if !ok || (e.capsKnown && slices.Equal(e.caps, reported)) {
		return
	}
	delete(c.entries, id)
	c.epoch++
}

func (c *nodeCache) forgetAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries = map[string]cachedNode{}
	c.epoch++
}
