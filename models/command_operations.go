package models

import (
	"context"
	"encoding/json"
	"time"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/dbtime"
	"github.com/nodeward/nodeward/ledger"
)

// A node command is also a ledger operation with the same id
// (DECISIONS.md §34). The fleet's rules move the command; the statements
// here keep its operation in step, inside the transactions delivery and
// settlement already run: a first delivery makes the operation running,
// a settlement (or a refusal by retirement or re-enrollment) ends it, each
// with its event, and on Postgres in the same statement as the event and
// the cross-replica notification, so the ledger adds no round trip to the
// command path. A command with no operation (issued by the fleet alone, as
// its own tests do) changes nothing here.

// mirrorFirstDeliveries marks the operations of commands delivered for the
// first time as running (accepted on channel long_poll). SQLite only:
// Postgres does it in ClaimDue's own statement.
func (t *fleetTx) mirrorFirstDeliveries(ctx context.Context, cmds []fleet.Command, now time.Time) error {
	var ids []string
	for _, c := range cmds {
		if c.DeliveryCount == 1 {
			ids = append(ids, c.OperationID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	now = dbtime.Norm(now)
	data := `{"channel":"long_poll"}`
	var running []string
	if err := t.db(ctx).Raw(`UPDATE operations SET state = 'running', accepted_at = ?, updated_at = ?
		WHERE id IN ? AND state = 'pending' RETURNING id`, now, now, ids).Scan(&running).Error; err != nil {
		return err
	}
	events := make([]ledger.Event, len(running))
	for i, id := range running {
		events[i] = ledger.Event{OperationID: id, Type: ledger.EventRunning, At: now, Data: json.RawMessage(data)}
	}
	if err := appendEvents(t.db(ctx), events); err != nil {
		return err
	}
	t.noteOperations(running)
	return nil
}

// mirrorCommandEnd ends the operation of a command that reached a terminal
// state (ledger.CommandEnd says how), unless the operation already ended.
func (t *fleetTx) mirrorCommandEnd(ctx context.Context, c fleet.Command) error {
	end, ok := ledger.CommandEnd(c)
	if !ok {
		return nil
	}
	at := time.Now()
	if c.SettledAt != nil {
		at = *c.SettledAt
	}
	at = dbtime.Norm(at)
	var code, msg *string
	var retryable *bool
	if end.Error != nil {
		code, msg, retryable = &end.Error.Code, &end.Error.Message, &end.Error.Retryable
	}
	data, _ := json.Marshal(map[string]any{"from": "command", "error": end.Error})
	var ended []endedOperation
	if t.dialect == Postgres {
		err := t.db(ctx).Raw(`WITH op AS (
				UPDATE operations SET state = ?, terminal = TRUE, result = ?, error_code = ?, error_message = ?,
					error_retryable = ?, finished_at = ?, updated_at = ?
				WHERE id = ? AND terminal = FALSE RETURNING id, parent_id),
			ev AS (
				INSERT INTO operation_events (operation_id, type, at, data)
				SELECT op.id, ?, ?, ? FROM op CROSS JOIN LATERAL (SELECT pg_notify(?, ? || op.id)) AS n
				RETURNING operation_id)
			SELECT op.id, op.parent_id FROM op JOIN ev ON ev.operation_id = op.id`,
			string(end.State), rawp(end.Result), code, msg, retryable, at, at, c.OperationID,
			string(end.State), at, string(data), t.store.channel, notifyPrefix(t.store.replica)).Scan(&ended).Error
		if err != nil {
			return err
		}
	} else {
		err := t.db(ctx).Raw(`UPDATE operations SET state = ?, terminal = TRUE, result = ?, error_code = ?, error_message = ?,
				error_retryable = ?, finished_at = ?, updated_at = ?
			WHERE id = ? AND terminal = FALSE RETURNING id, parent_id`,
			string(end.State), rawp(end.Result), code, msg, retryable, at, at, c.OperationID).Scan(&ended).Error
		if err != nil || len(ended) == 0 {
			return err
		}
		if err := appendEvents(t.db(ctx), []ledger.Event{{OperationID: c.OperationID, Type: string(end.State), At: at, Data: data}}); err != nil {
			return err
		}
	}
	for _, e := range ended {
		t.noteOperations([]string{e.ID})
		if e.ParentID != nil {
			*t.notes = append(*t.notes, fleet.Notification{Kind: fleet.NotifyChildEnded, NodeID: *e.ParentID})
		}
	}
	return nil
}

// endedOperation is an operation a command's end ended, and its parent.
type endedOperation struct {
	ID       string
	ParentID *string
}

// notifyPrefix is fleet.Notification.Encode's payload for an operation,
// less the id the statement appends.
func notifyPrefix(replica string) string {
	return fleet.Notification{Kind: fleet.NotifyOperation}.Encode(replica)
}

// noteOperations hands this replica's own waiters the operations that
// changed, once the transaction commits (Postgres announced them to the
// other replicas in the statement itself).
func (t *fleetTx) noteOperations(ids []string) {
	for _, id := range ids {
		*t.notes = append(*t.notes, fleet.Notification{Kind: fleet.NotifyOperation, NodeID: id})
	}
}

// WithdrawCommand cancels a pending command never delivered.
func (t *fleetTx) WithdrawCommand(ctx context.Context, operationID string, at time.Time) (bool, error) {
	res := t.db(ctx).Exec(`UPDATE commands SET state = ?, settled_at = ?
		WHERE operation_id = ? AND state = 'pending' AND delivery_count = 0`,
		string(fleet.CommandCancelled), dbtime.Norm(at), operationID)
	return res.RowsAffected == 1, res.Error
}
