package fleet

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
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
//
// Every session door and poll of the replica passes through here, tens of
// thousands a second at scale; under a saturated CPU one mutex became a
// convoy (a goroutine dump of a 50,000-agent run caught 1,010 requests
// queued on it). So the entries are split over memoShards, each with its
// own lock, by a hash of the node id; the notifier's health and the
// warm-up, which concern every node, are kept beside them: the health as
// an atomic word with an epoch that voids every entry taken before it
// changed, the warm-up under its own lock, taken before a shard's.
type memo[V any] struct {
	maxAge   time.Duration // while notifications flow; <= 0: nothing kept
	fallback time.Duration // while they may be missed; <= 0: nothing kept
	limit    int64
	now      func() time.Time
	seed     maphash.Seed

	// state is the notifier's health (bit 0) and the epoch (the rest),
	// bumped by each change of health and by forgetAll: an entry of an
	// earlier epoch is void. Written under warmMu.
	state atomic.Uint64
	next  atomic.Uint64 // the last token handed out
	size  atomic.Int64  // entries across shards, reserved before insertion

	shards [memoShards]memoShard[V]

	warmMu sync.Mutex // guards warm's contents; taken before a shard's lock
	// warm is the warm-up whose read is in flight (nil: none): the nodes
	// forgotten since it began, which it must not fill. Set under warmMu.
	warm atomic.Pointer[memoWarm]

	pruneMu sync.Mutex // guards pruned
	pruned  time.Time
}

// memoShards is how many locks the entries are split over.
const memoShards = 64

type memoShard[V any] struct {
	mu      sync.Mutex // guards entries
	entries map[string]memoEntry[V]
	_       [48]byte // a cache line of its own: neighbours' locks do not share it
}

// memoWarm is a warm-up in flight (beginWarm). Its fields are guarded by
// the memo's warmMu.
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
	// epoch is the memo's epoch when the read began.
	epoch uint64
}

func newMemo[V any](maxAge, fallback time.Duration, limit int, healthy bool, now func() time.Time) *memo[V] {
	if maxAge <= 0 {
		// Disabled: nothing is kept even while notifications flow.
		fallback = 0
	}
	m := &memo[V]{maxAge: maxAge, fallback: fallback, limit: int64(limit), now: now, seed: maphash.MakeSeed()}
	if healthy {
		m.state.Store(1)
	}
	for i := range m.shards {
		m.shards[i].entries = map[string]memoEntry[V]{}
	}
	return m
}

func (m *memo[V]) shard(nodeID string) *memoShard[V] {
	return &m.shards[maphash.String(m.seed, nodeID)%memoShards]
}

// ageOf is how long an entry may be relied on in state st.
func (m *memo[V]) ageOf(st uint64) time.Duration {
	if st&1 == 1 {
		return m.maxAge
	}
	return m.fallback
}

// usable reports whether e may be relied on at now in state st.
func (m *memo[V]) usable(e memoEntry[V], st uint64, now time.Time) bool {
	age := m.ageOf(st)
	return e.known && e.epoch == st>>1 && age > 0 && now.Sub(e.at) < age && !now.Before(e.at)
}

