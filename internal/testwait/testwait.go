// Package testwait is the one way tests wait for something to happen: poll
// a condition until it holds or a generous deadline passes. Tests never
// sleep for a fixed time and never assert on how long a wait took.
package testwait

import (
	"testing"
	"time"
)

// Patience is the deadline for a wait that has no particular one: long
// enough that a loaded machine never fails a test that would pass.
const Patience = 60 * time.Second

// The condition is polled at once, then after a pause that grows from
// firstPause to maxPause: quick for a cheap in-process check, gentle on an
// expensive one (an HTTP scrape of another process).
const (
	firstPause = time.Millisecond
	maxPause   = 50 * time.Millisecond
)

// For polls cond until it holds. If timeout passes first it fails t, naming
// what it waited for and adding the answer of each explain (a process's
// log, say) to the message.
func For(t testing.TB, what string, timeout time.Duration, cond func() bool, explain ...func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	pause := firstPause
	timer := time.NewTimer(pause)
	defer timer.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			msg := "timed out after " + timeout.String() + " waiting for " + what
			for _, e := range explain {
				msg += "\n" + e()
			}
			t.Fatal(msg)
		}
		<-timer.C
		pause = min(2*pause, maxPause)
		timer.Reset(pause)
	}
}
