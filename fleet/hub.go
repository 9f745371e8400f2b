package fleet

import (
	"sort"
	"sync"
	"time"

	"github.com/nodeward/nodeward/metrics"
)

// wake tells a waiting long-poll why it should look again.
type wake int

const (
	wakeWork    wake = iota + 1 // new work may be due
	wakeRecheck                 // the node's record changed: re-check the session
	wakeDrain                   // the server is shutting down
)

// waiter is one held long-poll.
type waiter struct {
	nodeID string
	remote string
	since  time.Time
	ch     chan wake // buffered: a wake never blocks the waker
}

// Hub tracks the long-polls this replica holds and wakes them. It holds no
// work itself: commands are durable in the store before anyone is woken.
type Hub struct {
	metrics *metrics.Metrics
	now     func() time.Time

	mu       sync.Mutex // guards the following
	byNode   map[string]map[*waiter]struct{}
	count    int
	draining bool
}

func newHub(m *metrics.Metrics, now func() time.Time) *Hub {
	return &Hub{metrics: m, now: now, byNode: map[string]map[*waiter]struct{}{}}
}

// subscribe registers a long-poll for node; ErrDraining once draining.
func (h *Hub) subscribe(nodeID, remote string) (*waiter, error) {
	w := &waiter{nodeID: nodeID, remote: remote, since: h.now().UTC(), ch: make(chan wake, 1)}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.draining {
		return nil, ErrDraining
	}
	set := h.byNode[nodeID]
	if set == nil {
		set = map[*waiter]struct{}{}
		h.byNode[nodeID] = set
	}
	set[w] = struct{}{}
	h.count++
	h.metrics.OpenLongPolls.Inc()
	return w, nil
}

func (h *Hub) unsubscribe(w *waiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	set := h.byNode[w.nodeID]
	if _, ok := set[w]; !ok {
		return
	}
	delete(set, w)
	if len(set) == 0 {
		delete(h.byNode, w.nodeID)
	}
	h.count--
	h.metrics.OpenLongPolls.Dec()
}

// send delivers a wake without blocking; a stronger reason replaces a
// weaker one still unread.
func send(w *waiter, why wake) bool {
	select {
	case w.ch <- why:
		return true
	default:
	}
	// A wake is already pending; make sure it is at least as strong.
	select {
	case old := <-w.ch:
		if old > why {
			why = old
		}
	default:
	}
	select {
	case w.ch <- why:
	default:
	}
	return false
}

// Wake tells node's long-polls that work may be due. source is counted:
// local (a commit on this replica), notify (another replica), poll.
func (h *Hub) Wake(nodeID, source string) { h.signal(nodeID, wakeWork, source) }

// Recheck tells node's long-polls its record changed (fenced, retired).
func (h *Hub) Recheck(nodeID, source string) { h.signal(nodeID, wakeRecheck, source) }

func (h *Hub) signal(nodeID string, why wake, source string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.byNode[nodeID] {
		if send(w, why) {
			h.metrics.Wakeups.WithLabelValues(source).Inc()
		}
	}
}

// WakeAll wakes every long-poll to re-check (after missed notifications).
func (h *Hub) WakeAll(source string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, set := range h.byNode {
		for w := range set {
			if send(w, wakeRecheck) {
				h.metrics.Wakeups.WithLabelValues(source).Inc()
			}
		}
	}
}

// Drain answers every held long-poll at once and refuses new ones.
func (h *Hub) Drain() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.draining = true
	for _, set := range h.byNode {
		for w := range set {
			send(w, wakeDrain)
		}
	}
}

// Held answers how many long-polls this replica holds.
func (h *Hub) Held() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.count
}

// HeldFor answers how many long-polls this replica holds for node.
func (h *Hub) HeldFor(nodeID string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.byNode[nodeID])
}

// Sessions lists the long-polls held now, oldest first.
func (h *Hub) Sessions(replica string) []LiveSession {
	h.mu.Lock()
	out := make([]LiveSession, 0, h.count)
	for _, set := range h.byNode {
		for w := range set {
			out = append(out, LiveSession{NodeID: w.nodeID, Replica: replica, Since: w.since, RemoteAddr: w.remote})
		}
	}
	h.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Since.Equal(out[j].Since) {
			return out[i].Since.Before(out[j].Since)
		}
		return out[i].NodeID < out[j].NodeID
	})
	return out
}
