package fleet

import (
	"sort"
	"sync"
	"time"

	"github.com/nodeward/nodeward/metrics"
)

// wake tells a waiting long-poll why it should look again.
type wake int

// A held poll waits on its waiter's channel alone (PollWork), so its end
// and its timers arrive there too. Stronger reasons replace weaker ones
// still unread (send); the poll's own end is the strongest, so it is never
// lost.
const (
	wakeFallback wake = iota + 1 // the notifier is down: look again (counted as source "poll")
	wakeWork                     // new work may be due
	wakeIssued                   // this replica just recorded a command for the node
	wakeHanded                   // commands were claimed for this poll and handed to it (waiter.hand)
	wakeRecheck                  // the node's record changed: re-check the session
	wakeDrain                    // the server is shutting down
	wakeDeadline                 // the poll's wait is over
	wakeGone                     // the poll's context ended (the agent left)
)

// waiter is one held long-poll.
type waiter struct {
	nodeID string
	// fencing is the poll's session's fencing token.
	fencing int64
	ch      chan wake // buffered: a wake never blocks the waker
	// sending serialises senders (the hub, and the poll's own timers and
	// context, which send outside the hub's lock), so a stronger reason
	// taken out to be compared is always put back.
	sending sync.Mutex

	handMu sync.Mutex // guards the following
	// answered: the poll has taken its answer; nothing more is handed.
	answered bool
	// handed are commands recorded delivered to this poll by the
	// transaction that recorded them (Service.pollToHand), committed, not
	// yet taken.
	handed []Command

	// next is the node's next held poll (Hub.byNode), guarded by the hub's
	// lock.
	next *waiter
}

// hand gives the poll commands claimed for it, unless it has taken its
// answer already (false: the caller makes them due again).
func (w *waiter) hand(cmds []Command) bool {
	w.handMu.Lock()
	if w.answered {
		w.handMu.Unlock()
		return false
	}
	w.handed = append(w.handed, cmds...)
	w.handMu.Unlock()
	send(w, wakeHanded)
	return true
}

// finish ends what the poll may be handed and answers what it was handed
// and has not taken.
func (w *waiter) finish() []Command {
	w.handMu.Lock()
	defer w.handMu.Unlock()
	w.answered = true
	out := w.handed
	w.handed = nil
	return out
}

// take answers the commands handed to the poll, if any, as its answer:
// nothing more is handed after them.
func (w *waiter) take() []Command {
	w.handMu.Lock()
	defer w.handMu.Unlock()
	out := w.handed
	if len(out) > 0 {
		w.answered, w.handed = true, nil
	}
	return out
}

// takeable reports whether commands may be claimed for the poll now.
func (w *waiter) takeable() bool {
	w.handMu.Lock()
	defer w.handMu.Unlock()
	return !w.answered
}

// Hub tracks the long-polls this replica holds and wakes them. It holds no
// work itself: commands are durable in the store before anyone is woken.
type Hub struct {
	metrics *metrics.Metrics
	now     func() time.Time

	mu sync.Mutex // guards the following
	// byNode is each node's held polls, linked through waiter.next: nearly
	// always one, and a list costs a held poll a pointer where a set would
	// cost it a map of its own (BENCHMARKS.md, memory per held poll).
	byNode   map[string]*waiter
	count    int
	draining bool
	// present is who is connected: a node that re-polls within
	// presenceGrace of its last poll ending stays connected since its first.
	present map[string]*presence
	// membership counts connections and disconnections, so the replica
	// republishes its sessions only when the set changed.
	membership uint64
}

// presenceGrace bridges the gap between one long-poll's answer and the
// agent's next poll.
const presenceGrace = 5 * time.Second

type presence struct {
	since  time.Time
	remote string
	held   int
	leftAt time.Time
}

func newHub(m *metrics.Metrics, now func() time.Time) *Hub {
	return &Hub{metrics: m, now: now, byNode: map[string]*waiter{}, present: map[string]*presence{}}
}

