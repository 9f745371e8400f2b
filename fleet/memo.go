package fleet

import (
	"sync"
	"time"
)

// memo is this replica's per-node knowledge of what it last read from the
// store: the one mechanism behind the due-work memo (dueMemo) and the node
// cache the session doors read (nodeCache).
//
// What it keeps is true until a write changes it, and every such write
// notifies the node (NotifyNode, NotifyCommands) once it commits: here
// through the commit hook, on other replicas through the LISTEN
// connection. Each notification forgets the node's entry (forget), so
// what the memo answers was read after the last write this replica heard
// of.
//
// A notification can be missed only while the listener is down or
// between its connection's loss and its reconnection: the memo forgets
// everything when the notifier's health changes either way (going down,
// and on coming back, after the resync a reconnection delivers), and while
// it is down it keeps an entry only for fallback (the node cache's short
// TTL; nothing for the due memo). While it is healthy an entry is kept for
// maxAge, a safety net: the node is read again at least that often. A
// single-process deployment (SQLite) starts healthy and stays so: its own
// commit hook hears every write.
//
// A read racing a notification is kept only if no forget of its node came
// between its start and its end: begin hands out a token naming the read
// and voids the node's entry; forget drops the entry and with it the
// token; put keeps the read only under the token it began with.
//
// Entries are bounded: at most limit nodes are remembered. When full,
// entries past their age are pruned (at most once a quarter of the age),
// and if still full a node not already known is not kept (its reads go to
// the store, as without the memo): no eviction of live knowledge, no
// order to maintain.
type memo[V any] struct {
	maxAge   time.Duration // while notifications flow; <= 0: nothing kept
	fallback time.Duration // while they may be missed; <= 0: nothing kept
	limit    int
	now      func() time.Time

	mu      sync.Mutex // guards the following
	healthy bool
	next    uint64
	entries map[string]memoEntry[V]
	pruned  time.Time
	// warm is the warm-up whose read is in flight (nil: none): the nodes
	// forgotten since it began, which it must not fill.
	warm *memoWarm
}

// memoWarm is a warm-up in flight (beginWarm).
type memoWarm struct {
	at        time.Time // when its read began: the age of what it fills
	forgotten map[string]struct{}
	void      bool          // everything was forgotten since it began
	done      chan struct{} // closed when it ends
}

type memoEntry[V any] struct {
	// token names the read that filled the entry, or that is in flight
	// and may fill it (known false).
	token uint64
	known bool
	v     V
	// at is when the read began: the knowledge is at least that old.
	at time.Time
}

func newMemo[V any](maxAge, fallback time.Duration, limit int, healthy bool, now func() time.Time) *memo[V] {
	if maxAge <= 0 {
		// Disabled: nothing is kept even while notifications flow.
		fallback = 0
	}
	return &memo[V]{maxAge: maxAge, fallback: fallback, limit: limit, healthy: healthy, now: now,
		entries: map[string]memoEntry[V]{}}
}

// ageLocked is how long an entry may be relied on now.
func (m *memo[V]) ageLocked() time.Duration {
	if m.healthy {
		return m.maxAge
	}
	return m.fallback
}

// get answers what the last read of the node found, if that may be relied
// on: no notification for it came since, and the knowledge is younger than
// the age the notifier's health allows.
func (m *memo[V]) get(nodeID string) (V, bool) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[nodeID]
	age := m.ageLocked()
	if !ok || !e.known || age <= 0 || now.Sub(e.at) >= age || now.Before(e.at) {
		var zero V
		return zero, false
	}
	return e.v, true
}

// begin answers the token to pass to put for a read starting now (0: the
// read's answer will not be kept). It voids what was known of the node:
// the read is about to say anew.
func (m *memo[V]) begin(nodeID string) uint64 {
	at := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	age := m.ageLocked()
	if age <= 0 {
		return 0
	}
	if _, ok := m.entries[nodeID]; !ok && len(m.entries) >= m.limit {
		m.pruneLocked(at, age)
		if len(m.entries) >= m.limit {
			return 0
		}
	}
	m.next++
	m.entries[nodeID] = memoEntry[V]{token: m.next, at: at}
	return m.next
}

