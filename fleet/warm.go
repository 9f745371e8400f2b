package fleet

import (
	"context"
	"time"
)

// warmWait bounds how long a request missing the memo waits for a warm-up
// in flight before reading on its own.
const warmWait = 2 * time.Second

// awaitWarm waits, when a warm-up of m is in flight, until it ends (or
// warmWait passes, or ctx ends), and answers whether it waited: the
// caller then asks the memo again before reading alone. A fleet
// redialing a restarted replica arrives before the warm-up's read ends;
// waiting costs each request a moment where reading alone cost the
// database a statement per agent.
func awaitWarm[V any](ctx context.Context, m *memo[V]) bool {
	done := m.warming()
	if done == nil {
		return false
	}
	t := time.NewTimer(warmWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	case <-ctx.Done():
	}
	return true
}

// NodeAtRest is a node as a warm-up reads it (Reader.NodesAtRest): its
// record, and whether a poll at its current fencing token would find
// nothing due (DueWork.quiet).
type NodeAtRest struct {
	Node  Node
	Quiet bool
}

// defaultWarmPage is how many nodes one read of a warm-up answers: it
// bounds the warm-up's transient memory (a page of records with their
// facts).
const defaultWarmPage = 2000

// warm fills this replica's node cache and due-work memo in pages of one
// read each, where they were emptied: at start, and whenever the
// notifier comes back (a health change forgets everything). Without it
// every agent's first request after a restart or a reconnection paid a
// node read and a due-work read of its own — 10,000 agents redialing at
// once made 20,000 point reads the restarted replica answered one by one
// (issue 13's storm). A node forgotten while the warm-up runs, or read
// on its own meanwhile, keeps what that says (memo.fill).
func (s *Service) warm(ctx context.Context) (int, error) {
	cache, quiet := s.cache.beginWarm(), s.quiet.beginWarm()
	if cache {
		defer s.cache.endWarm()
	}
	if quiet {
		defer s.quiet.endWarm()
	}
	if !cache && !quiet {
		return 0, nil
	}
	limit, pageSize := max(s.settings.NodeCacheMaxNodes, s.settings.DueMemoMaxNodes), s.warmPage
	n, after := 0, ""
	for n < limit {
		page, err := s.store.NodesAtRest(ctx, after, min(pageSize, limit-n))
		if err != nil {
			return n, err
		}
		for _, r := range page {
			if cache {
				s.cache.fill(r.Node.ID, cachedOf(r.Node))
			}
			if quiet && r.Quiet {
				s.quiet.fill(r.Node.ID, dueState{fencing: r.Node.FencingToken})
			}
		}
		n += len(page)
		s.metrics.NodesWarmed.Add(float64(len(page)))
		if len(page) < pageSize {
			break
		}
		after = page[len(page)-1].Node.ID
	}
	return n, nil
}

// warmLoop warms the memos at start and each time the notifier comes
// back (rewarm), one warm-up at a time.
func (s *Service) warmLoop(ctx context.Context) {
	if s.settings.SkipWarmUp {
		return
	}
	for {
		if s.notifierOK() {
			t0 := time.Now()
			n, err := s.warm(ctx)
			if err != nil && ctx.Err() == nil {
				s.log.Warn("warming the node cache failed; agents' first requests read their nodes one by one", "err", err, "nodes", n)
			} else if err == nil {
				s.log.Debug("node cache warmed", "nodes", n, "took_ms", time.Since(t0).Milliseconds())
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-s.rewarm:
		}
	}
}
