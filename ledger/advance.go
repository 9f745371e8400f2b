package ledger

import (
	"context"
	"sync"
	"time"
)

// Coalescing a fan-out's advances. An advance locks the parent's row and
// counts all its children, so advancing once per child end costs
// O(children) per end — O(n²) for a wave of n, every one serialised on the
// parent's row lock and riding in the group commit with the agents' reports.
// Instead a parent whose children ended is advanced at most once per
// AdvanceInterval on this replica: the first end after a quiet interval
// advances it at once, the ends after it collapse into one advance at the
// interval's end. Two cases skip the wait, because each end there is a
// large share of what the parent waits on:
//
//   - children are held and the ends since the last advance free at least
//     a quarter of the max_concurrency slots (so max_concurrency 1 to 4
//     releases the next child on every end, as before: a rolling fan-out
//     never waits for the interval);
//   - the ends since the last advance are at least the children the last
//     advance left open (the parent may be done: end it now).
//
// The count of ends is this replica's only and may count a child twice (a
// notice of the fan-out itself, a cancel); a wrong guess only moves the
// advance within the interval. The periodic sweep (sweepParents) remains
// the safety net for a parent whose replica died or missed a notice.

// DefaultAdvanceInterval is the shortest time between two advances of one
// parent on one replica unless a rule above asks for one sooner. 100 ms
// bounds a 10,000-child wave to about ten advances a second — each a few
// milliseconds of counting — instead of one per end, while a fan-out ends
// at most 100 ms after its last child (well under an agent's round trip of
// poll, apply and report). 250 ms would save little more and would slow
// the releases of a wide max_concurrency by as much.
const DefaultAdvanceInterval = 100 * time.Millisecond

// advanceWorkers bounds the parents one replica advances at once: enough
// that the advances of many small fan-outs share group commits, few enough
// that they never crowd out the reports.
const advanceWorkers = 4

// advanceHint is what an advance found, for judging the next.
type advanceHint struct {
	known          bool // the parent was counted
	ended          bool // the parent has ended (or is not a fan-out)
	open           int  // children not yet ended
	held           int  // of them, held back for a slot
	maxConcurrency int
	more           bool // it released its most (ReleasePerAdvance) with slots left for more
	byLane         bool // its held children are released by their write lanes (releasedByLane)
}

// advancing is one parent's coalescing state.
type advancing struct {
	queued    bool      // an advance is asked for
	due       time.Time // when, if queued
	waited    bool      // due was put off by the interval
	running   bool      // an advance runs now
	last      time.Time // when the last advance started
	ends      int       // child-end notices since the last advance started
	hint      advanceHint
	continued bool      // queued to release the next batch of held children
	lastSeen  time.Time // for pruning idle entries
}

// urgent reports whether the ends heard since the last advance justify one
// before the interval passes.
func (p *advancing) urgent() bool {
	h := p.hint
	if !h.known || p.ends == 0 {
		return false
	}
	if h.held > 0 && p.ends*4 >= h.maxConcurrency {
		return true
	}
	return p.ends >= h.open
}

// advancer holds the parents waiting to be advanced, one entry each: a
// set, so a burst of ends for one parent collapses into one advance.
type advancer struct {
	mu      sync.Mutex
	parents map[string]*advancing
	wake    chan struct{}
}

func newAdvancer() *advancer {
	return &advancer{parents: map[string]*advancing{}, wake: make(chan struct{}, 1)}
}

func (a *advancer) signal() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// ChildEnded tells this replica that a child of parentID ended (here, or
// heard from another replica), or that the parent otherwise needs moving
// on: the parent is advanced soon, off the committing caller's path, at
// most once per AdvanceInterval unless it is urgent (see above).
func (s *Service) ChildEnded(parentID string) {
	s.metrics.FanOutChildEnds.Inc()
	now := time.Now()
	a := s.adv
	a.mu.Lock()
	p := a.parents[parentID]
	if p == nil {
		p = &advancing{}
		a.parents[parentID] = p
	}
	p.ends++
	p.lastSeen = now
	s.scheduleLocked(p, now)
	a.mu.Unlock()
	a.signal()
}