// subscribe registers a long-poll of sess; ErrDraining once draining.
func (h *Hub) subscribe(sess Session, remote string) (*waiter, error) {
	nodeID := sess.NodeID
	w := &waiter{nodeID: nodeID, fencing: sess.Fencing, ch: make(chan wake, 1)}
	since := h.now().UTC()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.draining {
		return nil, ErrDraining
	}
	w.next = h.byNode[nodeID]
	h.byNode[nodeID] = w
	h.count++
	h.metrics.OpenLongPolls.Inc()
	p := h.present[nodeID]
	if p == nil || (p.held == 0 && since.Sub(p.leftAt) > presenceGrace) {
		p = &presence{since: since}
		h.present[nodeID] = p
		h.membership++
	}
	p.held++
	p.remote = remote
	return w, nil
}

func (h *Hub) unsubscribe(w *waiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch head := h.byNode[w.nodeID]; {
	case head == w && w.next == nil:
		delete(h.byNode, w.nodeID)
	case head == w:
		h.byNode[w.nodeID] = w.next
	default:
		prev := head
		for prev != nil && prev.next != w {
			prev = prev.next
		}
		if prev == nil {
			return // not held (unsubscribed already)
		}
		prev.next = w.next
	}
	w.next = nil
	h.count--
	h.metrics.OpenLongPolls.Dec()
	if p := h.present[w.nodeID]; p != nil {
		p.held--
		if p.held == 0 {
			p.leftAt = h.now().UTC()
		}
	}
}

// send delivers a wake without blocking; a stronger reason replaces a
// weaker one still unread.
func send(w *waiter, why wake) bool {
	w.sending.Lock()
	defer w.sending.Unlock()
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

// WakeIssued is Wake for a command this replica's commit just recorded
// for node (NotifyIssued): its long-polls claim without reading first.
func (h *Hub) WakeIssued(nodeID, source string) { h.signal(nodeID, wakeIssued, source) }

// Recheck tells node's long-polls its record changed (fenced, retired).
func (h *Hub) Recheck(nodeID, source string) { h.signal(nodeID, wakeRecheck, source) }

func (h *Hub) signal(nodeID string, why wake, source string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := h.byNode[nodeID]; w != nil; w = w.next {
		if send(w, why) {
			h.metrics.Wakeups.WithLabelValues(source).Inc()
		}
	}
}

// WakeAll wakes every long-poll to re-check (after missed notifications).
func (h *Hub) WakeAll(source string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, head := range h.byNode {
		for w := head; w != nil; w = w.next {
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
	for _, head := range h.byNode {
		for w := head; w != nil; w = w.next {
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

// held answers a long-poll this replica holds for node that may be handed
// commands, and its fencing token: of the newest session when an old one's
// poll is still held too; nil when none.
func (h *Hub) held(nodeID string) (*waiter, int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out *waiter
	for w := h.byNode[nodeID]; w != nil; w = w.next {
		if w.takeable() && (out == nil || w.fencing > out.fencing) {
			out = w
		}
	}
	if out == nil {
		return nil, 0
	}
	return out, out.fencing
}

// HeldFor answers how many long-polls this replica holds for node.
func (h *Hub) HeldFor(nodeID string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for w := h.byNode[nodeID]; w != nil; w = w.next {
		n++
	}
	return n
}

// Sessions lists the nodes connected now, by when they connected: holding
// a long-poll, or between two polls (within presenceGrace). It also answers
// the membership version, which changes only when a node connects or
// disconnects.
func (h *Hub) Sessions(replica string) ([]LiveSession, uint64) {
	now := h.now().UTC()
	h.mu.Lock()
	out := make([]LiveSession, 0, len(h.present))
	for id, p := range h.present {
		if p.held == 0 && now.Sub(p.leftAt) > presenceGrace {
			delete(h.present, id)
			h.membership++
			continue
		}
		out = append(out, LiveSession{NodeID: id, Replica: replica, Since: p.since, RemoteAddr: p.remote})
	}
	version := h.membership
	h.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Since.Equal(out[j].Since) {
			return out[i].Since.Before(out[j].Since)
		}
		return out[i].NodeID < out[j].NodeID
	})
	return out, version
}