// put records what the read begun with token found, if keep and no forget
// came since begin; otherwise the node's entry goes (unless another read
// of the node began since, whose entry it is).
func (m *memo[V]) put(nodeID string, token uint64, v V, keep bool) {
	if token == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[nodeID]
	if !ok || e.token != token {
		return // forgotten meanwhile, or another read of the node began
	}
	if !keep {
		delete(m.entries, nodeID)
		return
	}
	m.entries[nodeID] = memoEntry[V]{token: token, known: true, v: v, at: e.at}
}

// replace changes what is known of the node to v, when something is known
// that may be relied on (get) and match accepts it; it keeps the entry's
// age, and a forget since (no entry) leaves nothing to change.
func (m *memo[V]) replace(nodeID string, match func(V) bool, v V) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[nodeID]
	age := m.ageLocked()
	if !ok || !e.known || age <= 0 || now.Sub(e.at) >= age || now.Before(e.at) || !match(e.v) {
		return
	}
	e.v = v
	m.entries[nodeID] = e
}

// forget voids what is known of node (and any read of it in flight).
func (m *memo[V]) forget(nodeID string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.entries, nodeID)
	if m.warm != nil {
		m.warm.forgotten[nodeID] = struct{}{}
	}
}

// forgetAll voids everything (notifications may have been missed).
func (m *memo[V]) forgetAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.entries = map[string]memoEntry[V]{}
	if m.warm != nil {
		m.warm.void = true
	}
}

// beginWarm starts a warm-up: one read of many nodes whose findings fill
// the memo (fill) as single reads would have, for nodes nothing is known
// of. It is begin for nodes not yet named: a node forgotten from now on is
// not filled by it. It answers false, and no warm-up begins, when nothing
// would be kept or one is already in flight; endWarm ends it.
func (m *memo[V]) beginWarm() bool {
	at := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.warm != nil || m.ageLocked() <= 0 {
		return false
	}
	m.warm = &memoWarm{at: at, forgotten: map[string]struct{}{}, done: make(chan struct{})}
	return true
}

// warming answers a channel closed when the warm-up in flight ends (nil:
// none is).
func (m *memo[V]) warming() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.warm == nil {
		return nil
	}
	return m.warm.done
}

// fill records what the warm-up's read found of node: kept unless the
// node was forgotten since the warm-up began (or everything was), a read
// of its own has begun or filled it since (its entry is newer), the
// knowledge is already too old, or the memo is full.
func (m *memo[V]) fill(nodeID string, v V) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	w := m.warm
	if w == nil || w.void {
		return
	}
	if _, gone := w.forgotten[nodeID]; gone {
		return
	}
	if _, ok := m.entries[nodeID]; ok {
		return
	}
	if age := m.ageLocked(); age <= 0 || now.Sub(w.at) >= age || now.Before(w.at) || len(m.entries) >= m.limit {
		return
	}
	m.next++
	m.entries[nodeID] = memoEntry[V]{token: m.next, known: true, v: v, at: w.at}
}

// endWarm ends the warm-up in flight.
func (m *memo[V]) endWarm() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.warm != nil {
		close(m.warm.done)
		m.warm = nil
	}
}

// setHealthy records whether notifications flow. A change either way voids
// everything: knowledge taken while they flowed is void once they may not
// (a write announced meanwhile would not be heard), and knowledge taken
// while they did not was kept only for the fallback age, not maxAge.
func (m *memo[V]) setHealthy(ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ok != m.healthy {
		m.entries = map[string]memoEntry[V]{}
		if m.warm != nil {
			m.warm.void = true
		}
	}
	m.healthy = ok
}

// pruneLocked drops entries older than age, at most once a quarter of
// age (a full memo of fresh entries is not scanned on every read).
func (m *memo[V]) pruneLocked(now time.Time, age time.Duration) {
	if !m.pruned.IsZero() && now.Sub(m.pruned) < age/4 && !now.Before(m.pruned) {
		return
	}
	m.pruned = now
	for id, e := range m.entries {
		if now.Sub(e.at) >= age || now.Before(e.at) {
			delete(m.entries, id)
		}
	}
}

// size answers how many nodes are remembered (tests).
func (m *memo[V]) size() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.entries)
}
