package ledger_test

import (
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/ledger"
)

// enrollWith enrolls boot with facts reporting caps (nil: no list, an
// older agent) and answers its session.
func (b *bundle) enrollWith(t *testing.T, boot api.Bootstrap, caps []string) fleet.Session {
	t.Helper()
	req := enrollRequest(boot, b.clock.Now(), nil)
	req.Facts.Capabilities = caps
	resp, err := b.fleet.Enroll(ctx, req)
	require.NoError(t, err)
	sess, err := b.fleet.Authenticate(ctx, resp.SessionToken, fleet.DoorAsk)
	require.NoError(t, err)
	return sess
}

// nodeWith invites and enrolls a node reporting caps.
func (b *bundle) nodeWith(t *testing.T, caps []string) (api.Bootstrap, fleet.Session) {
	t.Helper()
	rentalN++
	boot, err := b.fleet.Invite(ctx, "admin:test", fleet.Invite{RentalID: "cap-" + strconv.Itoa(rentalN) + "-" + b.replica, Generation: 1})
	require.NoError(t, err)
	return boot, b.enrollWith(t, boot, caps)
}

// sampleOperations are a valid operation of each node-targeted kind.
var sampleOperations = map[string]string{
	ledger.KindNodePrepareImage:    prepare,
	ledger.KindNodePrepareArtifact: `{"artifact_id":"a","url":"https://x.example/a","sha256":"` + zeros64 + `"}`,
	ledger.KindNodeLaunchWorkload:  launch,
	ledger.KindNodeStopWorkload:    `{"run_id":"r1","attempt_id":"a1","grace_seconds":5}`,
	ledger.KindNodeDiagnose:        `{"action":"clock"}`,
	// DECISIONS.md §32's operation, for when node.configure is served.
	"node.configure": `{"format":"app/v1","document":{"level":1}}`,
}

const zeros64 = "0000000000000000000000000000000000000000000000000000000000000000"

func requireCapabilityMissing(t *testing.T, err error, capability string) {
	t.Helper()
	requireCode(t, err, errcode.CapabilityMissing)
	var e *errcode.Error
	require.True(t, errors.As(err, &e))
	require.Equal(t, capability, e.Capability, "the refusal names the capability")
}

