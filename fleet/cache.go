package fleet

import (
	"context"
	"slices"
	"time"
)

// nodeCache keeps, per node, what the session doors need of its record
// (fencing token, retired, capabilities), so an agent's poll, heartbeat or
// report does not cost a read (at 50,000 agents re-polling every 25 s, a
// 10 s TTL read the node on every re-poll and filled the database pools).
//
// It is a memo (memo.go): every change to what it holds is announced
// (NotifyNode) in the transaction that makes it, and every announcement
// forgets the node on every replica —
//
//   - a new fencing token: enrollment (enrollTx);
//   - retirement (retireTx, also of superseded generations at invite);
//   - capabilities: a heartbeat whose list differs from the one this
//     replica holds for the node (RecordEvents, FactsUpdate.Announce);
//     enrollment writes facts too, announced with its fencing token.
//
// So while the notifier is healthy (always, in a single process) an entry
// is kept for Settings.NodeCacheMaxAge; while it is down, for
// Settings.NodeCacheTTL only, as before.
//
// Of the node's state only retired is kept, the one state a door acts on
// (and a final one). ready, lost and enrolling are not: lost → ready by a
// heartbeat or a held poll's lease renewal is not announced (it rides the
// coalesced lease batch, a statement per poll's renewal that cannot afford
// a notification), and nothing that reads the cache depends on them. Work
// is refused to a node that is not ready where it is recorded, with the
// node locked (lockReadyNode, CheckIssue reading the store); delivery
// hands a node its pending commands whatever it became since (a lost node
// that polls is ready again by that poll's renewal), as it did when the
// state was cached.
type nodeCache struct {
	*memo[cachedNode]
}

type cachedNode struct {
	retired bool
	fencing int64
	// caps are the capabilities of the node's latest facts; capsKnown is
	// false while it never reported any (DECISIONS.md §45).
	caps      []string
	capsKnown bool
}

func cachedOf(n Node) cachedNode {
	caps, known := n.Capabilities()
	return cachedNode{retired: n.State == StateRetired, fencing: n.FencingToken, caps: caps, capsKnown: known}
}

func newNodeCache(st Settings, healthy bool, now func() time.Time) *nodeCache {
	maxAge := st.NodeCacheMaxAge
	if maxAge < 0 {
		maxAge = st.NodeCacheTTL // as before: the TTL whatever the notifier
	}
	return &nodeCache{newMemo[cachedNode](maxAge, st.NodeCacheTTL, st.NodeCacheMaxNodes, healthy, now)}
}

// currentNode answers the node's fencing token, whether it is retired and
// its capabilities, from the cache when it may be relied on.
func (s *Service) currentNode(ctx context.Context, id string) (cachedNode, error) {
	if e, ok := s.cache.get(id); ok {
		s.nodeHits.Inc()
		return e, nil
	}
	if awaitWarm(ctx, s.cache.memo) {
		if e, ok := s.cache.get(id); ok {
			s.nodeHits.Inc()
			return e, nil
		}
	}
	token := s.cache.begin(id)
	n, err := s.store.Node(ctx, id)
	s.nodeReads.Inc()
	if err != nil {
		s.cache.put(id, token, cachedNode{}, false)
		if isNoRows(err) {
			return cachedNode{}, ErrNotFound
		}
		return cachedNode{}, err
	}
	e := cachedOf(n)
	s.cache.put(id, token, e, true)
	return e, nil
}

// capabilitiesChanged reports whether a heartbeat's capabilities (a fresh
// facts list; nil: the legacy reading) may differ from those stored for
// the node, so the heartbeat's write must be announced. It compares with
// the entry the session door just found or filled — no read on a
// heartbeat unless the entry went meanwhile. Unsure answers true: a
// spurious announcement costs each replica one read of the node, a missed
// one would keep the old list there for NodeCacheMaxAge.
func (s *Service) capabilitiesChanged(ctx context.Context, id string, reported []string) bool {
	if reported == nil {
		reported = LegacyCapabilities
	}
	cur, err := s.currentNode(ctx, id)
	return err != nil || !cur.capsKnown || !slices.Equal(cur.caps, reported)
}
