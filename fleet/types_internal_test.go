package fleet

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMoveToFollowsTheStateMachine: the one function that changes a node's
// state in Go makes exactly the changes CanTransition allows and leaves a
// refused node as it was.
func TestMoveToFollowsTheStateMachine(t *testing.T) {
	all := []State{StateEnrolling, StateReady, StateLost, StateRetired}
	for _, from := range all {
		for _, to := range all {
			n := Node{ID: "n", State: from}
			err := n.moveTo(to)
			if CanTransition(from, to) {
				require.NoError(t, err, "%s -> %s", from, to)
				require.Equal(t, to, n.State)
			} else {
				require.Error(t, err, "%s -> %s", from, to)
				require.Equal(t, from, n.State, "a refused change leaves the node as it was")
			}
		}
	}
}