func TestCapabilities(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		b.start(t)
		t.Run("EachKindWithAndWithoutItsCapability", func(t *testing.T) {
			for _, k := range b.svc.Kinds().Kinds() {
				if k.Capability == "" {
					continue
				}
				payload, ok := sampleOperations[k.Name]
				require.True(t, ok, "kind %s needs %s: add a sample operation to this table", k.Name, k.Capability)
				t.Run(k.Name, func(t *testing.T) {
					_, with := b.nodeWith(t, []string{k.Capability})
					_, without := b.nodeWith(t, []string{"something_else.v1"})
					_, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: k.Name,
						Targets: []ledger.Target{{Kind: ledger.TargetNode, ID: with.NodeID}}, Operation: json.RawMessage(payload)})
					require.NoError(t, err)

					before := countOps(t, b)
					_, _, err = b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: k.Name,
						Targets: []ledger.Target{{Kind: ledger.TargetNode, ID: without.NodeID}}, Operation: json.RawMessage(payload)})
					requireCapabilityMissing(t, err, k.Capability)
					require.Equal(t, before, countOps(t, b), "nothing recorded")
				})
			}
		})
		t.Run("FactsWithoutAListReadAsCommandsAndConfig", func(t *testing.T) {
			_, legacy := b.nodeWith(t, nil)
			n, err := b.fleet.Node(ctx, legacy.NodeID)
			require.NoError(t, err)
			caps, known := n.Capabilities()
			require.True(t, known)
			require.Equal(t, []string{api.CapCommands, api.CapConfig}, caps)
			b.command(t, legacy.NodeID, ledger.KindNodePrepareImage, prepare)
		})
		t.Run("FanOutChildForANodeWithoutItFails", func(t *testing.T) {
			_, ok1 := b.nodeWith(t, []string{api.CapCommands})
			_, ok2 := b.nodeWith(t, nil)
			_, lacking := b.nodeWith(t, []string{api.CapConfig})
			parent, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindFleetCommand,
				Targets:   nodeTargets(ok1.NodeID, ok2.NodeID, lacking.NodeID),
				Operation: json.RawMessage(`{"kind":"node.prepare_image","payload":{"image":"busybox:1"}}`)})
			require.NoError(t, err)
			b.settleAll(t, parent.ID, map[string]fleet.Session{ok1.NodeID: ok1, ok2.NodeID: ok2, lacking.NodeID: lacking})
			done := b.waitState(t, parent.ID, ledger.StateFailed)
			require.Equal(t, ledger.CodeChildrenFailed, done.Error.Code)
			require.Equal(t, &ledger.Counts{Total: 3, Succeeded: 2, Failed: 1, CapabilityMissing: 1}, done.Counts)
			for _, ch := range b.children(t, parent.ID) {
				if ch.TargetID == lacking.NodeID {
					require.Equal(t, ledger.StateFailed, ch.State)
					require.Equal(t, string(errcode.CapabilityMissing), ch.Error.Code)
					_, err := b.fleet.Command(ctx, ch.ID)
					require.ErrorIs(t, err, fleet.ErrCommandNotFound, "no command was recorded for it")
				} else {
					require.Equal(t, ledger.StateSucceeded, ch.State)
				}
			}
		})
		t.Run("DowngradeBetweenSubmitAndDeliveryEndsAtDelivery", func(t *testing.T) {
			boot, sess := b.nodeWith(t, []string{api.CapCommands, api.CapConfig})
			op := b.command(t, boot.NodeID, ledger.KindNodePrepareImage, prepare)
			kept := b.command(t, boot.NodeID, ledger.KindNodeStopWorkload, `{"run_id":"r9","attempt_id":"a9","grace_seconds":5}`)
			_ = kept
			// The agent is replaced by one that does not run commands and
			// re-enrolls.
			again, err := b.fleet.Reinvite(ctx, "admin:test", boot.NodeID, nil)
			require.NoError(t, err)
			_ = sess
			downgraded := b.enrollWith(t, again, []string{api.CapConfig})
			require.Empty(t, b.poll(t, downgraded), "nothing is delivered")
			for _, id := range []string{op.ID, kept.ID} {
				done, err := b.store.Operation(ctx, id)
				require.NoError(t, err)
				require.Equal(t, ledger.StateFailed, done.State)
				require.Equal(t, string(errcode.CapabilityMissing), done.Error.Code)
				require.NotContains(t, eventTypes(t, b, id), ledger.EventRunning, "it never ran")
				c, err := b.fleet.Command(ctx, id)
				require.NoError(t, err)
				require.Zero(t, c.DeliveryCount)
			}
			require.Empty(t, b.poll(t, downgraded), "and stays undelivered")
		})
		t.Run("FleetDiagnoseOverMixedNodes", func(t *testing.T) {
			_, diag := b.nodeWith(t, []string{api.CapCommands, api.CapDiag})
			_, old := b.nodeWith(t, nil)
			parent, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindFleetDiagnose,
				Targets: nodeTargets(diag.NodeID, old.NodeID), Operation: json.RawMessage(`{"diagnose":{"action":"clock"}}`)})
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				for _, c := range b.poll(t, diag) {
					b.settle(t, diag, api.Result{OperationID: c.OperationID, Applied: true,
						Evidence: json.RawMessage(`{"action":"clock","node_time":"` + b.clock.Now().Format(time.RFC3339Nano) + `"}`)})
				}
				op, err := b.store.Operation(ctx, parent.ID)
				require.NoError(t, err)
				return op.Terminal()
			}, waitLong, tick)
			done := b.waitState(t, parent.ID, ledger.StateFailed)
			require.Equal(t, &ledger.Counts{Total: 2, Succeeded: 1, Failed: 1, CapabilityMissing: 1}, done.Counts)
		})
		t.Run("DiagnoseDowngradeEndsAtDelivery", func(t *testing.T) {
			boot, _ := b.nodeWith(t, []string{api.CapCommands, api.CapDiag})
			op := b.command(t, boot.NodeID, ledger.KindNodeDiagnose, `{"action":"agent"}`)
			launchOp := b.command(t, boot.NodeID, ledger.KindNodePrepareImage, prepare)
			again, err := b.fleet.Reinvite(ctx, "admin:test", boot.NodeID, nil)
			require.NoError(t, err)
			downgraded := b.enrollWith(t, again, nil) // an agent from before diagnostics
			cmds := b.poll(t, downgraded)
			require.Len(t, cmds, 1, "the command it can run is delivered")
			require.Equal(t, launchOp.ID, cmds[0].OperationID)
			done, err := b.store.Operation(ctx, op.ID)
			require.NoError(t, err)
			require.Equal(t, ledger.StateFailed, done.State)
			require.Equal(t, string(errcode.CapabilityMissing), done.Error.Code)
		})
		t.Run("EnrollingNodeIsNotRefusedForCapability", func(t *testing.T) {
			boot, err := b.fleet.Invite(ctx, "admin:test", fleet.Invite{RentalID: "cap-enrolling-" + b.replica, Generation: 1})
			require.NoError(t, err)
			require.NoError(t, b.fleet.RequireCapability(ctx, boot.NodeID, api.CapDiag))
		})
	})
}
