package fleet

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWakeStrongestWins: a held poll waits on its waiter's channel alone
// (PollWork), so its own end (deadline, context gone) arrives there
// beside the hub's wake-ups; a weaker reason never replaces a stronger one
// still unread, so the end is never lost.
func TestWakeStrongestWins(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sends []wake
		want  wake
	}{
		{"work then deadline", []wake{wakeWork, wakeDeadline}, wakeDeadline},
		{"deadline then work", []wake{wakeDeadline, wakeWork}, wakeDeadline},
		{"gone then drain", []wake{wakeGone, wakeDrain, wakeRecheck}, wakeGone},
		{"fallback then recheck", []wake{wakeFallback, wakeRecheck}, wakeRecheck},
		{"recheck then fallback", []wake{wakeRecheck, wakeFallback}, wakeRecheck},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &waiter{ch: make(chan wake, 1)}
			for _, why := range tc.sends {
				send(w, why)
			}
			require.Equal(t, tc.want, <-w.ch)
			require.Empty(t, w.ch)
		})
	}
}

// TestWakeEndNeverLostConcurrently: wake-ups racing the poll's end leave
// the end pending.
func TestWakeEndNeverLostConcurrently(t *testing.T) {
	for range 100 {
		w := &waiter{ch: make(chan wake, 1)}
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				send(w, []wake{wakeFallback, wakeWork, wakeRecheck, wakeDrain}[i%4])
			}()
		}
		wg.Add(1)
		go func() { defer wg.Done(); send(w, wakeGone) }()
		wg.Wait()
		require.Equal(t, wakeGone, <-w.ch)
	}
}
