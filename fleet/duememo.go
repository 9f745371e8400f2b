package fleet

import (
	"sync"
	"time"
)

// dueMemo remembers, per node, that this replica's last due-work read
// found the node quiet (DueWork.quiet: no pending command at all, no
// configuration due or riding), so a poll arriving again may skip the read
// (issue 13: an idle fleet's reads filled the machine at 50,000 agents).
//
// Quiet is a state only a write can end — a command issued or released,
// a configuration pushed, forced or made due by a report, an enrollment
// (a new fencing token) — and every such write notifies the node
// (NotifyCommands or NotifyNode) once it commits: here through the commit
// hook, on other replicas through the LISTEN connection. Every
// notification for the node forgets its entry, so what the memo keeps was
// read after the last write this replica heard of. Time alone ends quiet
// only through a delivered, unsettled command (the visibility timeout,
// DECISIONS.md §2) or a configuration delivered but not reported (§32),
// and a read that finds either is not kept.
//
// A notification can be missed only while the listener is down or between
// its connection's loss and its reconnection: the memo forgets everything
// when the notifier goes unhealthy and on the resync a reconnection
// delivers, and keeps nothing while unhealthy. A read racing a
// notification is kept only if no forget came between its start and its
// end (begin's token). Knowledge older than maxAge is not used either (a
// safety net: the node is read again at least that often). Entries are
// bounded: at most limit nodes are remembered, expired ones pruned first.
type dueMemo struct {
	maxAge time.Duration
	limit  int
	now    func() time.Time

	mu      sync.Mutex // guards the following
	healthy bool
	next    uint64
	entries map[string]memoEntry
	pruned  time.Time
}

type memoEntry struct {
	// token names the read that filled the entry, or that is in flight
	// and may fill it (0: none).
	token uint64
	// quiet: the read with this fencing token found nothing due at at.
	quiet   bool
	fencing int64
	at      time.Time
}

func newDueMemo(maxAge time.Duration, limit int, healthy bool, now func() time.Time) *dueMemo {
	return &dueMemo{maxAge: maxAge, limit: limit, healthy: healthy, now: now, entries: map[string]memoEntry{}}
}

// quiet reports whether a read of node at fencing may be skipped: the last
// read found it quiet, no notification for it came since, the notifier
// stayed healthy, and the knowledge is younger than maxAge.
func (m *dueMemo) quiet(nodeID string, fencing int64) bool {
	if m.maxAge <= 0 {
		return false
	}
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[nodeID]
	return ok && m.healthy && e.quiet && e.fencing == fencing && now.Sub(e.at) < m.maxAge && !now.Before(e.at)
}

// begin answers the token to pass to put for a read starting now (0: the
// read's answer will not be kept). It voids what was known of the node:
// the read is about to say anew.
func (m *dueMemo) begin(nodeID string) uint64 {
	if m.maxAge <= 0 {
		return 0
	}
	at := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.healthy {
		return 0
	}
	if _, ok := m.entries[nodeID]; !ok && len(m.entries) >= m.limit {
		m.pruneLocked(at)
		if len(m.entries) >= m.limit {
			return 0
		}
	}
	m.next++
	m.entries[nodeID] = memoEntry{token: m.next, at: at}
	return m.next
}

// put records what the read begun with token found: kept only when quiet
// and no forget came since begin; otherwise the node's entry goes.
func (m *dueMemo) put(nodeID string, token uint64, fencing int64, quiet bool) {
	if token == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[nodeID]
	if !ok || e.token != token {
		return // forgotten meanwhile, or another read of the node began
	}
	if !quiet || !m.healthy {
		delete(m.entries, nodeID)
		return
	}
	m.entries[nodeID] = memoEntry{token: token, quiet: true, fencing: fencing, at: e.at}
}

// forget voids what is known of node (and any read of it in flight).
func (m *dueMemo) forget(nodeID string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.entries, nodeID)
}

// forgetAll voids everything (notifications may have been missed).
func (m *dueMemo) forgetAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.entries = map[string]memoEntry{}
}

// setHealthy records whether notifications flow; going unhealthy voids
// everything, and nothing is kept until healthy again.
func (m *dueMemo) setHealthy(ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !ok {
		m.entries = map[string]memoEntry{}
	}
	m.healthy = ok
}

// pruneLocked drops entries older than maxAge, at most once a quarter of
// maxAge (a full memo of fresh entries is not scanned on every read).
func (m *dueMemo) pruneLocked(now time.Time) {
	if !m.pruned.IsZero() && now.Sub(m.pruned) < m.maxAge/4 {
		return
	}
	m.pruned = now
	for id, e := range m.entries {
		if now.Sub(e.at) >= m.maxAge || now.Before(e.at) {
			delete(m.entries, id)
		}
	}
}

// size answers how many nodes are remembered (tests).
func (m *dueMemo) size() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.entries)
}
