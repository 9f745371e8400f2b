package models

import (
	"context"
	"database/sql"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"
)

// The command path's hot statements (the claim, the issue, the settlement)
// are fixed, hand-written text. Through GORM each of them also pays its
// statement builder, its callbacks, the reflective scan and the rendering
// of the whole statement with its values for the trace recorder (even with
// logging off): a tenth of the server's CPU at saturation. queryRows and
// execRows send such a statement straight to the connection or transaction
// g is bound to, with Postgres placeholders ($1, $2, …).

// queryRows runs query on g's connection or transaction; the caller closes
// the rows. An error already on g (a kept-back insert that failed,
// later.sendFirst) is answered instead.
func queryRows(g *gorm.DB, query string, args ...any) (*sql.Rows, error) {
	if g.Error != nil {
		return nil, g.Error
	}
	return g.Statement.ConnPool.QueryContext(statementContext(g), query, args...)
}

// execRows runs a statement answering no rows on g's connection or
// transaction and answers how many rows it changed.
func execRows(g *gorm.DB, query string, args ...any) (int64, error) {
	if g.Error != nil {
		return 0, g.Error
	}
	res, err := g.Statement.ConnPool.ExecContext(statementContext(g), query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// statementCache keeps the text of hand-written statements built per
// shape (how many rows, which parts), each built once.
type statementCache[K comparable] struct{ m sync.Map }

// get answers the statement of shape k, built by build the first time.
func (c *statementCache[K]) get(k K, build func() string) string {
	if q, ok := c.m.Load(k); ok {
		return q.(string)
	}
	q := build()
	c.m.Store(k, q)
	return q
}

// insertRows inserts rows of width values each, flattened in order into
// args, with multi-row inserts of at most insertBatch rows (a fan-out's
// release may carry thousands, and SQLite binds at most 32,766 parameters
// a statement), sent around GORM: a fan-out's children, their commands
// and events, whose GORM inserts (CreateInBatches) reflected over every
// row and rendered the whole statement for the trace recorder.
func insertRows(g *gorm.DB, table, columns string, width int, args []any) error {
	postgres := onPostgres(g)
	for len(args) > 0 {
		n := rowsThatFit(len(args)/width, insertBatch, func(i int) int {
			size := 0
			for _, a := range args[i*width : (i+1)*width] {
				size += paramBytes(a)
			}
			return size
		})
		if _, err := execRows(g, insertRowsSQL(insertShape{table, columns, width, n, postgres}), args[:n*width]...); err != nil {
			return err
		}
		args = args[n*width:]
	}
	return nil
}

// statementBytes bounds the parameter bytes of one multi-row statement
// (one row alone may pass it). pgx encodes a statement's parameters, then
// its Bind message, into buffers it grows as it appends and lets go of
// after the statement, so every byte is copied and allocated several
// times over as they grow: 500 children of a fleet.configure carrying a
// 4 KiB document each made a statement of 2.5 MB, and growing such
// buffers took 18 % of the server's CPU over a 10,000-node wave
// (BENCHMARKS.md, thirty-seventh sitting). Smaller statements keep the
// buffers small enough to be reused and stay in cache, and bound the
// memory one statement holds whatever the documents' size.
const statementBytes = 256 << 10

// rowsThatFit answers how many of n rows, sized by size, one multi-row
// statement takes: at most maxRows, at least one, and no more than fit
// in statementBytes.
func rowsThatFit(n, maxRows int, size func(i int) int) int {
	n = min(n, maxRows)
	total := 0
	for i := range n {
		if total += size(i); total > statementBytes && i > 0 {
			return i
		}
	}
	return n
}

// paramBytes is about what a statement parameter takes on the wire.
func paramBytes(a any) int {
	switch v := a.(type) {
	case string:
		return len(v)
	case *string:
		if v != nil {
			return len(*v)
		}
	case []byte:
		return len(v)
	case json.RawMessage:
		return len(v)
	}
	return 8
}

// insertShape names one of insertRowsSQL's statements.
type insertShape struct {
	table, columns string
	width, rows    int
	postgres       bool
}

// insertRowsSQL is insertRows's statement of one shape, built once.
func insertRowsSQL(shape insertShape) string {
	return insertStatements.get(shape, func() string {
		row := "(" + placeholders(shape.width) + "), "
		q := "INSERT INTO " + shape.table + " (" + shape.columns + ") VALUES " +
			strings.TrimSuffix(strings.Repeat(row, shape.rows), ", ")
		if shape.postgres {
			q = numbered(q)
		}
		return q
	})
}

// insertStatements holds insertRowsSQL's statements by shape.
var insertStatements statementCache[insertShape]

// onPostgres reports whether g talks to Postgres (its placeholders are
// $1, $2, …; SQLite's are ?).
func onPostgres(g *gorm.DB) bool {
	return g.Dialector.Name() == Postgres
}

// statementContext is the context GORM would have run g's statement with.
func statementContext(g *gorm.DB) context.Context {
	if g.Statement.Context != nil {
		return g.Statement.Context
	}
	return context.Background()
}

// eachRow runs query (queryRows) and hands each row to scan; the rows are
// closed, and their error answered, before it returns, so the connection
// is free for the transaction's next statement.
func eachRow(g *gorm.DB, query string, args []any, scan func(*sql.Rows) error) error {
	rows, err := queryRows(g, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	return rows.Close()
}

// inList answers the placeholders of an IN list of ids ("?, ?, …") and
// the ids as the statement's arguments.
func inList(ids []string) (string, []any) {
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	return placeholders(len(ids)), args
}

// idsStatement answers a statement over ids and its arguments: on
// Postgres pg, which takes them as one array ($1), so its text is the same
// whatever their number; on SQLite, which has no arrays, head, an IN list
// of ids and tail.
func idsStatement(dialect, pg, head, tail string, ids []string) (string, []any) {
	if dialect == Postgres {
		return pg, []any{ids}
	}
	in, args := inList(ids)
	return head + in + tail, args
}

// numbered rewrites GORM's ? placeholders as Postgres's $1, $2, … in
// order, leaving quoted text alone. The fixed statements are rewritten
// once, when the package loads.
func numbered(query string) string {
	var b strings.Builder
	b.Grow(len(query) + 32)
	n, quote := 0, byte(0)
	for i := 0; i < len(query); i++ {
		c := query[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '?':
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// commandColumns are the commands table's columns in the order
// commandScan reads them: statements name them rather than *, so a column
// added or reordered by a migration cannot shift what lands where.
const commandColumns = `operation_id, node_id, kind, payload, payload_digest, fencing_token, issued_at, state,
	failure_code, failure_message, delivered_fencing, first_delivered_at, last_delivered_at, delivery_count, settled_at,
	payload_body`

// commandScan receives a row's commandColumns. Every column is nullable
// here: a claim that claimed nothing answers them all NULL (an outer join).
type commandScan struct {
	operationID, nodeID, kind, payload, payloadDigest, state, failureCode, failureMessage, payloadBody sql.NullString
	fencingToken, deliveredFencing, deliveryCount                                                      sql.NullInt64
	issuedAt, firstDeliveredAt, lastDeliveredAt, settledAt                                             sql.NullTime
}

// dest answers the scan destinations of commandColumns, then extra.
func (c *commandScan) dest(extra ...any) []any {
	return append([]any{&c.operationID, &c.nodeID, &c.kind, &c.payload, &c.payloadDigest, &c.fencingToken, &c.issuedAt,
		&c.state, &c.failureCode, &c.failureMessage, &c.deliveredFencing, &c.firstDeliveredAt, &c.lastDeliveredAt,
		&c.deliveryCount, &c.settledAt, &c.payloadBody}, extra...)
}

// present reports whether the row carried a command.
func (c *commandScan) present() bool { return c.operationID.Valid }

func (c *commandScan) row() Command {
	return Command{OperationID: c.operationID.String, NodeID: c.nodeID.String, Kind: c.kind.String, Payload: c.payload.String,
		PayloadDigest: c.payloadDigest.String, FencingToken: c.fencingToken.Int64, IssuedAt: c.issuedAt.Time,
		State: c.state.String, FailureCode: nullString(c.failureCode), FailureMessage: nullString(c.failureMessage),
		DeliveredFencing: nullInt64(c.deliveredFencing), FirstDeliveredAt: nullTime(c.firstDeliveredAt),
		LastDeliveredAt: nullTime(c.lastDeliveredAt), DeliveryCount: int(c.deliveryCount.Int64), SettledAt: nullTime(c.settledAt),
		PayloadBody: nullString(c.payloadBody)}
}

// nodeColumns are the nodes table's columns in the order nodeScan reads
// them.
const nodeColumns = `id, rental_id, generation, state, fencing_token, created_at, updated_at, enrolled_at,
	lease_expires_at, last_heartbeat_at, retired_at, agent_version, facts, facts_observed_at, facts_received_at,
	disk_state, disk_free_bytes, disk_observed_at, price_micros, billing_interval_seconds, eligible_classes, available_until,
	enroll_nonce_digest`

// nodeScan receives a row's nodeColumns.
type nodeScan struct {
	n                                                                Node
	enrolledAt, leaseExpiresAt, lastHeartbeatAt, retiredAt           sql.NullTime
	factsObservedAt, factsReceivedAt, diskObservedAt, availableUntil sql.NullTime
	facts                                                            sql.NullString
	diskFreeBytes, priceMicros, billingIntervalSeconds               sql.NullInt64
}

// dest answers the scan destinations of nodeColumns, then extra.
func (s *nodeScan) dest(extra ...any) []any {
	n := &s.n
	return append([]any{&n.ID, &n.RentalID, &n.Generation, &n.State, &n.FencingToken, &n.CreatedAt, &n.UpdatedAt,
		&s.enrolledAt, &s.leaseExpiresAt, &s.lastHeartbeatAt, &s.retiredAt, &n.AgentVersion, &s.facts,
		&s.factsObservedAt, &s.factsReceivedAt, &n.DiskState, &s.diskFreeBytes, &s.diskObservedAt, &s.priceMicros,
		&s.billingIntervalSeconds, &n.EligibleClasses, &s.availableUntil, &n.EnrollNonceDigest}, extra...)
}

func (s *nodeScan) row() Node {
	n := s.n
	n.EnrolledAt, n.LeaseExpiresAt = nullTime(s.enrolledAt), nullTime(s.leaseExpiresAt)
	n.LastHeartbeatAt, n.RetiredAt = nullTime(s.lastHeartbeatAt), nullTime(s.retiredAt)
	n.Facts, n.FactsObservedAt, n.FactsReceivedAt = nullString(s.facts), nullTime(s.factsObservedAt), nullTime(s.factsReceivedAt)
	n.DiskFreeBytes, n.DiskObservedAt = nullInt64(s.diskFreeBytes), nullTime(s.diskObservedAt)
	n.PriceMicros, n.BillingIntervalSeconds = nullInt64(s.priceMicros), nullInt64(s.billingIntervalSeconds)
	n.AvailableUntil = nullTime(s.availableUntil)
	return n
}

func nullString(v sql.NullString) *string {
	if !v.Valid {
		return nil
	}
	return &v.String
}

func nullInt64(v sql.NullInt64) *int64 {
	if !v.Valid {
		return nil
	}
	return &v.Int64
}

func nullTime(v sql.NullTime) *time.Time {
	if !v.Valid {
		return nil
	}
	return &v.Time
}