// reserve takes room for one more entry, if there is any.
func (m *memo[V]) reserve() bool {
	for {
		n := m.size.Load()
		if n >= m.limit {
			return false
		}
		if m.size.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// get answers what the last read of the node found, if that may be relied
// on: no notification for it came since, and the knowledge is younger than
// the age the notifier's health allows.
func (m *memo[V]) get(nodeID string) (V, bool) {
	now, st := m.now(), m.state.Load()
	sh := m.shard(nodeID)
	sh.mu.Lock()
	e, ok := sh.entries[nodeID]
	sh.mu.Unlock()
	if !ok || !m.usable(e, st, now) {
		var zero V
		return zero, false
	}
	return e.v, true
}

// begin answers the token to pass to put for a read starting now (0: the
// read's answer will not be kept). It voids what was known of the node:
// the read is about to say anew.
func (m *memo[V]) begin(nodeID string) uint64 {
	at, st := m.now(), m.state.Load()
	age := m.ageOf(st)
	if age <= 0 {
		return 0
	}
	sh := m.shard(nodeID)
	sh.mu.Lock()
	if _, ok := sh.entries[nodeID]; !ok && !m.reserve() {
		sh.mu.Unlock()
		m.prune(at, age) // takes every shard's lock in turn: not while holding one
		sh.mu.Lock()
		if _, ok := sh.entries[nodeID]; !ok && !m.reserve() {
			sh.mu.Unlock()
			return 0
		}
	}
	token := m.next.Add(1)
	sh.entries[nodeID] = memoEntry[V]{token: token, at: at, epoch: st >> 1}
	sh.mu.Unlock()
	return token
}

// put records what the read begun with token found, if keep and no forget
// came since begin; otherwise the node's entry goes (unless another read
// of the node began since, whose entry it is).
func (m *memo[V]) put(nodeID string, token uint64, v V, keep bool) {
	if token == 0 {
		return
	}
	sh := m.shard(nodeID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.entries[nodeID]
	if !ok || e.token != token {
		return // forgotten meanwhile, or another read of the node began
	}
	if !keep {
		delete(sh.entries, nodeID)
		m.size.Add(-1)
		return
	}
	e.known, e.v = true, v
	sh.entries[nodeID] = e
}

// replace changes what is known of the node to v, when something is known
// that may be relied on (get) and match accepts it; it keeps the entry's
// age, and a forget since (no entry) leaves nothing to change.
func (m *memo[V]) replace(nodeID string, match func(V) bool, v V) {
	now, st := m.now(), m.state.Load()
	sh := m.shard(nodeID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.entries[nodeID]
	if !ok || !m.usable(e, st, now) || !match(e.v) {
		return
	}
	e.v = v
	sh.entries[nodeID] = e
}

// forget voids what is known of node (and any read of it in flight).
func (m *memo[V]) forget(nodeID string) {
	// A warm-up that begins after this load reads after the write this
	// forget announces (it committed before the notification): nothing
	// to tell it.
	if m.warm.Load() != nil {
		m.warmMu.Lock()
		defer m.warmMu.Unlock()
		if w := m.warm.Load(); w != nil {
			w.forgotten[nodeID] = struct{}{}
		}
	}
	sh := m.shard(nodeID)
	sh.mu.Lock()
	if _, ok := sh.entries[nodeID]; ok {
		delete(sh.entries, nodeID)
		m.size.Add(-1)
	}
	sh.mu.Unlock()
}

// forgetAll voids everything (notifications may have been missed).
func (m *memo[V]) forgetAll() {
	m.warmMu.Lock()
	m.state.Add(2) // the next epoch, health unchanged
	if w := m.warm.Load(); w != nil {
		w.void = true
	}
	m.warmMu.Unlock()
	m.clear()
}

// clear drops every entry (all void already: of an earlier epoch).
func (m *memo[V]) clear() {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		m.size.Add(-int64(len(sh.entries)))
		clear(sh.entries)
		sh.mu.Unlock()
	}
}

// beginWarm starts a warm-up: one read of many nodes whose findings fill
// the memo (fill) as single reads would have, for nodes nothing is known
// of. It is begin for nodes not yet named: a node forgotten from now on is
// not filled by it. It answers false, and no warm-up begins, when nothing
// would be kept or one is already in flight; endWarm ends it.
func (m *memo[V]) beginWarm() bool {
	at := m.now()
	m.warmMu.Lock()
	defer m.warmMu.Unlock()
	if m.warm.Load() != nil || m.ageOf(m.state.Load()) <= 0 {
		return false
	}
	m.warm.Store(&memoWarm{at: at, forgotten: map[string]struct{}{}, done: make(chan struct{})})
	return true
}

// warming answers a channel closed when the warm-up in flight ends (nil:
// none is).
func (m *memo[V]) warming() <-chan struct{} {
	if w := m.warm.Load(); w != nil {
		return w.done
	}
	return nil
}

// fill records what the warm-up's read found of node: kept unless the
// node was forgotten since the warm-up began (or everything was), a read
// of its own has begun or filled it since (its entry is newer), the
// knowledge is already too old, or the memo is full.
func (m *memo[V]) fill(nodeID string, v V) {
	now := m.now()
	// warmMu is held throughout, so a forget of the node comes wholly
	// before (and is seen) or wholly after (and drops what is filled).
	m.warmMu.Lock()
	defer m.warmMu.Unlock()
	w := m.warm.Load()
	if w == nil || w.void {
		return
	}
	if _, gone := w.forgotten[nodeID]; gone {
		return
	}
	st := m.state.Load()
	if age := m.ageOf(st); age <= 0 || now.Sub(w.at) >= age || now.Before(w.at) {
		return
	}
	sh := m.shard(nodeID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.entries[nodeID]; ok || !m.reserve() {
		return
	}
	sh.entries[nodeID] = memoEntry[V]{token: m.next.Add(1), known: true, v: v, at: w.at, epoch: st >> 1}
}

// endWarm ends the warm-up in flight.
func (m *memo[V]) endWarm() {
	m.warmMu.Lock()
	defer m.warmMu.Unlock()
	if w := m.warm.Load(); w != nil {
		close(w.done)
		m.warm.Store(nil)
	}
}

// setHealthy records whether notifications flow. A change either way voids
// everything: knowledge taken while they flowed is void once they may not
// (a write announced meanwhile would not be heard), and knowledge taken
// while they did not was kept only for the fallback age, not maxAge.
func (m *memo[V]) setHealthy(ok bool) {
	m.warmMu.Lock()
	st := m.state.Load()
	if (st&1 == 1) == ok {
		m.warmMu.Unlock()
		return
	}
	next := (st>>1 + 1) << 1
	if ok {
		next |= 1
	}
	m.state.Store(next)
	if w := m.warm.Load(); w != nil {
		w.void = true
	}
	m.warmMu.Unlock()
	m.clear()
}

// prune drops entries older than age, or of an earlier epoch, at most once
// a quarter of age (a full memo of fresh entries is not scanned on every
// read).
func (m *memo[V]) prune(now time.Time, age time.Duration) {
	m.pruneMu.Lock()
	if !m.pruned.IsZero() && now.Sub(m.pruned) < age/4 && !now.Before(m.pruned) {
		m.pruneMu.Unlock()
		return
	}
	m.pruned = now
	m.pruneMu.Unlock()
	epoch := m.state.Load() >> 1
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for id, e := range sh.entries {
			if e.epoch != epoch || now.Sub(e.at) >= age || now.Before(e.at) {
				delete(sh.entries, id)
				m.size.Add(-1)
			}
		}
		sh.mu.Unlock()
	}
}

// count answers how many nodes are remembered (tests).
func (m *memo[V]) count() int {
	return int(m.size.Load())
}
