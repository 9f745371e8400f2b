package offstack

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/internal/testwait"
)

// TestIdleHelpersAreBounded: after more calls at once than maxIdle, at
// most maxIdle helpers stay waiting; the rest end.
func TestIdleHelpersAreBounded(t *testing.T) {
	const calls = maxIdle + 50
	var started, wg sync.WaitGroup
	release := make(chan struct{})
	started.Add(calls)
	wg.Add(calls)
	for range calls {
		go func() {
			defer wg.Done()
			Run(func() { started.Done(); <-release })
		}()
	}
	started.Wait() // every call on a helper at once
	close(release)
	wg.Wait()
	require.Equal(t, maxIdle, idleHelpers())
}

// idleHelpers answers how many helpers wait for a call.
func idleHelpers() int {
	idle.Lock()
	defer idle.Unlock()
	return len(idle.helpers)
}

// TestIdleHelpersEnd: a kept helper no call came for within idleFor ends;
// Run still runs its calls after.
func TestIdleHelpersEnd(t *testing.T) {
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() { defer wg.Done(); Run(func() {}) }()
	}
	wg.Wait()
	testwait.For(t, "the idle helpers to end", testwait.Patience, func() bool { return idleHelpers() == 0 })
	ran := false
	Run(func() { ran = true })
	require.True(t, ran)
}
