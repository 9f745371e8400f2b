package offstack_test

import (
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/internal/offstack"
)

// deep recurses n frames of 1 KB each and answers n.
func deep(n int) int {
	var pad [1024]byte
	pad[n%1024] = byte(n)
	if n == 0 {
		return int(pad[0])
	}
	return deep(n-1) + 1 + int(pad[n%1024]) - int(byte(n))
}

// TestRunRunsElsewhereAndReturnsItsWork: f runs on another goroutine (its
// stack is not the caller's), Run returns after it, and what f wrote is
// the caller's to read.
func TestRunRunsElsewhereAndReturnsItsWork(t *testing.T) {
	var got int
	var stack []byte
	offstack.Run(func() {
		got = deep(64)
		stack = make([]byte, 4096)
		stack = stack[:runtime.Stack(stack, false)]
	})
	require.Equal(t, 64, got)
	require.Contains(t, string(stack), "offstack.(*call).run", "f ran on Run's helper goroutine")
	require.NotContains(t, string(stack), "testing.tRunner", "not under the caller's frames")
}

// TestRunRaisesFsPanicInTheCaller: a panic in f — net/http's abort too —
// is raised again by Run, where the caller's recovery is; Run stays usable.
func TestRunRaisesFsPanicInTheCaller(t *testing.T) {
	for _, v := range []any{"boom", http.ErrAbortHandler} {
		got := func() (p any) {
			defer func() { p = recover() }()
			offstack.Run(func() { panic(v) })
			return nil
		}()
		require.Equal(t, v, got)
	}
	ran := false
	offstack.Run(func() { ran = true })
	require.True(t, ran)
}

// TestRunConcurrently: many callers at once each get their own f's work
// (run with -race).
func TestRunConcurrently(t *testing.T) {
	const callers = 64
	out := make(chan int, callers)
	for i := range callers {
		go func() {
			var v int
			offstack.Run(func() { v = i * 2 })
			out <- v - i*2
		}()
	}
	for range callers {
		require.Zero(t, <-out)
	}
}

// goroutineID answers the id of the goroutine calling it.
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	return strings.Fields(string(buf))[1] // "goroutine N [running]:"
}

// TestRunKeepsItsHelper: the helper that ran a call runs the next one, so
// its stack, grown to the first call's depth, is not grown again.
func TestRunKeepsItsHelper(t *testing.T) {
	var first, second string
	offstack.Run(func() { first = goroutineID() })
	for range 100 { // the helper is kept before its caller wakes, every time
		offstack.Run(func() { second = goroutineID() })
		require.Equal(t, first, second, "the same helper")
	}
	var outer, inner string
	offstack.Run(func() {
		outer = goroutineID()
		offstack.Run(func() { inner = goroutineID() })
	})
	require.NotEqual(t, outer, inner, "a call inside a call gets a helper of its own")
}

// TestRunEndsTheCallerWhenFEndsItsGoroutine: runtime.Goexit in f (as
// t.FailNow calls) ends the caller's goroutine as it would inline, and
// the helper it ended is not handed another call.
func TestRunEndsTheCallerWhenFEndsItsGoroutine(t *testing.T) {
	ended, returned := make(chan struct{}), false
	go func() {
		defer close(ended)
		offstack.Run(runtime.Goexit)
		returned = true
	}()
	<-ended
	require.False(t, returned, "Run returned after f ended its goroutine")
	ran := make(chan bool, 1)
	go func() { offstack.Run(func() { ran <- true }) }()
	select {
	case <-ran:
	case <-time.After(time.Minute):
		t.Fatal("the next call was handed to the ended helper")
	}
}
