package testwait_test

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/internal/testwait"
)

// recorder is a testing.TB that records a fatal failure instead of ending
// the test running it.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatal(args ...any) {
	r.failed = args[0].(string)
	panic(r)
}

func TestForReturnsOnceTheConditionHolds(t *testing.T) {
	var calls atomic.Int64
	testwait.For(t, "the third poll", testwait.Patience, func() bool { return calls.Add(1) == 3 })
	require.Equal(t, int64(3), calls.Load(), "polled until it held, not once more")
}

func TestForFailsNamingWhatAndExplaining(t *testing.T) {
	r := &recorder{TB: t}
	func() {
		defer func() { require.Equal(t, r, recover()) }()
		testwait.For(r, "a thing that never happens", time.Millisecond, func() bool { return false },
			func() string { return "process log: nothing" })
	}()
	require.True(t, strings.Contains(r.failed, "waiting for a thing that never happens"), r.failed)
	require.True(t, strings.Contains(r.failed, "process log: nothing"), r.failed)
}