// advanceAgain queues parentID's advance at once, to release the next
// batch of its held children (advanceHint.more) after a sweep's advance.
func (s *Service) advanceAgain(parentID string) {
	a := s.adv
	a.mu.Lock()
	p := a.parents[parentID]
	if p == nil {
		p = &advancing{}
		a.parents[parentID] = p
	}
	p.lastSeen = time.Now()
	p.queued, p.due, p.waited, p.continued = true, p.lastSeen, false, true
	a.mu.Unlock()
	a.signal()
}

// scheduleLocked sets when p's next advance is due, given the ends heard:
// now when the interval since the last one has passed or it is urgent,
// else at the end of the interval. A due time already set only moves
// earlier.
func (s *Service) scheduleLocked(p *advancing, now time.Time) {
	due, waited := p.last.Add(s.settings.AdvanceInterval), true
	if !due.After(now) || p.urgent() {
		due, waited = now, false
	}
	if !p.queued || due.Before(p.due) {
		p.due, p.waited = due, waited
	}
	p.queued = true
}

// advanceLoop advances the parents whose children ended, as their due
// times come, up to advanceWorkers at once. It first advances every
// running parent once: a process killed between a fan-out's commit and
// its advance left children held (a fleet.configure's all of them, a
// fleet.command's beyond max_concurrency), their revisions and commands
// unwritten, and waiting for the first owner-lease tick delayed them for
// no reason.
func (s *Service) advanceLoop(ctx context.Context) {
	s.sweepParents(ctx)
	a := s.adv
	var wg sync.WaitGroup
	defer wg.Wait()
	slots := make(chan struct{}, advanceWorkers)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		var next time.Time
		var ready []string
		a.mu.Lock()
		for id, p := range a.parents {
			switch {
			case p.running:
			case p.queued && !p.due.After(now):
				if len(ready) < advanceWorkers {
					ready = append(ready, id)
				} else if next.IsZero() || now.Before(next) {
					next = now // more than the workers: look again soon
				}
			case p.queued:
				if next.IsZero() || p.due.Before(next) {
					next = p.due
				}
			case now.Sub(p.lastSeen) > s.settings.AdvanceInterval && now.Sub(p.last) > s.settings.AdvanceInterval:
				// Quiet for an interval: its next end advances at once
				// anyway, so the entry holds nothing worth keeping.
				delete(a.parents, id)
			}
		}
		a.mu.Unlock()
		for _, id := range ready {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			a.mu.Lock()
			p := a.parents[id]
			p.running, p.queued, p.last, p.ends = true, false, time.Now(), 0
			source := "prompt"
			switch {
			case p.continued:
				source = "continued"
			case p.waited:
				source = "interval"
			}
			// Held children and a slot likely free: this advance releases,
			// in the exclusive lane unless the children's write lanes do.
			releasing := (p.continued || p.hint.known && p.hint.held > 0) && !p.hint.byLane
			p.continued = false
			a.mu.Unlock()
			s.metrics.FanOutAdvances.WithLabelValues(source).Inc()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-slots }()
				hint, err := s.advance(ctx, id, releasing)
				if err != nil && ctx.Err() == nil {
					s.log.Error("ledger: advance fan-out", "operation_id", id, "err", err)
				}
				a.mu.Lock()
				p.running = false
				if err == nil {
					p.hint = hint
				}
				switch {
				case err == nil && hint.more:
					// Slots free and children held past what one
					// advance releases: the next batch now.
					p.queued, p.due, p.waited, p.continued = true, time.Now(), false, true
				case hint.ended && !p.queued:
					delete(a.parents, id)
				case p.queued:
					// Ends heard while it ran: with what it found, they
					// may be urgent now.
					s.scheduleLocked(p, time.Now())
				}
				a.mu.Unlock()
				a.signal()
			}()
		}
		if len(ready) > 0 {
			continue
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = max(time.Until(next), 0)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-a.wake:
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}
