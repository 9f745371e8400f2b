// Package offstack runs deep one-off work on a goroutine of its own, so the
// caller's stack never grows to that work's depth.
//
// A held long-poll parks net/http's connection goroutine for up to a
// minute, and a parked goroutine keeps the stack its deepest call ever grew
// it to (the JWT check, a SQLite query through the C-transpiled driver,
// encoding and writing the answer) until a collection finds it mostly
// unused — and then only halves it, once per cycle. Running that work
// through Run leaves the connection goroutine at the depth of its own
// frames: a held poll's stack is as small as it will ever be from the
// moment it parks, without waiting for collections (BENCHMARKS.md, memory
// per held poll).
//
// The caller waits for the helper goroutine, so what f reads and writes is
// ordered with the caller as if f had run inline. A panic in f
// (http.ErrAbortHandler included) is raised again on the caller's
// goroutine, where its recovery is.
//
// Helpers are kept for the next call (up to maxIdle, the most recently
// used first): a new goroutine starts with a small stack and grows it to
// a handler's depth by doubling, copying it each time, which cost the
// server 7 % of its CPU at saturation (BENCHMARKS.md, thirtieth sitting);
// a kept helper has grown already. Only the runtime's collector shrinks a
// kept helper's stack back while it waits.
package offstack

import (
	"runtime"
	"slices"
	"sync"
	"time"
)

// maxIdle bounds the helpers kept waiting for a call.
const maxIdle = 128

// idleFor is how long a kept helper waits for a call before it ends, so
// that a burst's helpers (thousands of agents enrolling at once) do not
// keep their stacks while the fleet holds its polls quietly.
const idleFor = time.Second

// idle are the kept helpers, each waiting on its channel for a call; the
// last one in is the next one out.
var idle struct {
	sync.Mutex
	helpers []chan *call
}

// call is one Run: f, its panic, and the caller's wake-up. Calls are
// pooled: Run then allocates nothing of its own once warm.
type call struct {
	f     func()
	p     any
	panic bool
	done  chan struct{}
}

var calls = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// Run runs f on another goroutine and returns once f has returned. If f
// panics, Run panics with the same value; if f calls runtime.Goexit (as
// t.FailNow does), Run does too.
func Run(f func()) {
	c := calls.Get().(*call)
	c.f = f
	if h := takeIdle(); h != nil {
		h <- c
	} else {
		go helper(c)
	}
	<-c.done
	p, panicked := c.p, c.panic
	c.f, c.p, c.panic = nil, nil, false
	calls.Put(c)
	if panicked {
		if p == nil {
			runtime.Goexit() // f ended its goroutine: end the caller's, as inline
		}
		panic(p)
	}
}

// takeIdle answers the helper kept last, if any.
func takeIdle() chan *call {
	idle.Lock()
	defer idle.Unlock()
	n := len(idle.helpers)
	if n == 0 {
		return nil
	}
	h := idle.helpers[n-1]
	idle.helpers = idle.helpers[:n-1]
	return h
}

// helper runs c, then waits to run the calls handed to it, until there
// are maxIdle helpers waiting already or none came for idleFor.
func helper(c *call) {
	next := make(chan *call, 1)
	var timer *time.Timer
	for {
		if !c.run(next) {
			return
		}
		if timer == nil {
			timer = time.NewTimer(idleFor)
		} else {
			timer.Reset(idleFor)
		}
		select {
		case c = <-next:
			timer.Stop()
		case <-timer.C:
			if leaveIdle(next) {
				return
			}
			c = <-next // taken as the timer fired: its call is on the way
		}
	}
}

// keepIdle offers the helper waiting on next for the next call; false
// when maxIdle helpers wait already.
func keepIdle(next chan *call) bool {
	idle.Lock()
	defer idle.Unlock()
	if len(idle.helpers) >= maxIdle {
		return false
	}
	idle.helpers = append(idle.helpers, next)
	return true
}

// leaveIdle removes a kept helper no caller has taken; false when one has.
func leaveIdle(h chan *call) bool {
	idle.Lock()
	defer idle.Unlock()
	i := slices.Index(idle.helpers, h)
	if i < 0 {
		return false
	}
	idle.helpers = slices.Delete(idle.helpers, i, i+1)
	return true
}

// run runs f and answers whether its helper was kept for the next call.
// The helper is offered before the caller wakes, so a caller's next Run
// finds it. A helper whose f ended its goroutine (runtime.Goexit, as
// t.FailNow does) is not offered: it will never take another call.
func (c *call) run(next chan *call) (kept bool) {
	normal := false
	defer func() {
		if !normal {
			c.p, c.panic = recover(), true
		}
		// After Goexit recover answers nil; a panic never does (panic(nil)
		// is raised as *runtime.PanicNilError).
		kept = (normal || c.p != nil) && keepIdle(next)
		c.done <- struct{}{}
	}()
	c.f()
	normal = true
	return false
}
