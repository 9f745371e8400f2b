package fleet_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/fleet"
)

func TestCapabilities(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		beat := func(t *testing.T, sess fleet.Session, caps []string) {
			t.Helper()
			f := facts(b.clock.Now())
			f.Capabilities = caps
			_, err := b.svc.RecordEvents(ctx, sess, []api.Event{{ID: "hb-" + randomSuffix(), Kind: api.EventHeartbeat,
				ObservedAt: b.clock.Now(), Facts: &f}})
			require.NoError(t, err)
		}
		t.Run("AHeartbeatChangesThemAtOnce", func(t *testing.T) {
			node, sess, _ := b.readyNode(t)
			err := b.svc.RequireCapability(ctx, node, api.CapDiag)
			require.Equal(t, errcode.CapabilityMissing, errcode.Of(err), "facts without a list: commands and config only")
			require.NoError(t, b.svc.RequireCapability(ctx, node, api.CapConfig))

			beat(t, sess, []string{api.CapCommands, api.CapDiag})
			require.NoError(t, b.svc.RequireCapability(ctx, node, api.CapDiag), "the cached capabilities were dropped")
			beat(t, sess, []string{api.CapCommands})
			require.Equal(t, errcode.CapabilityMissing, errcode.Of(b.svc.RequireCapability(ctx, node, api.CapDiag)))
		})
		t.Run("ADiagnoseForAnAgentReplacedWithoutItEndsAtDelivery", func(t *testing.T) {
			node, sess, _ := b.readyNode(t)
			beat(t, sess, []string{api.CapCommands, api.CapDiag})
			c, _, err := b.svc.Issue(ctx, "admin:test", fleet.IssueCommand{NodeID: node, OperationID: "diag-" + randomSuffix(),
				Kind: api.KindDiagnose, Payload: json.RawMessage(`{"action":"clock"}`)})
			require.NoError(t, err)
			beat(t, sess, []string{api.CapCommands}) // replaced in place, no re-enrollment
			cmds, err := b.svc.Poll(ctx, sess, 0, "test")
			require.NoError(t, err)
			require.Empty(t, cmds)
			got, err := b.svc.Command(ctx, c.OperationID)
			require.NoError(t, err)
			require.Equal(t, fleet.CommandRefused, got.State)
			require.Equal(t, "capability_missing", got.FailureCode)
			require.Zero(t, got.DeliveryCount)
		})
		t.Run("IssueRefusesANodeWithout", func(t *testing.T) {
			node, _, _ := b.readyNode(t)
			_, _, err := b.svc.Issue(ctx, "admin:test", fleet.IssueCommand{NodeID: node, OperationID: "diag-" + randomSuffix(),
				Kind: api.KindDiagnose, Payload: json.RawMessage(`{"action":"clock"}`)})
			require.Equal(t, errcode.CapabilityMissing, errcode.Of(err))
		})
		t.Run("MalformedCapabilitiesRefused", func(t *testing.T) {
			_, sess, _ := b.readyNode(t)
			f := facts(b.clock.Now())
			f.Capabilities = []string{"Commands v1"}
			_, err := b.svc.RecordEvents(ctx, sess, []api.Event{{ID: "hb-bad", Kind: api.EventHeartbeat, ObservedAt: b.clock.Now(), Facts: &f}})
			require.Equal(t, errcode.ValidationFailed, errcode.Of(err))
		})
	})
}
