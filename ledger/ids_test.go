package ledger_test

import (
	"sort"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/ledger"
)

// TestNewIDIsTimeOrdered: ids the ledger mints are version 7 UUIDs that
// sort in the order they were minted, so rows recorded together sit side by
// side in the indexes keyed by them.
func TestNewIDIsTimeOrdered(t *testing.T) {
	ids := make([]string, 2000)
	for i := range ids {
		ids[i] = ledger.NewID()
		u, err := uuid.Parse(ids[i])
		require.NoError(t, err)
		require.Equal(t, uuid.Version(7), u.Version())
		require.True(t, ledger.ValidRequestID(ids[i]), "a minted id is a valid request id")
	}
	require.True(t, sort.StringsAreSorted(ids), "minted ids sort in minting order")
	seen := map[string]bool{}
	for _, id := range ids {
		require.False(t, seen[id], "id %s minted twice", id)
		seen[id] = true
	}
}
