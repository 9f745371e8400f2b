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
// The helper goroutine is new for each call (its stack comes from the
// runtime's cache and goes back to it when the call ends); the caller waits
// for it, so what f reads and writes is ordered with the caller as if f
// had run inline. A panic in f (http.ErrAbortHandler included) is raised
// again on the caller's goroutine, where its recovery is.
package offstack

import "sync"

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
// panics, Run panics with the same value.
func Run(f func()) {
	c := calls.Get().(*call)
	c.f = f
	go c.run()
	<-c.done
	p, panicked := c.p, c.panic
	c.f, c.p, c.panic = nil, nil, false
	calls.Put(c)
	if panicked {
		panic(p)
	}
}

func (c *call) run() {
	normal := false
	defer func() {
		if !normal {
			c.p, c.panic = recover(), true
		}
		c.done <- struct{}{}
	}()
	c.f()
	normal = true
}
