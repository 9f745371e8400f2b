package models

import (
	"context"
	"encoding/json"
	"sort"
	"strings"
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

// LockCommands implements fleet.Tx: one statement locks them all, in
// operation id order.
func (t *fleetTx) LockCommands(ctx context.Context, ids []string) (map[string]fleet.Command, error) {
	out := make(map[string]fleet.Command, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	if t.dialect == Postgres {
		if err := t.lockCommands(ctx, ids, out); err != nil {
			return nil, err
		}
		return out, nil
	}
	var rows []Command
	if err := t.forUpdate(t.db(ctx)).Where("operation_id IN ?", ids).Order("operation_id").Find(&rows).Error; err != nil {
		return nil, err
	}
	for _, r := range rows {
		if err := t.stray(r.NodeID); err != nil {
			return nil, err
		}
		out[r.OperationID] = commandFromRow(r)
	}
	return out, nil
}

// SettleCommands implements fleet.Tx. On Postgres one statement (hand
// written: GORM would send a statement per row) writes every settlement,
// ends the operations, appends their events, announces them and answers
// whether the node has another pending command (in the statement's
// snapshot, where the settled ones are still pending: they are left out);
// SQLite writes them one by one inside its group-committed transaction,
// then reads.
func (t *fleetTx) SettleCommands(ctx context.Context, cs []fleet.Command) (bool, error) {
	if len(cs) == 0 {
		return false, nil
	}
	cs = append([]fleet.Command(nil), cs...)
	sort.Slice(cs, func(i, j int) bool { return cs[i].OperationID < cs[j].OperationID })
	nodeID := cs[0].NodeID
	ids := make([]string, len(cs))
	for i, c := range cs {
		ids[i] = c.OperationID
	}
	if t.dialect != Postgres {
		for _, c := range cs {
			if err := t.UpdateCommand(ctx, c); err != nil {
				return false, err
			}
		}
		var left bool
		err := t.db(ctx).Raw(`SELECT EXISTS (SELECT 1 FROM commands WHERE node_id = ? AND state = 'pending' AND operation_id NOT IN ?)`,
			nodeID, ids).Scan(&left).Error
		return left, err
	}
	var cmdVals, endVals []string
	var cmdArgs, endArgs []any
	for _, c := range cs {
		cmdVals = append(cmdVals, "(CAST(? AS text), CAST(? AS text), CAST(? AS text), CAST(? AS text), CAST(? AS timestamptz))")
		cmdArgs = append(cmdArgs, c.OperationID, string(c.State), strp(c.FailureCode), strp(c.FailureMessage), dbtime.NormPtr(c.SettledAt))
		end, ok := ledger.CommandEnd(c)
		if !ok {
			continue
		}
		at := time.Now()
		if c.SettledAt != nil {
			at = *c.SettledAt
		}
		var code, msg *string
		var retryable *bool
		if end.Error != nil {
			code, msg, retryable = &end.Error.Code, &end.Error.Message, &end.Error.Retryable
		}
		data, _ := json.Marshal(map[string]any{"from": "command", "error": end.Error})
		endVals = append(endVals, "(CAST(? AS text), CAST(? AS text), CAST(? AS text), CAST(? AS text), CAST(? AS text), CAST(? AS boolean), CAST(? AS timestamptz), CAST(? AS text))")
		endArgs = append(endArgs, c.OperationID, string(end.State), rawp(end.Result), code, msg, retryable, dbtime.Norm(at), string(data))
	}
	cmdSQL := `v (operation_id, state, code, message, settled_at) AS (VALUES ` + strings.Join(cmdVals, ", ") + `),
		cmd AS (
			UPDATE commands c SET state = v.state, failure_code = v.code, failure_message = v.message, settled_at = v.settled_at
			FROM v WHERE c.operation_id = v.operation_id RETURNING c.operation_id)`
	leftSQL := `SELECT EXISTS (SELECT 1 FROM commands WHERE node_id = ? AND state = 'pending'
			AND operation_id NOT IN (SELECT operation_id FROM v)) AS pending_left`
	if len(endVals) == 0 {
		var left []bool
		err := t.db(ctx).Raw(`WITH `+cmdSQL+`, n AS (SELECT COUNT(*) FROM cmd) `+leftSQL+` FROM n`,
			append(cmdArgs, nodeID)...).Scan(&left).Error
		return len(left) == 1 && left[0], err
	}
	args := append(cmdArgs, endArgs...)
	args = append(args, t.store.channel, notifyPrefix(t.store.replica), nodeID)
	var rows []struct {
		endedOperation `gorm:"embedded"`
		PendingLeft    bool
	}
	err := t.db(ctx).Raw(`WITH `+cmdSQL+`,
		op AS (
			UPDATE operations o SET state = e.state, terminal = TRUE, result = e.result, error_code = e.code,
				error_message = e.message, error_retryable = e.retryable, finished_at = e.at, updated_at = e.at
			FROM (VALUES `+strings.Join(endVals, ", ")+`) AS e (id, state, result, code, message, retryable, at, data)
			WHERE o.id = e.id AND o.terminal = FALSE
			RETURNING o.id, o.parent_id, e.state, e.at, e.data),
		ev AS (
			INSERT INTO operation_events (operation_id, type, at, data)
			SELECT op.id, op.state, op.at, op.data FROM op CROSS JOIN LATERAL (SELECT pg_notify(?, ? || op.id)) AS n
			RETURNING 1),
		l AS (`+leftSQL+`)
		SELECT op.id, op.parent_id, l.pending_left FROM l LEFT JOIN op ON TRUE`, args...).Scan(&rows).Error
	if err != nil {
		return false, err
	}
	left := false
	for _, r := range rows {
		left = r.PendingLeft
		if r.ID == "" {
			continue // no operation ended
		}
		t.noteOperations([]string{r.ID})
		if r.ParentID != nil {
			*t.notes = append(*t.notes, fleet.Notification{Kind: fleet.NotifyChildEnded, NodeID: *r.ParentID})
		}
	}
	return left, nil
}
