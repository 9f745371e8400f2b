package models

import (
	"context"
	"database/sql"
	"errors"
	"math/bits"
	"slices"
	"strings"

	"gorm.io/gorm"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/ledger"
)

// An administrator's command submit writes one statement: its operation,
// their events and the command, under the node's lock, with the node's
// quota count (issueSQL). At saturation that statement was half of
// Postgres's executor time and one round trip per command inside each
// batch. A submit that says ahead what it writes (ledger.IssueAhead) lets
// an optimistic batch record the commands of several such submits, for
// distinct nodes, in one statement before running any request
// (mergeIssues), as it settles its settlements together; each request
// then runs as before and its IssueToNode takes what that statement
// answered for it instead of running its own.
//
// Anything but the plain case — a node not ready, absent, re-enrolled
// since its poll was to be handed the command, a taken id, a request whose
// calls differ from what it announced — fails the batch, whose requests
// then run again with savepoints, each with its own statements: the one
// way failures were always kept apart. So the shared statement writes
// only what the requests would have written, in an order of their arrival
// (see mergeSettlements for why running them first is one), and nothing
// when any of them would have been refused.

// issueAhead is a submit that said ahead what its transaction writes
// (LedgerStore.TxIssuing).
type issueAhead struct {
	op      *ledger.Operation
	events  []ledger.Event
	c       fleet.Command
	counted bool
	exempt  []string
}

// aheadAnswer is what a shared statement answered for one request.
type aheadAnswer struct {
	ahead *issueAhead
	issueAnswer
}

// maxIssuesAhead bounds the submits one shared statement records.
const maxIssuesAhead = 32

// errAheadMismatch fails a request whose batch recorded its command
// ahead when the request did not go as announced, or the statement did
// not record it: the batch runs again with savepoints, the request with
// its own statements.
var errAheadMismatch = errors.New("group commit: a submit recorded ahead did not run as announced")

// TxIssuing implements ledger.Store: Tx, whose write a Postgres batch may
// make ahead, shared with other submits (mergeIssues).
func (s *LedgerStore) TxIssuing(ctx context.Context, ahead ledger.IssueAhead, fn func(ledger.Tx) error) error {
	if s.fleet.dialect != Postgres {
		return s.Tx(ctx, fn)
	}
	r := &groupReq{ctx: ctx, fn: onFleetTx(fn),
		issue: &issueAhead{op: ahead.Op, events: ahead.Events, c: ahead.Command, counted: ahead.Counted, exempt: ahead.Exempt}}
	return s.fleet.group.enqueue(ctx, r)
}

// handing reports whether c is to be recorded delivered to a held poll.
func handing(c fleet.Command) bool {
	return c.DeliveryCount == 1 && c.DeliveredFencing != nil
}

// issuedAhead is IssueToNode for a request whose batch recorded its
// command ahead: the statement's answer, when the request asks for what
// it announced, else errAheadMismatch.
func (t *fleetTx) issuedAhead(ctx context.Context, c fleet.Command, kept *later, count *nodeCount, handed bool) (fleet.Node, bool, error) {
	a := t.ahead
	t.ahead = nil
	w := a.ahead
	same := kept != nil && kept.op == w.op && c.OperationID == w.c.OperationID && c.NodeID == w.c.NodeID &&
		handed == handing(w.c) && (count != nil) == w.counted && (count == nil || slices.Equal(count.except, w.exempt))
	if !same || !a.found || !a.inserted {
		return fleet.Node{}, false, errAheadMismatch
	}
	return t.issued(ctx, c, kept, count, handed, a.issueAnswer)
}

// mergeIssues records, in an optimistic batch (no savepoints) on
// Postgres, the commands of the submits that said ahead what they write,
// one per node, in statements of at most maxIssuesAhead (a power of two,
// so their shapes stay few), in node id order as every batched statement
// locks; each request's transaction keeps its answer (fleetTx.ahead). A
// lone one is left to its request. A failure is the statement's
// requests': the batch then runs again with savepoints.
func (g *groupCommit) mergeIssues(tx *gorm.DB, batch []*groupReq, txs []*fleetTx) error {
	var rows []int
	nodes := map[string]bool{}
	for i, r := range batch {
		a := r.issue
		if a == nil || nodes[a.c.NodeID] || txs[i].strays(a.c.NodeID) {
			continue
		}
		nodes[a.c.NodeID] = true
		rows = append(rows, i)
	}
	slices.SortFunc(rows, func(i, j int) int { return strings.Compare(batch[i].issue.c.NodeID, batch[j].issue.c.NodeID) })
	for len(rows) >= 2 {
		k := min(maxIssuesAhead, 1<<(bits.Len(uint(len(rows)))-1))
		if err := g.issueTogether(tx, batch, txs, rows[:k]); err != nil {
			for _, i := range rows[:k] {
				batch[i].err = err
			}
			return err
		}
		rows = rows[k:]
	}
	return nil
}

// strays reports whether locking node's rows would stray from t's route.
func (t *fleetTx) strays(nodeID string) bool {
	return t.route != nil && laneOf(nodeID, t.route.lanes) != t.route.lane
}

