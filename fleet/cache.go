package fleet

import (
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
	at      time.Time
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
	c.entries[n.ID] = cachedNode{state: n.State, fencing: n.FencingToken, at: c.now()}
}

func (c *nodeCache) forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, id)
	c.epoch++
}

func (c *nodeCache) forgetAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries = map[string]cachedNode{}
	c.epoch++
}
