package models

import (
	"database/sql"
	"errors"
	"slices"
	"strings"

	"gorm.io/gorm"

	"github.com/nodeward/nodeward/internal/dbtime"
	"github.com/nodeward/nodeward/ledger"
)

// A node command's operation is recorded by the statement that records
// its command (IssueToNode): ledgerTx.InsertOperation keeps a command
// kind's operation back (later), and the command's insert takes it along,
// so the submit pays one statement for the two on Postgres (DECISIONS.md
// §34) and, on both dialects, inserts an operation whose command goes
// straight to a held poll as running rather than updating it so. Whatever
// statement of the transaction comes first instead sends it on its own
// before running (fleetReader.db), as does the end of the transaction's
// work (group.go), so the order of the writes is kept.

// later is an operation whose insert waits for the transaction's next
// statement, and a node quota count that statement may answer.
type later struct {
	op     *ledger.Operation
	events []ledger.Event
	// count is the quota count the ledger expects to ask once the
	// command's insert has locked its node (ExpectNodeCount): the insert
	// answers it (issueSQL), and it holds until the next statement.
	count *nodeCount
}

// nodeCount is a per-node quota count asked ahead (ExpectNodeCount) and,
// once answered, the answer: the node's open operations, the one named
// among them.
type nodeCount struct {
	node, operation string
	except          []string
	answered        bool
	n               int
}

// expectCount asks the next issue of operation's command to node to count
// the node's open operations too.
func (l *later) expectCount(node, operation string, except []string) {
	if l != nil {
		l.count = &nodeCount{node: node, operation: operation, except: except}
	}
}

// countFor answers the count asked for the issue of operation's command,
// still unanswered, if any.
func (l *later) countFor(operation string) *nodeCount {
	if l == nil || l.count == nil || l.count.answered || l.count.operation != operation {
		return nil
	}
	return l.count
}

// counted answers the count a statement answered, when it was asked for
// this node and these exempt kinds and no statement has run since.
func (l *later) counted(node string, except []string) (int, bool) {
	if l == nil || l.count == nil || !l.count.answered || l.count.node != node || !slices.Equal(l.count.except, except) {
		return 0, false
	}
	n := l.count.n
	l.count = nil
	return n, true
}

// statementSent forgets an answered count: the statement about to run
// may change what it counted.
func (l *later) statementSent() {
	if l != nil && l.count != nil && l.count.answered {
		l.count = nil
	}
}

// laterKind reports the kinds whose Record issues their command first
// (fleet.IssueTx): nothing reads the operation's cursor before.
func laterKind(kind string) bool {
	_, ok := ledger.CommandKinds[kind]
	return ok || kind == ledger.KindNodeDiagnose
}

// hold keeps op back for the next statement; false when it cannot wait.
func (l *later) hold(op *ledger.Operation, events []ledger.Event) bool {
	if l == nil || l.op != nil || !laterKind(op.Kind) {
		return false
	}
	l.op, l.events = op, events
	return true
}

// take answers the operation kept back when it is the one with id (its
// insert then goes with the caller's statement), else nil.
func (l *later) take(id string) *later {
	if l == nil || l.op == nil || l.op.ID != id {
		return nil
	}
	out := *l
	l.op, l.events = nil, nil
	return &out
}

// send inserts the operation kept back, if any, on its own.
func (l *later) send(g *gorm.DB) error {
	if l == nil || l.op == nil {
		return nil
	}
	op, events := l.op, l.events
	l.op, l.events = nil, nil
	return insertOperation(g, op, events)
}

// insertOperation inserts op and its events and sets op's cursor: on
// Postgres in one statement, on SQLite (no writes inside a WITH) in two,
// both sent around GORM (sqlpath.go).
func insertOperation(g *gorm.DB, op *ledger.Operation, events []ledger.Event) error {
	if onPostgres(g) {
		seq, err := insertOperationStatement(g, *op, events)
		if err != nil {
			return err
		}
		op.Cursor = seq
		return nil
	}
	var seq []int64
	err := eachRow(g, insertOperationSQLite, operationValues(rowFromOperation(*op)), func(rows *sql.Rows) error {
		seq = append(seq, 0)
		return rows.Scan(&seq[len(seq)-1])
	})
	if err != nil {
		if isDuplicate(err) {
			return ledger.ErrDuplicate
		}
		return err
	}
	if len(seq) != 1 {
		return errors.New("insert operation: no row answered")
	}
	op.Cursor = seq[0]
	return appendEvents(g, events)
}

// sendFirst sends the operation kept back before a statement built on g:
// a failure is that statement's error.
func (l *later) sendFirst(g *gorm.DB) *gorm.DB {
	if err := l.send(g); err != nil {
		g = g.Session(&gorm.Session{})
		_ = g.AddError(err)
	}
	return g
}

// operationSQL is the part of a WITH that inserts an operation (as op,
// answering its seq and id) and its n events (as ev); its arguments are
// operationArgs's.
func operationSQL(n int) string {
	return `op AS (
			INSERT INTO operations (` + operationColumns + `) VALUES (` + placeholders(operationValueCount) + `)
			RETURNING seq, id)` + eventsSQL(n)
}

// operationSelectSQL is operationSQL with the operation inserted by a
// SELECT from from (a FROM clause, which may filter, with arguments of its
// own after the operation's values and before the events'): nothing is
// inserted when from answers no row.
func operationSelectSQL(n int, from string) string {
	return ` op AS (
			INSERT INTO operations (` + operationColumns + `) SELECT ` + placeholders(operationValueCount) + ` FROM ` + from + `
			RETURNING seq, id)` + eventsSQL(n)
}

// eventsSQL is the part of a WITH that inserts n events of op.
func eventsSQL(n int) string {
	if n == 0 {
		return ""
	}
	ev := make([]string, n)
	for i := range ev {
		ev[i] = "SELECT op.id, ?, CAST(? AS timestamptz), ? FROM op"
	}
	return `, ev AS (INSERT INTO operation_events (operation_id, type, at, data) ` + strings.Join(ev, " UNION ALL ") + ` RETURNING 1)`
}

// operationValueCount is how many values operationValues answers.
var operationValueCount = len(operationValues(Operation{}))

// operationArgs are operationSQL's arguments for op and its events.
func operationArgs(op ledger.Operation, events []ledger.Event) []any {
	return append(operationValues(rowFromOperation(op)), eventArgs(events)...)
}

// eventArgs are eventsSQL's arguments for events.
func eventArgs(events []ledger.Event) []any {
	var args []any
	for _, e := range events {
		data := string(e.Data)
		if data == "" {
			data = "{}"
		}
		args = append(args, e.Type, dbtime.Norm(e.At), data)
	}
	return args
}
