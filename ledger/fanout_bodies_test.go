package ledger_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/ledger"
)

// TestFanOutLargeOperationStoredOnce: a fan-out whose children carry a
// large operation stores it once, and nothing a child is read for
// changes: its operation as submitted, the configuration or command its
// node is handed, the parent's end. Half the children are held for a
// slot, so both the recording at creation and the release by the
// parent's advance read their operations.
func TestFanOutLargeOperationStoredOnce(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		b.start(t)
		const n = 6
		pad := strings.Repeat("p", 4096) // above the size from which children share it
		stored := func(parentID string) (bodies, inRows int64) {
			require.NoError(t, b.db.Raw(`SELECT COUNT(DISTINCT body_digest), COALESCE(SUM(LENGTH(operation)), 0)
				FROM operations WHERE parent_id = ?`, parentID).Row().Scan(&bodies, &inRows))
			return bodies, inRows
		}
		t.Run("FleetConfigure", func(t *testing.T) {
			ids, sessions := b.readyNodes(t, n)
			document := `{"site":"` + b.replica + `","pad":"` + pad + `"}`
			parent, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindFleetConfigure,
				Targets:   nodeTargets(ids...),
				Operation: json.RawMessage(`{"format":"f/v1","document":` + document + `,"max_concurrency":3}`)})
			require.NoError(t, err)
			require.Eventually(t, func() bool { return len(b.children(t, parent.ID)) == n }, waitLong, tick)
			b.reportEach(t, ids, sessions, func(i int, handed *api.ConfigDelivery) (string, string) {
				require.JSONEq(t, document, string(handed.Document), ids[i])
				return api.ConfigApplied, ""
			})
			b.waitState(t, parent.ID, ledger.StateSucceeded)
			for _, ch := range b.children(t, parent.ID) {
				require.JSONEq(t, `{"format":"f/v1","document":`+document+`}`, string(ch.Operation), ch.ID)
			}
			bodies, inRows := stored(parent.ID)
			require.EqualValues(t, 1, bodies, "the children name one stored operation")
			require.Zero(t, inRows, "and hold no copy of it")
		})
		t.Run("FleetCommand", func(t *testing.T) {
			ids, sessions := b.readyNodes(t, n)
			payload := `{"run_id":"` + b.replica + `","attempt_id":"a","command":"x","env":{"PAD":"` + pad + `"}}`
			parent, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindFleetCommand,
				Targets:   nodeTargets(ids...),
				Operation: json.RawMessage(`{"kind":"node.launch_workload","payload":` + payload + `,"max_concurrency":3}`)})
			require.NoError(t, err)
			require.Eventually(t, func() bool { return len(b.children(t, parent.ID)) == n }, waitLong, tick)
			settled := map[string]bool{}
			require.Eventually(t, func() bool {
				for _, id := range ids {
					for _, c := range b.poll(t, sessions[id]) {
						require.JSONEq(t, payload, string(c.Payload), id)
						b.settle(t, sessions[id], api.Result{OperationID: c.OperationID, Applied: true})
						settled[id] = true
					}
				}
				return len(settled) == n
			}, waitLong, tick)
			b.waitState(t, parent.ID, ledger.StateSucceeded)
			for _, ch := range b.children(t, parent.ID) {
				require.JSONEq(t, payload, string(ch.Operation), ch.ID)
			}
			bodies, inRows := stored(parent.ID)
			require.EqualValues(t, 1, bodies)
			require.Zero(t, inRows)
			require.EqualValues(t, n, b.handedOut(t, parent.ID))
		})
	})
}
