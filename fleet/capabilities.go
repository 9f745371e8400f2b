package fleet

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
)

// Agent capabilities (DECISIONS.md §45). A node's capabilities are read
// from its latest facts: the list it reported, or, for facts without a
// list (older or hand-written clients), commands.v1 and config.v1. A node
// that never reported facts (enrolling) has no known capabilities; work
// for it is accepted at submit and checked when it is delivered.

// LegacyCapabilities are what facts without a list are read as.
var LegacyCapabilities = []string{api.CapCommands, api.CapConfig}

// CapabilitiesOf answers the capabilities facts report, and whether any
// facts were reported at all (false: nothing is known yet).
func CapabilitiesOf(facts json.RawMessage) ([]string, bool) {
	if len(facts) == 0 || string(facts) == "null" {
		return nil, false
	}
	var f struct {
		Capabilities []string `json:"capabilities"`
	}
	if err := json.Unmarshal(facts, &f); err != nil {
		return nil, false
	}
	if f.Capabilities == nil {
		return slices.Clone(LegacyCapabilities), true
	}
	return f.Capabilities, true
}

// Capabilities answers the node's capabilities and whether it reported
// any facts (see CapabilitiesOf).
func (n Node) Capabilities() ([]string, bool) { return CapabilitiesOf(n.Facts) }

// CommandCapability is the capability an agent needs to run a command of
// this (agent) kind: diagnose needs diag.v1, the workload kinds
// commands.v1.
func CommandCapability(kind string) string {
	if kind == api.KindDiagnose {
		return api.CapDiag
	}
	return api.CapCommands
}

// CapabilityMissing is the refusal of work for a node whose agent does
// not report capability.
func CapabilityMissing(nodeID, capability string) error {
	return &errcode.Error{Code: errcode.CapabilityMissing, Capability: capability,
		Message: "node " + nodeID + " does not report capability " + capability + " (upgrade its agent)"}
}

// hasCapability reports whether a node with these capabilities (known
// false: never reported) may be sent work needing capability.
func hasCapability(caps []string, known bool, capability string) bool {
	return capability == "" || !known || slices.Contains(caps, capability)
}

// RequireCapability refuses (capability_missing) work needing capability
// for a node whose agent does not report it. It reads the per-node cache
// the session doors keep (a read on a miss, cached for the next). The
// cache is dropped everywhere (NotifyNode) on re-enrollment and on a
// heartbeat changing the list, on whichever replica took it (cache.go).
// The check is repeated when the work is delivered (refuseUncapable),
// from the same cache on the polling replica. A node that never reported
// facts passes (it is checked at delivery); an absent node passes too, for
// the caller's own check to refuse with its own code.
func (s *Service) RequireCapability(ctx context.Context, nodeID, capability string) error {
	if capability == "" {
		return nil
	}
	cur, err := s.currentNode(ctx, nodeID)
	if err == ErrNotFound {
		return nil
	}
	if err != nil {
		return err
	}
	if !hasCapability(cur.caps, cur.capsKnown, capability) {
		return CapabilityMissing(nodeID, capability)
	}
	return nil
}

// commandCapabilities are the capabilities some command kind needs.
var commandCapabilities = []string{api.CapCommands, api.CapDiag}

// refuseUncapable ends, before a claim, the node's pending commands whose
// capability the node does not report (a downgraded agent re-enrolled):
// refused capability_missing, so their operations fail instead of being
// delivered. It reads nothing unless the node lacks a command capability.
func refuseUncapable(ctx context.Context, tx Tx, nodeID string, cur cachedNode, now time.Time) error {
	lacking := false
	for _, c := range commandCapabilities {
		lacking = lacking || !hasCapability(cur.caps, cur.capsKnown, c)
	}
	if !lacking {
		return nil
	}
	pending, err := tx.Commands(ctx, nodeID, CommandPending, 0)
	if err != nil {
		return err
	}
	for _, p := range pending {
		need := CommandCapability(p.Kind)
		if hasCapability(cur.caps, cur.capsKnown, need) {
			continue
		}
		c, err := tx.LockCommand(ctx, p.OperationID)
		if err != nil {
			return err
		}
		if c.State != CommandPending {
			continue
		}
		c.State, c.SettledAt = CommandRefused, &now
		c.FailureCode = string(errcode.CapabilityMissing)
		c.FailureMessage = "the node's agent no longer reports capability " + need
		if err := tx.UpdateCommand(ctx, c); err != nil {
			return err
		}
	}
	return nil
}

// nodeCapable refuses a command of (agent) kind for a node, read or
// locked already, whose agent does not report the capability it needs.
func nodeCapable(n Node, kind string) error {
	need := CommandCapability(kind)
	if caps, known := n.Capabilities(); !hasCapability(caps, known, need) {
		return CapabilityMissing(n.ID, need)
	}
	return nil
}
