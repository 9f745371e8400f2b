package fleet

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/metrics"
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

// TestHandedCommandsReachOneAnswerOrComeBack: commands handed to a poll
// are either in its answer (taken on their wake-up, or added when it
// answers for another reason) or refused to the hander, who releases
// them — never both, never neither, however the hand-off and the answer
// race.
func TestHandedCommandsReachOneAnswerOrComeBack(t *testing.T) {
	cmd := func(id string) []Command { return []Command{{OperationID: id}} }
	t.Run("taken on its wake-up", func(t *testing.T) {
		w := &waiter{ch: make(chan wake, 1)}
		require.True(t, w.hand(cmd("a")))
		require.Equal(t, wakeHanded, <-w.ch)
		require.Len(t, w.take(), 1)
		require.False(t, w.hand(cmd("b")), "the poll has its answer")
		require.Empty(t, w.finish())
	})
	t.Run("added to an answer for another reason", func(t *testing.T) {
		w := &waiter{ch: make(chan wake, 1)}
		require.True(t, w.hand(cmd("a")))
		send(w, wakeDeadline)
		require.Equal(t, wakeDeadline, <-w.ch, "the stronger wake-up is read first")
		require.Len(t, w.finish(), 1)
	})
	t.Run("nothing to take keeps the poll open", func(t *testing.T) {
		w := &waiter{ch: make(chan wake, 1)}
		require.Empty(t, w.take())
		require.True(t, w.takeable())
		require.True(t, w.hand(cmd("a")))
	})
	t.Run("concurrently", func(t *testing.T) {
		for range 200 {
			w := &waiter{ch: make(chan wake, 1)}
			const n = 8
			var answered, refused []Command
			var mu sync.Mutex
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					c := cmd(string(rune('a' + i)))
					if !w.hand(c) {
						mu.Lock()
						refused = append(refused, c...)
						mu.Unlock()
					}
				})
			}
			answered = append(answered, w.take()...)
			wg.Wait()
			answered = append(answered, w.finish()...)
			require.Len(t, append(answered, refused...), n)
			seen := map[string]bool{}
			for _, c := range append(answered, refused...) {
				require.False(t, seen[c.OperationID], "%s twice", c.OperationID)
				seen[c.OperationID] = true
			}
		}
	})
}

// TestHubNodeWithSeveralPolls: a node's held polls (a new session's poll
// beside an old one's, two connections) are each woken, counted and
// released on their own, in whatever order they end; ending one twice
// changes nothing, and a node with none left is forgotten.
func TestHubNodeWithSeveralPolls(t *testing.T) {
	h := newHub(metrics.New(nil), time.Now)
	subscribe := func(node string, fencing int64) *waiter {
		w, err := h.subscribe(Session{NodeID: node, Fencing: fencing}, "127.0.0.1:1")
		require.NoError(t, err)
		return w
	}
	woken := func(ws ...*waiter) []bool {
		out := make([]bool, len(ws))
		for i, w := range ws {
			select {
			case <-w.ch:
				out[i] = true
			default:
			}
		}
		return out
	}
	a1, a2, a3 := subscribe("a", 1), subscribe("a", 3), subscribe("a", 2)
	b := subscribe("b", 1)
	require.Equal(t, 3, h.HeldFor("a"))
	require.Equal(t, 4, h.Held())
	held, fencing := h.held("a")
	require.Same(t, a2, held, "the newest session's poll is handed work")
	require.EqualValues(t, 3, fencing)

	h.Wake("a", "local")
	require.Equal(t, []bool{true, true, true, false}, woken(a1, a2, a3, b))

	for _, tc := range []struct {
		end      *waiter
		left     int
		newest   *waiter
		wakeable []*waiter
	}{
		{a2, 2, a3, []*waiter{a1, a3}}, // the middle of the list (the newest)
		{a2, 2, a3, []*waiter{a1, a3}}, // twice: nothing changes
		{a3, 1, a1, []*waiter{a1}},     // its head
		{a1, 0, nil, nil},              // the last
	} {
		h.unsubscribe(tc.end)
		require.Equal(t, tc.left, h.HeldFor("a"))
		require.Equal(t, tc.left+1, h.Held())
		held, _ := h.held("a")
		if tc.newest == nil {
			require.Nil(t, held)
		} else {
			require.Same(t, tc.newest, held)
		}
		h.Recheck("a", "local")
		require.Equal(t, []bool{false}, woken(b), "another node's poll is not woken")
		for _, w := range tc.wakeable {
			require.Equal(t, []bool{true}, woken(w))
		}
		require.Equal(t, []bool{false}, woken(tc.end), "an ended poll is not woken")
	}
	_, known := h.byNode["a"]
	require.False(t, known, "a node with no poll held is forgotten")
	h.WakeAll("poll")
	require.Equal(t, []bool{true}, woken(b))
}
