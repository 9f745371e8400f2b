package state

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOwedOutputsSurviveRestart: an owed output is remembered across a
// reopen of the directory until it is delivered.
func TestOwedOutputsSurviveRestart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "st")
	s := open(t, dir, Options{})
	require.Empty(t, s.OwedOutputs())
	a, b := OwedOutput{RunID: "r", AttemptID: "2"}, OwedOutput{RunID: "r", AttemptID: "1"}
	require.NoError(t, s.OweOutput(a))
	require.NoError(t, s.OweOutput(b))
	require.NoError(t, s.OweOutput(a), "owing again changes nothing")
	require.NoError(t, s.Close())

	s = open(t, dir, Options{})
	require.Equal(t, []OwedOutput{b, a}, s.OwedOutputs())
	require.NoError(t, s.OutputDelivered(b))
	require.NoError(t, s.OutputDelivered(b), "delivering again changes nothing")
	require.NoError(t, s.Close())

	s = open(t, dir, Options{})
	require.Equal(t, []OwedOutput{a}, s.OwedOutputs())
}
