package offstack

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
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
	idle.Lock()
	n := len(idle.helpers)
	idle.Unlock()
	require.Equal(t, maxIdle, n)
}
