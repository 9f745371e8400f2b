package models

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/ledger"
)

// The settlement's endings keep the stored text they had when each was
// encoded from a map, whichever kind's ending reuses another's.
func TestSettleEndingData(t *testing.T) {
	t.Parallel()
	at := time.Now()
	for _, s := range []fleet.Settlement{
		{OperationID: "a", State: fleet.CommandApplied},
		{OperationID: "d", State: fleet.CommandApplied, Duplicate: true},
		{OperationID: "r", State: fleet.CommandRefused, FailureCode: "image_missing", FailureMessage: "no <such> image & \"tag\""},
		{OperationID: "n", State: fleet.CommandRefused, FailureCode: "node_retired", FailureMessage: "retired"},
	} {
		var e settleEndings
		e.add(s, at)
		require.NotEmpty(t, e.ids)
		for i := range e.ids {
			c := fleet.Command{OperationID: s.OperationID, State: s.State, FailureCode: s.FailureCode,
				FailureMessage: s.FailureMessage, SettledAt: &at, Duplicate: s.Duplicate}
			if e.kinds[i] != nil {
				c.Kind = *e.kinds[i]
			}
			end, ok := ledger.CommandEnd(c)
			require.True(t, ok)
			want, err := json.Marshal(map[string]any{"from": "command", "error": end.Error})
			require.NoError(t, err)
			require.Equal(t, string(want), e.data[i], "%s kind %v", s.OperationID, c.Kind)
			require.Equal(t, string(end.State), e.states[i])
		}
	}
}
