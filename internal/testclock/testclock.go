// Package testclock is the clock tests inject where code takes a Now
// func: it stands still until the test moves it, so leases, expiries and
// intervals are tested without sleeping.
package testclock

import (
	"sync"
	"time"
)

// Clock is safe for concurrent use.
type Clock struct {
	mu sync.Mutex // guards t
	t  time.Time
}

// New answers a clock standing at t.
func New(t time.Time) *Clock { return &Clock{t: t} }

// Now answers the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock d forward.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}
