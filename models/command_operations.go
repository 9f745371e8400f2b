package models

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/bits"
	"sort"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/dbtime"
	"github.com/nodeward/nodeward/ledger"
)

// A node command is also a ledger operation with the same id
// (DECISIONS.md §34). The fleet's rules move the command; the statements
// here keep its operation in step, inside the transactions delivery and
// settlement already run: a first delivery makes the operation running,
// a settlement (or a refusal by retirement or re-enrollment) ends it, each
// with its event, on Postgres in the same statement, so the ledger adds no
// round trip to the command path; the other replicas hear of it after the
// commit (noteOperations). A command with no operation (issued by the
// fleet alone, as its own tests do) changes nothing here.

// mirrorFirstDeliveries marks the operations of commands delivered for the
// first time as running (accepted on channel long_poll): SQLite's claims,
// and commands inserted delivered (InsertCommands) on either dialect.
// Postgres's claims do it in ClaimDue's own statement.
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
	in, idArgs := inList(ids)
	q := `UPDATE operations SET state = 'running', accepted_at = ?, updated_at = ?
		WHERE id IN (` + in + `) AND state = 'pending' RETURNING id`
	if t.dialect == Postgres {
		q = numbered(q)
	}
	args := append([]any{now, now}, idArgs...)
	if err := eachRow(t.db(ctx), q, args, func(rows *sql.Rows) error {
		var id string
		if err := rows.Scan(&id); err != nil {
			return err
		}
		running = append(running, id)
		return nil
	}); err != nil {
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

// settleCommandSQLite writes the columns a settlement changes (SQLite's
// SettleCommands, one command at a time).
const settleCommandSQLite = `UPDATE commands SET state = ?, failure_code = ?, failure_message = ?, settled_at = ?
	WHERE operation_id = ?`

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
				SELECT op.id, ?, ?, ? FROM op
				RETURNING operation_id)
			SELECT op.id, op.parent_id FROM op JOIN ev ON ev.operation_id = op.id`,
			string(end.State), rawp(end.Result), code, msg, retryable, at, at, c.OperationID,
			string(end.State), at, string(data)).Scan(&ended).Error
		if err != nil {
			return err
		}
	} else {
		err := eachRow(t.db(ctx), endCommandOperationSQLite, []any{string(end.State), rawp(end.Result), orNull(code), orNull(msg),
			orNull(retryable), at, at, c.OperationID}, func(rows *sql.Rows) error {
			var e endedOperation
			if err := rows.Scan(&e.ID, &e.ParentID); err != nil {
				return err
			}
			ended = append(ended, e)
			return nil
		})
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

// endCommandOperationSQLite ends a command's operation on SQLite
// (mirrorCommandEnd), sent around GORM (sqlpath.go).
const endCommandOperationSQLite = `UPDATE operations SET state = ?, terminal = TRUE, result = ?, error_code = ?, error_message = ?,
		error_retryable = ?, finished_at = ?, updated_at = ?
	WHERE id = ? AND terminal = FALSE RETURNING id, parent_id`

// endedOperation is an operation a command's end ended, and its parent.
type endedOperation struct {
	ID       string
	ParentID *string
}

// noteOperations announces the operations that started or ended on the
// command path once the transaction commits: to this replica's own waiters
// at once, to the other replicas' through the announcer (Notify).
func (t *fleetTx) noteOperations(ids []string) {
	for _, id := range ids {
		_ = t.Notify(context.Background(), fleet.Notification{Kind: fleet.NotifyOperation, NodeID: id})
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
	if err := t.lockCommands(ctx, ids, out); err != nil {
		return nil, err
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
		// Fixed statements sent around GORM (sqlpath.go). GORM's Updates
		// wrote every column through reflection, a tenth of the server's
		// CPU at saturation; its Exec and Raw still ran its builder and
		// callbacks for each.
		for _, c := range cs {
			if _, err := execRows(t.db(ctx), settleCommandSQLite, string(c.State), strp(c.FailureCode), strp(c.FailureMessage),
				dbtime.NormPtr(c.SettledAt), c.OperationID); err != nil {
				return false, err
			}
			if err := t.mirrorCommandEnd(ctx, c); err != nil {
				return false, err
			}
		}
		in, idArgs := inList(ids)
		var left bool
		err := eachRow(t.db(ctx), `SELECT EXISTS (SELECT 1 FROM commands WHERE node_id = ? AND state = 'pending' AND operation_id NOT IN (`+in+`))`,
			append([]any{nodeID}, idArgs...), func(rows *sql.Rows) error { return rows.Scan(&left) })
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
	args = append(args, nodeID)
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
			SELECT op.id, op.state, op.at, op.data FROM op
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

// SettlePending implements fleet.Tx. On Postgres one statement (its
// lists as VALUES rows, sent by queryRows) locks the commands in
// (node id, operation id) order, settles those still pending on the node,
// ends their operations with their events, and answers what it found of
// each and whether the node has another pending command: the lock and the
// settlement of Settle in one round trip. The same statement settles
// several nodes' requests at once (settleSet, FleetStore.Settle). SQLite
// locks, then settles, as LockCommands and SettleCommands do.
func (t *fleetTx) SettlePending(ctx context.Context, nodeID string, at time.Time, ss []fleet.Settlement) ([]fleet.SettleFound, bool, error) {
	if len(ss) == 0 {
		return nil, false, nil
	}
	at = dbtime.Norm(at)
	if t.dialect != Postgres {
		return t.settlePendingLocked(ctx, nodeID, at, ss)
	}
	var set settleSet
	set.add(nodeID, at, ss)
	found := make([]fleet.SettleFound, 0, len(ss))
	left := false
	err := set.run(t.db(ctx), func(row settleRow) {
		found = append(found, row.SettleFound)
		left = row.pendingLeft
		t.noteEnded(row)
	})
	if err != nil {
		return nil, false, err
	}
	// As LockCommands: another lane's command was locked (the statement
	// wrote only this node's); the request runs again in the exclusive lane.
	for _, f := range found {
		if err := t.stray(f.NodeID); err != nil {
			return nil, false, err
		}
	}
	return found, left, nil
}

// noteEnded announces the operation a settlement ended, and its parent's
// child ending, once the transaction commits.
func (t *fleetTx) noteEnded(row settleRow) {
	if !row.ended {
		return
	}
	t.noteOperations([]string{row.OperationID})
	if row.parent.Valid {
		*t.notes = append(*t.notes, fleet.Notification{Kind: fleet.NotifyChildEnded, NodeID: row.parent.String})
	}
}

// settleSet is the lists of one settlement statement (Postgres): the
// settlements of one or more nodes and their operations' endings. Each
// operation id appears once in it.
type settleSet struct {
	v []any // settlePendingSQL's v rows, settleColumns values each
	n int   // settlements
	e settleEndings
}

// settleColumns is how many values each settlement of a settleSet has.
const settleColumns = 6

// add adds nodeID's settlements ss, settled at at (normalized).
func (set *settleSet) add(nodeID string, at time.Time, ss []fleet.Settlement) {
	for _, s := range ss {
		set.v = append(set.v, nodeID, s.OperationID, string(s.State), strp(s.FailureCode), strp(s.FailureMessage), at)
		set.n++
		set.e.add(s, at)
	}
}

// settleRow is one command a settlement statement found: what it found,
// whether its operation ended (and its parent), and whether the node that
// asked has another pending command.
type settleRow struct {
	fleet.SettleFound
	ended       bool
	parent      sql.NullString
	pendingLeft bool
}

// run sends the set's statement on g and hands each command found to
// each. The lists are padded with empty rows to a power of two, so a
// connection keeps few statement texts (and their generic plans) however
// the batches vary.
func (set *settleSet) run(g *gorm.DB, each func(settleRow)) error {
	n, m := paddedRows(set.n), paddedRows(len(set.e.ids))
	args := make([]any, 0, settleColumns*n+8*m)
	args = append(args, set.v...)
	args = append(args, make([]any, settleColumns*(n-set.n))...)
	e := &set.e
	for i := range e.ids {
		args = append(args, e.ids[i], e.kinds[i], e.states[i], e.results[i], e.codes[i], e.messages[i], e.retryable[i], e.data[i])
	}
	args = append(args, make([]any, 8*(m-len(e.ids)))...)
	rows, err := queryRows(g, settlePendingSQL(n, m), args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var row settleRow
		var state string
		var code sql.NullString
		if err := rows.Scan(&row.OperationID, &row.NodeID, &row.Kind, &state, &code, &row.Settled, &row.ended,
			&row.parent, &row.pendingLeft); err != nil {
			return err
		}
		row.State, row.FailureCode = fleet.CommandState(state), code.String
		each(row)
	}
	return rows.Err()
}

// paddedRows is the number of rows a list of n is sent as: the next power
// of two (0 stays 0).
func paddedRows(n int) int {
	if n <= 1 {
		return n
	}
	return 1 << bits.Len(uint(n-1))
}

// settlePendingSQL is the settlement statement for n settlements and m
// endings of their operations: for each settlement one with no kind and
// one per command kind whose ending differs from it (ledger.CommandEnd
// depends on the kind: whether a refusal is retryable); the command's kind
// picks its row. v's rows come first (settleColumns values each: the node
// that asks, the operation, its state, code, message and time), then e's
// (8 each). Rows of NULLs pad either list (settleSet.run): they match no
// command and no ending.
//
// The lists are VALUES rows, not arrays: the planner then knows how many
// rows each has, so every join is an index lookup and the statement has
// one generic plan per (n, m), prepared and kept by the connection. With
// arrays it cannot know their length: each run was planned again (0.34 ms,
// more than the run) and, with the operations table large, the ending's
// join could become a scan of it (5 ms and 2,000 buffers a settlement in a
// fan-out's profile).
//
// l locks (ordered by node, as every batched statement is, and
// materialized: the update joins what it locked, so it takes no lock out
// of order); cmd updates the commands still pending on the node that
// asked, found by key (a command's node never changes, so it is l's, and
// l read its state under the lock); op ends the operations not ended yet,
// ev records and announces each end, p reads — for each node that asked,
// in the statement's snapshot, where the settled commands are still
// pending — whether another command of that node is pending. One row per
// command found, with what l locked (the state before).
//
// Neither update restates a partial index's predicate (c.state =
// 'pending', o.terminal = FALSE): a generic plan made from statistics
// taken while few commands were pending or few operations open costs
// walking that whole index as one row, and took it over the key lookup
// (TestPostgresSettlementGenericPlan). l's state and end_state IS NULL
// (the same rows as terminal = FALSE) say the same without offering it.
func settlePendingSQL(n, m int) string {
	key := [2]int{n, m}
	return settleStatements.get(key, func() string {
		var b strings.Builder
		next := 1
		row := func(casts ...string) {
			b.WriteString("(")
			for j, cast := range casts {
				if j > 0 {
					b.WriteString(", ")
				}
				fmt.Fprintf(&b, "CAST($%d AS %s)", next, cast)
				next++
			}
			b.WriteString(")")
		}
		b.WriteString(`WITH v (node_id, operation_id, state, code, message, at) AS (VALUES `)
		for i := 0; i < n; i++ {
			if i > 0 {
				b.WriteString(", ")
			}
			row("text", "text", "text", "text", "text", "timestamptz")
		}
		b.WriteString(`),
	e (id, kind, state, result, code, message, retryable, data) AS (`)
		if m == 0 { // no ending: an empty list of the same columns
			b.WriteString(`SELECT NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::boolean, NULL::text WHERE FALSE`)
		} else {
			b.WriteString(`VALUES `)
		}
		for i := 0; i < m; i++ {
			if i > 0 {
				b.WriteString(", ")
			}
			row("text", "text", "text", "text", "text", "text", "boolean", "text")
		}
		b.WriteString(`),
	l AS MATERIALIZED (
		SELECT operation_id, node_id, kind, state, failure_code FROM commands
		WHERE operation_id IN (SELECT operation_id FROM v) ORDER BY node_id, operation_id FOR UPDATE),
	cmd AS (
		UPDATE commands c SET state = v.state, failure_code = v.code, failure_message = v.message, settled_at = v.at
		FROM l JOIN v USING (operation_id)
		WHERE c.operation_id = l.operation_id AND l.node_id = v.node_id AND l.state = 'pending'
		RETURNING c.operation_id, c.kind, v.at),
	ended AS (
		SELECT DISTINCT ON (cmd.operation_id) e.id, e.state, e.result, e.code, e.message, e.retryable, e.data, cmd.at
		FROM cmd JOIN e ON e.id = cmd.operation_id AND (e.kind = cmd.kind OR e.kind IS NULL)
		ORDER BY cmd.operation_id, e.kind IS NULL),
	op AS (
		UPDATE operations o SET state = ended.state, terminal = TRUE, result = ended.result, error_code = ended.code,
			error_message = ended.message, error_retryable = ended.retryable, finished_at = ended.at, updated_at = ended.at
		FROM ended WHERE o.id = ended.id AND o.end_state IS NULL
		RETURNING o.id, o.parent_id, ended.state, ended.data, ended.at),
	ev AS (
		INSERT INTO operation_events (operation_id, type, at, data)
		SELECT op.id, op.state, op.at, op.data FROM op
		RETURNING 1),
	p AS (
		SELECT a.node_id, EXISTS (SELECT 1 FROM commands WHERE node_id = a.node_id AND state = 'pending'
			AND operation_id NOT IN (SELECT operation_id FROM v WHERE v.node_id = a.node_id)) AS pending_left
		FROM (SELECT DISTINCT node_id FROM v WHERE node_id IS NOT NULL) a)
	SELECT l.operation_id, l.node_id, l.kind, l.state, l.failure_code, cmd.operation_id IS NOT NULL,
		op.id IS NOT NULL, op.parent_id, p.pending_left
	FROM l JOIN v USING (operation_id) JOIN p ON p.node_id = v.node_id
		LEFT JOIN cmd ON cmd.operation_id = l.operation_id LEFT JOIN op ON op.id = l.operation_id`)
		return b.String()
	})
}

// settleStatements caches settlePendingSQL's text by (n, m).
var settleStatements statementCache[[2]int]

// settleEndings are the operations' endings of SettlePending's
// settlements, as arrays of its statement.
type settleEndings struct {
	ids, states, data               []string
	kinds, results, codes, messages []*string
	retryable                       []*bool
}

// commandKinds are the kinds a command may have (fleet validates them at
// issue), each of which may end its operation its own way.
var commandKinds = sync.OnceValue(fleet.CommandKindNames)

// add adds s's endings: the one of a command of no known kind, and the
// one of each kind whose ending differs from it.
func (e *settleEndings) add(s fleet.Settlement, at time.Time) {
	c := fleet.Command{OperationID: s.OperationID, State: s.State, FailureCode: s.FailureCode,
		FailureMessage: s.FailureMessage, SettledAt: &at, Duplicate: s.Duplicate}
	def, ok := settleEnding(c, nil)
	if !ok {
		return
	}
	e.append(s.OperationID, nil, def)
	for _, k := range commandKinds() {
		c.Kind = k
		if end, _ := settleEnding(c, &def); end != def {
			e.append(s.OperationID, &k, end)
		}
	}
}

func (e *settleEndings) append(id string, kind *string, end commandEnding) {
	e.ids, e.kinds, e.states, e.data = append(e.ids, id), append(e.kinds, kind), append(e.states, end.state), append(e.data, end.data)
	e.results, e.codes = append(e.results, nullp(end.result)), append(e.codes, nullp(end.code))
	e.messages = append(e.messages, nullp(end.message))
	var retryable *bool
	if end.retryable.Valid {
		retryable = &end.retryable.Bool
	}
	e.retryable = append(e.retryable, retryable)
}

// commandEnding is ledger.CommandEnd's answer as the columns it writes
// (comparable, to tell two kinds' endings apart).
type commandEnding struct {
	state                 string
	result, code, message sql.NullString
	retryable             sql.NullBool
	data                  string
}

// settleEnding answers c's ending as columns. like, when not nil, is an
// ending already built for the same settlement (another kind): its text is
// reused where this one's is the same, sparing an encoding per kind.
func settleEnding(c fleet.Command, like *commandEnding) (commandEnding, bool) {
	end, ok := ledger.CommandEnd(c)
	if !ok {
		return commandEnding{}, false
	}
	out := commandEnding{state: string(end.State)}
	if len(end.Result) > 0 {
		if like != nil && like.result.Valid && like.result.String == string(end.Result) {
			out.result = like.result
		} else {
			out.result = sql.NullString{String: string(end.Result), Valid: true}
		}
	}
	if end.Error != nil {
		out.code = sql.NullString{String: end.Error.Code, Valid: true}
		out.message = sql.NullString{String: end.Error.Message, Valid: true}
		out.retryable = sql.NullBool{Bool: end.Error.Retryable, Valid: true}
	}
	if like != nil && like.code == out.code && like.message == out.message && like.retryable == out.retryable {
		// The data holds only the error, which is the same.
		out.data = like.data
		return out, true
	}
	// The members in name order, as the map it once was wrote them.
	data, _ := json.Marshal(struct {
		Error *ledger.Error `json:"error"`
		From  string        `json:"from"`
	}{end.Error, "command"})
	out.data = string(data)
	return out, true
}

func nullp(s sql.NullString) *string {
	if !s.Valid {
		return nil
	}
	return &s.String
}

// settlePendingLocked is SettlePending on SQLite: LockCommands, then
// SettleCommands for the node's pending ones.
func (t *fleetTx) settlePendingLocked(ctx context.Context, nodeID string, at time.Time, ss []fleet.Settlement) ([]fleet.SettleFound, bool, error) {
	ids := make([]string, len(ss))
	for i, s := range ss {
		ids[i] = s.OperationID
	}
	locked, err := t.LockCommands(ctx, ids)
	if err != nil {
		return nil, false, err
	}
	found := make([]fleet.SettleFound, 0, len(locked))
	var cs []fleet.Command
	for _, s := range ss {
		c, ok := locked[s.OperationID]
		if !ok {
			continue
		}
		f := fleet.SettleFound{OperationID: c.OperationID, NodeID: c.NodeID, Kind: c.Kind, State: c.State, FailureCode: c.FailureCode}
		if c.NodeID == nodeID && c.State == fleet.CommandPending {
			c.State, c.FailureCode, c.FailureMessage, c.SettledAt, c.Duplicate = s.State, s.FailureCode, s.FailureMessage, &at, s.Duplicate
			cs = append(cs, c)
			f.Settled = true
		}
		found = append(found, f)
	}
	left, err := t.SettleCommands(ctx, cs)
	return found, left, err
}
