package core

import (
	"context"
	"math/rand/v2"
	"time"
)

// Clock is the agent's time source. Every schedule (renewal, heartbeats,
// backoff, Retry-After) goes through it, so tests drive time instead of
// sleeping. Durations are measured on it, never from wall-clock differences
// the server sent (DECISIONS §9).
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is the part of *time.Timer the agent uses.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
}

// RealClock is the system clock (monotonic for durations).
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// NewTimer returns a real timer.
func (RealClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time { return t.t.C }
func (t realTimer) Stop() bool          { return t.t.Stop() }

// sleep waits d on clk, or until ctx ends (returning its error).
func sleep(ctx context.Context, clk Clock, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C():
		return nil
	}
}

// backoff is exponential backoff with jitter: each failure doubles the
// ceiling up to max, the delay is drawn from [ceiling/2, ceiling) so a fleet
// that failed together does not retry together, and a success resets it.
type backoff struct {
	base, max time.Duration
	rnd       func() float64
	n         int
}

func newBackoff(base, max time.Duration, rnd func() float64) *backoff {
	if rnd == nil {
		rnd = rand.Float64
	}
	return &backoff{base: base, max: max, rnd: rnd}
}

// next is the delay before the next attempt after a failure.
func (b *backoff) next() time.Duration { return b.nextUpTo(b.max) }

// nextUpTo is next with the ceiling held to at most ceiling (still
// jittered below it).
func (b *backoff) nextUpTo(ceiling time.Duration) time.Duration {
	d := b.base
	for i := 0; i < b.n && d < b.max; i++ {
		d *= 2
	}
	d = min(d, b.max, max(ceiling, time.Millisecond))
	if b.n < 32 {
		b.n++
	}
	half := d / 2
	return half + time.Duration(b.rnd()*float64(d-half))
}

// reset forgets past failures.
func (b *backoff) reset() { b.n = 0 }

// jitter returns d scaled by a random factor in [lo, hi).
func jitter(d time.Duration, lo, hi float64, rnd func() float64) time.Duration {
	if rnd == nil {
		rnd = rand.Float64
	}
	return time.Duration(float64(d) * (lo + (hi-lo)*rnd()))
}

// pollWait is the wait to ask of one long-poll: base, less up to a fifth
// of it at random, in whole seconds (the server counts seconds). Agents
// that enrolled or reconnected together — a fleet brought up at once, or
// back after a control-plane restart — would otherwise re-poll together
// every base forever, a wave the server meets all at once; the jitter
// spreads them over a fifth of the wait within a few polls. Waits under
// 5 s are asked as they are.
func pollWait(base time.Duration, rnd func() float64) time.Duration {
	if base < 5*time.Second {
		return base
	}
	return jitter(base, 0.8, 1, rnd).Truncate(time.Second)
}