// issueTogether runs issueAheadSQL for the requests of batch at idx,
// sorted by node id.
func (g *groupCommit) issueTogether(tx *gorm.DB, batch []*groupReq, txs []*fleetTx, idx []int) error {
	var opArgs, evArgs, vArgs []any
	events := 0
	for k, i := range idx {
		a := batch[i].issue
		op, evs := *a.op, a.events
		row := rowFromCommand(a.c)
		var fencing, at any
		if handing(a.c) {
			evs = runningAtDelivery(&op, evs, *a.c.FirstDeliveredAt)
			fencing, at = *a.c.DeliveredFencing, row.FirstDeliveredAt
		}
		opArgs = append(opArgs, operationValues(rowFromOperation(op))...)
		for _, e := range evs {
			evArgs = append(append(evArgs, op.ID), eventArgs([]ledger.Event{e})...)
		}
		events += len(evs)
		exempt := a.exempt
		if exempt == nil {
			exempt = []string{} // NULL would count nothing
		}
		vArgs = append(vArgs, k, row.NodeID, fencing, at, a.counted, exempt,
			row.OperationID, row.Kind, row.Payload, row.PayloadDigest, row.IssuedAt, row.State)
	}
	answers := make([]aheadAnswer, len(idx))
	err := eachRow(tx, issueAheadSQL(issueAheadShape{len(idx), events}), append(append(opArgs, evArgs...), vArgs...),
		func(rows *sql.Rows) error {
			var k int
			var a issueAnswer
			if err := rows.Scan(append([]any{&k}, a.node.dest(&a.inserted, &a.opSeq, &a.others)...)...); err != nil {
				return err
			}
			if k < 0 || k >= len(answers) {
				return errors.New("issue ahead: an answer for no request")
			}
			a.found = true
			answers[k].issueAnswer = a
			return nil
		})
	if err != nil {
		return err
	}
	for k, i := range idx {
		answers[k].ahead = batch[i].issue
		txs[i].ahead = &answers[k]
	}
	g.stats.issueStatements.Add(1)
	g.stats.issuesMerged.Add(int64(len(idx)))
	return nil
}

// issueAheadShape names one of issueAheadSQL's statements: how many
// submits, and how many events their operations have in all.
type issueAheadShape struct {
	submits, events int
}

// issueAheadStatements holds issueAheadSQL's statements by shape.
var issueAheadStatements statementCache[issueAheadShape]

// issueAheadSQL records several submits' operations, their events and
// their commands in one statement, the commands as issueSQL records one:
// under the node's lock (FOR KEY SHARE, in id order), only for a ready
// node, handed to a poll only at the poll's fencing token, with the
// node's fencing token and, when counted, the count of the node's other
// open operations taken under its quota lock in a snapshot of its own
// (migrations 00024, 00025). The operations and events are inserted
// whatever the nodes' states: a submit whose command is not inserted
// fails its batch (issuedAhead), which rolls them back.
//
// Its arguments: the operations' values (operationValues), the events'
// (eventArgs), then per submit its index, node, the poll's fencing token
// and the delivery time (NULL when not handed), whether counted, the
// exempt kinds, and the command's id, kind, payload, digest, issued_at
// and state. It answers per submit whose node exists its index, the
// locked node's nodeColumns, whether the command was inserted, the
// operation's seq and the count (NULL when not counted).
func issueAheadSQL(shape issueAheadShape) string {
	return issueAheadStatements.get(shape, func() string {
		ops := make([]string, shape.submits)
		for i := range ops {
			ops[i] = "(" + placeholders(operationValueCount) + ")"
		}
		evs := make([]string, shape.events)
		for i := range evs {
			evs[i] = "(?, ?, ?, ?)"
		}
		vs := make([]string, shape.submits)
		vs[0] = `(CAST(? AS integer), CAST(? AS text), CAST(? AS bigint), CAST(? AS timestamptz), CAST(? AS boolean),
			CAST(? AS text[]), CAST(? AS text), CAST(? AS text), CAST(? AS text), CAST(? AS text), CAST(? AS timestamptz),
			CAST(? AS text))`
		for i := 1; i < len(vs); i++ {
			vs[i] = "(" + placeholders(12) + ")"
		}
		nodeCols := strings.Split(nodeColumns, ",")
		for i, c := range nodeCols {
			nodeCols[i] = "n." + strings.TrimSpace(c)
		}
		return numbered(`WITH op AS (INSERT INTO operations (` + operationColumns + `) VALUES ` + strings.Join(ops, ", ") + `
			RETURNING seq, id),
		ev AS (INSERT INTO operation_events (operation_id, type, at, data) VALUES ` + strings.Join(evs, ", ") + ` RETURNING 1),
		v (i, node_id, fencing, delivered_at, counted, exempt, operation_id, kind, payload, payload_digest, issued_at, state)
			AS (VALUES ` + strings.Join(vs, ", ") + `),
		n AS (SELECT ` + nodeColumns + ` FROM nodes WHERE id IN (SELECT node_id FROM v) ORDER BY id FOR KEY SHARE),
		ins AS (INSERT INTO commands (operation_id, node_id, kind, payload, payload_digest, fencing_token, issued_at, state,
				delivery_count, delivered_fencing, first_delivered_at, last_delivered_at)
			SELECT v.operation_id, n.id, v.kind, v.payload, v.payload_digest, n.fencing_token, v.issued_at, v.state,
				CASE WHEN v.fencing IS NULL THEN 0 ELSE 1 END, v.fencing, v.delivered_at, v.delivered_at
			FROM v JOIN n ON n.id = v.node_id
			WHERE n.state = '` + string(fleet.StateReady) + `' AND (v.fencing IS NULL OR n.fencing_token = v.fencing)
			RETURNING operation_id)
		SELECT v.i, ` + strings.Join(nodeCols, ", ") + `,
			v.operation_id IN (SELECT operation_id FROM ins) AS inserted,
			(SELECT seq FROM op WHERE op.id = v.operation_id) AS op_seq,
			CASE WHEN v.counted THEN nodeward_open_for_node(n.id, v.operation_id, v.exempt) END AS open_others
		FROM v JOIN n ON n.id = v.node_id ORDER BY v.i`)
	})
}
