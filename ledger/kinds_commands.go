package ledger

import (
	"context"
	"encoding/json"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/fleet"
)

// Command kinds (family commands) are carried out by a node. Each is one
// durable command recorded in the submitting transaction under the
// operation's id (DECISIONS.md §34): it never passes through the
// dispatcher, is running once first delivered, and ends with the node's
// answer. Its operation is the command's payload.
const (
	KindNodePrepareImage    = "node.prepare_image"
	KindNodePrepareArtifact = "node.prepare_artifact"
	KindNodeLaunchWorkload  = "node.launch_workload"
	KindNodeStopWorkload    = "node.stop_workload"
)

// CommandKinds maps each command kind to the agent's command kind.
var CommandKinds = map[string]string{
	KindNodePrepareImage:    api.KindPrepareImage,
	KindNodePrepareArtifact: api.KindPrepareArtifact,
	KindNodeLaunchWorkload:  api.KindLaunchWorkload,
	KindNodeStopWorkload:    api.KindStopWorkload,
}

// CommandResult is what a command operation that succeeded records.
type CommandResult struct {
	Applied bool `json:"applied"`
	// Duplicate: the node had applied it already (a redelivery).
	Duplicate bool `json:"duplicate"`
}

// CommandEnding is how a command's end ends its operation.
type CommandEnding struct {
	State  State
	Error  *Error
	Result json.RawMessage
}

// CommandEnd answers how a command's operation ends once the command has
// (ok false while it has not, and for a withdrawal, which the ledger ends
// itself). Refusals by the node are retryable only for kinds that leave no
// effect when refused (preparing); a command refused because its node was
// retired before delivery is cancelled; one whose outcome cannot be known
// after a re-enrollment fails outcome_unknown (DECISIONS.md §1, §38).
func CommandEnd(c fleet.Command) (CommandEnding, bool) {
	switch c.State {
	case fleet.CommandApplied:
		if len(c.Evidence) > 0 {
			// A diagnose: its evidence is the result (DECISIONS.md §46).
			return CommandEnding{State: StateSucceeded, Result: c.Evidence}, true
		}
		return CommandEnding{State: StateSucceeded, Result: mustJSON(CommandResult{Applied: true, Duplicate: c.Duplicate})}, true
	case fleet.CommandRefused:
		e := &Error{Code: c.FailureCode, Message: c.FailureMessage}
		switch c.FailureCode {
		case "node_retired":
			return CommandEnding{State: StateCancelled, Error: e}, true
		case "outcome_unknown", "capability_missing":
			// capability_missing: the node's agent was downgraded between
			// submit and delivery (DECISIONS.md §45); the same node will
			// refuse it again until its agent is upgraded.
			return CommandEnding{State: StateFailed, Error: e}, true
		}
		e.Retryable = fleet.LeavesNoEffectOnFailure(c.Kind)
		return CommandEnding{State: StateFailed, Error: e}, true
	}
	return CommandEnding{}, false
}

// recordCommand records a command kind's command (fleet.IssueTx). One the
// same transaction recorded delivered to the node's held long-poll is
// accepted already (acceptedAtRecord).
func recordCommand(ctx context.Context, tx Tx, f *fleet.Service, in fleet.IssueCommand) (any, error) {
	c, err := f.IssueTx(ctx, tx.Fleet(), in)
	if err != nil || c.DeliveryCount == 0 || c.LastDeliveredAt == nil {
		return c, err
	}
	return acceptedAtRecord{at: *c.LastDeliveredAt, recorded: c}, nil
}

// acceptedAtRecord is what a Record answers when its command was delivered
// in the recording transaction: the operation is running since at, and
// the submit answers it so.
type acceptedAtRecord struct {
	at       time.Time
	recorded any
}

// commandOf is the command a command kind's operation issues: the agent's
// kind, its payload the operation, under the operation's id.
func commandOf(op Operation, agentKind string) fleet.IssueCommand {
	return fleet.IssueCommand{NodeID: op.TargetID, OperationID: op.ID, Kind: agentKind, Payload: op.Operation}
}

// CommandKindsOf are the command kinds, carried out through f.
func CommandKindsOf(f *fleet.Service) []*Kind {
	var out []*Kind
	for name, agentKind := range CommandKinds {
		out = append(out, commandKind(f, name, FamilyCommands, agentKind, func(op json.RawMessage) error {
			return fleet.ValidateCommand(agentKind, op)
		}))
	}
	return out
}

// commandKind is a kind that issues one agent command of agentKind under
// its operation's id (DECISIONS.md §34): the command kinds and
// node.diagnose. validate checks the operation (the command's payload).
// Its fan-out children are released as the fan-out records them, a few
// statements for a whole release (RecordMany), never a savepoint apiece.
func commandKind(f *fleet.Service, name, family, agentKind string, validate func(op json.RawMessage) error) *Kind {
	return &Kind{
		Name: name, Family: family, TargetKinds: nodeTarget, Capability: fleet.CommandCapability(agentKind), LevelTriggered: true,
		// The node's state (absent, retired, not ready) is checked by
		// Record, in the submitting transaction: its refusal rolls the
		// operation back, so nothing is recorded, at no extra read.
		Prepare: func(ctx context.Context, d *Draft) error {
			if _, err := oneNodeTarget(d); err != nil {
				return err
			}
			return validate(d.Operation)
		},
		Record: func(ctx context.Context, tx Tx, op Operation) (any, error) {
			return recordCommand(ctx, tx, f, commandOf(op, agentKind))
		},
		PrepareIssue: func(op Operation) (*fleet.PreparedIssue, error) {
			return f.PrepareIssue(commandOf(op, agentKind))
		},
		RecordMany: func(ctx context.Context, tx Tx, ops []Operation, admit func(ok []int) (map[int]error, error)) ([]error, error) {
			ins := make([]fleet.IssueCommand, len(ops))
			for i, op := range ops {
				ins[i] = commandOf(op, agentKind)
			}
			return f.IssueManyTx(ctx, tx.Fleet(), ins, admit)
		},
		RecordedTogether: true,
		// One payload validated and stored once a call (fleet.IssueManyTx,
		// the store's InsertCommands): recorded five children a
		// transaction at 200 KB, a fleet.command over 10,000 nodes took
		// 90 s (BENCHMARKS.md, forty-fourth sitting).
		RecordsOperationOnce: true,
	}
}
