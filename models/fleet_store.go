package models

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"slices"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/dbtime"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/secrets"
)

// FleetStore implements fleet.Store over GORM for both dialects.
type FleetStore struct {
	fleetReader
	db       *DB
	replica  string
	channel  string
	onCommit func([]fleet.Notification)
	// onBatch observes each group-committed write batch's duration
	// (SetOnBatch).
	onBatch func(time.Duration)
	group   *groupCommit
	// announcer sends the notifications that may follow their commit
	// (Postgres; nil on SQLite).
	announcer *announcer
}

var _ fleet.Store = (*FleetStore)(nil)

// NewFleetStore returns the fleet store. replica names this process in
// notifications; onCommit receives the notifications of every committed
// transaction (local delivery), and may be nil.
func NewFleetStore(db *DB, replica string, onCommit func([]fleet.Notification)) *FleetStore {
	s := &FleetStore{fleetReader: fleetReader{g: db.DB, dialect: db.Dialect}, db: db, replica: replica,
		channel: NotifyChannel(db), onCommit: onCommit}
	s.group = newGroupCommit(s, db.writeLanes)
	if db.Dialect == Postgres {
		s.announcer = newAnnouncer(db.DB, s.channel, replica)
	}
	return s
}

// SetWriteLanes replaces the number of per-node write lanes (Postgres;
// see group.go). Call it before the store's first transaction.
func (s *FleetStore) SetWriteLanes(n int) { s.group = newGroupCommit(s, n) }

// NotifyChannel is the LISTEN/NOTIFY channel of this database: one per
// schema, so test schemas sharing a server never hear each other.
func NotifyChannel(db *DB) string {
	if db.Dialect != Postgres {
		return ""
	}
	var schema string
	_ = db.Raw("SELECT current_schema()").Scan(&schema).Error
	sum := sha256.Sum256([]byte(schema))
	return "nodeward_" + hex.EncodeToString(sum[:6])
}

// SetOnCommit replaces the commit hook (wiring sets it once the hub exists).
func (s *FleetStore) SetOnCommit(fn func([]fleet.Notification)) { s.onCommit = fn }

// SetOnBatch sets what observes every group-committed write batch's
// duration: its transaction from begin to the end of its commit (or its
// rollback), the time the requests of the batch, and those queued behind
// it in its lane, waited on it. Set it before the store is used.
func (s *FleetStore) SetOnBatch(fn func(time.Duration)) { s.onBatch = fn }

// Tx runs fn in a transaction and, after it commits, hands its
// notifications to the local hook. Concurrent calls share one commit (see
// group.go), each fn inside its own savepoint so one fn's failure undoes
// that fn only: on SQLite, which has one writer, that saves an fsync per
// call; on Postgres, a commit (and its WAL flush) and the BEGIN/COMMIT
// round trips per call, and the batch's notifications go out in one
// statement.
func (s *FleetStore) Tx(ctx context.Context, fn func(fleet.Tx) error) error {
	return s.group.do(ctx, fn)
}

type fleetReader struct {
	g       *gorm.DB
	dialect string
	// batched: g carries the shared transaction's own context, and a
	// caller's context must not cancel a statement others depend on.
	batched bool
	// later is the transaction's operation kept back for its next
	// statement (later.go); nil outside a transaction.
	later *later
}

type fleetTx struct {
	fleetReader
	store *FleetStore
	// ahead is the answer of the statement that recorded this request's
	// command before it ran (issue_ahead.go), until IssueToNode takes it.
	ahead *aheadAnswer
	notes *[]fleet.Notification
	// pg collects the payloads to announce to the other replicas
	// (Postgres); the group commit sends them with the commit.
	pg *[]string
	// after collects the payloads the announcer sends once the
	// transaction has committed (Postgres; see announce.go).
	after *[]string
	// audit collects the node audit rows; the group commit writes them
	// with the batch (group.go flushAudit).
	audit *[]NodeAudit
	// route is the request's route in a per-node lane (nil in the
	// exclusive lane): locks outside it stray (group.go).
	route *txRoute
}

func notFound(err error) error {
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return fleet.ErrNoRows
	}
	return err
}

func dup(err error) error {
	if errors.Is(err, gorm.ErrDuplicatedKey) {
		return fleet.ErrDuplicate
	}
	return err
}

func (r fleetReader) db(ctx context.Context) *gorm.DB {
	r.later.statementSent()
	g := r.g
	if !r.batched {
		g = g.WithContext(ctx)
	}
	return r.later.sendFirst(g)
}

// forUpdate locks selected rows on Postgres; SQLite transactions are
// IMMEDIATE and already hold the database's write lock.
func (r fleetReader) forUpdate(q *gorm.DB) *gorm.DB {
	if r.dialect == Postgres {
		return q.Clauses(clause.Locking{Strength: "UPDATE"})
	}
	return q
}

// Node conversions.

func nodeFromRow(r Node) fleet.Node {
	n := fleet.Node{
		ID: r.ID, RentalID: r.RentalID, Generation: r.Generation, State: fleet.State(r.State),
		FencingToken: r.FencingToken, CreatedAt: dbtime.Norm(r.CreatedAt), UpdatedAt: dbtime.Norm(r.UpdatedAt),
		EnrolledAt: dbtime.NormPtr(r.EnrolledAt), LeaseExpiresAt: dbtime.NormPtr(r.LeaseExpiresAt), LastHeartbeatAt: dbtime.NormPtr(r.LastHeartbeatAt),
		RetiredAt: dbtime.NormPtr(r.RetiredAt), AgentVersion: r.AgentVersion,
		FactsObservedAt: dbtime.NormPtr(r.FactsObservedAt), FactsReceivedAt: dbtime.NormPtr(r.FactsReceivedAt),
		Disk:              fleet.Disk{State: r.DiskState, FreeBytes: r.DiskFreeBytes, ObservedAt: dbtime.NormPtr(r.DiskObservedAt)},
		PriceMicros:       r.PriceMicros,
		Purchase:          fleet.Purchase{BillingIntervalSeconds: r.BillingIntervalSeconds, AvailableUntil: dbtime.NormPtr(r.AvailableUntil)},
		EnrollNonceDigest: r.EnrollNonceDigest,
	}
	if r.Facts != nil {
		n.Facts = json.RawMessage(*r.Facts)
	}
	_ = json.Unmarshal([]byte(r.EligibleClasses), &n.Purchase.EligibleClasses)
	return n
}

func rowFromNode(n fleet.Node) Node {
	classes := n.Purchase.EligibleClasses
	if classes == nil {
		classes = []string{}
	}
	cj, _ := json.Marshal(classes)
	r := Node{
		ID: n.ID, RentalID: n.RentalID, Generation: n.Generation, State: string(n.State),
		FencingToken: n.FencingToken, CreatedAt: dbtime.Norm(n.CreatedAt), UpdatedAt: dbtime.Norm(n.UpdatedAt),
		EnrolledAt: dbtime.NormPtr(n.EnrolledAt), LeaseExpiresAt: dbtime.NormPtr(n.LeaseExpiresAt), LastHeartbeatAt: dbtime.NormPtr(n.LastHeartbeatAt),
		RetiredAt: dbtime.NormPtr(n.RetiredAt), AgentVersion: n.AgentVersion,
		FactsObservedAt: dbtime.NormPtr(n.FactsObservedAt), FactsReceivedAt: dbtime.NormPtr(n.FactsReceivedAt),
		DiskState: n.Disk.State, DiskFreeBytes: n.Disk.FreeBytes, DiskObservedAt: dbtime.NormPtr(n.Disk.ObservedAt),
		PriceMicros: n.PriceMicros, BillingIntervalSeconds: n.Purchase.BillingIntervalSeconds,
		EligibleClasses: string(cj), AvailableUntil: dbtime.NormPtr(n.Purchase.AvailableUntil),
		EnrollNonceDigest: n.EnrollNonceDigest,
	}
	if r.DiskState == "" {
		r.DiskState = fleet.DiskNeverReported
	}
	if len(n.Facts) > 0 {
		s := string(n.Facts)
		r.Facts = &s
	}
	return r
}

func (r fleetReader) Node(ctx context.Context, id string) (fleet.Node, error) {
	var row Node
	if err := r.db(ctx).Where("id = ?", id).Take(&row).Error; err != nil {
		return fleet.Node{}, notFound(err)
	}
	return nodeFromRow(row), nil
}

// InviteConflicts implements fleet.Reader: one statement for the two
// checks an invitation's preparer makes (the id taken; the rental's
// generations), where it was a read and a transaction of its own.
func (r fleetReader) InviteConflicts(ctx context.Context, id, rentalID string) ([]fleet.Node, error) {
	var rows []Node
	q := r.db(ctx).Where("rental_id = ?", rentalID)
	if id != "" {
		q = r.db(ctx).Where("id = ? OR rental_id = ?", id, rentalID)
	}
	if err := q.Order("generation, id").Find(&rows).Error; err != nil {
		return nil, err
	}
	out := make([]fleet.Node, len(rows))
	for i, row := range rows {
		out[i] = nodeFromRow(row)
	}
	return out, nil
}

func (r fleetReader) ListNodes(ctx context.Context, f fleet.NodeFilter) ([]fleet.Node, error) {
	q := r.db(ctx).Order("created_at DESC, id DESC")
	if f.State != "" {
		q = q.Where("state = ?", string(f.State))
	}
	if f.LeaseBefore != nil {
		q = q.Where("lease_expires_at < ?", dbtime.Norm(*f.LeaseBefore))
	}
	if f.BeforeCreated != nil {
		// A row-value comparison, not "created_at < ? OR (created_at = ?
		// AND id < ?)": both dialects read it as a range of the (created_at,
		// id) index, so a page halfway down the list starts at its cursor
		// instead of reading and filtering (or sorting) every newer node.
		q = q.Where("(created_at, id) < (?, ?)", dbtime.Norm(*f.BeforeCreated), f.BeforeID)
	}
	if f.Limit > 0 {
		q = q.Limit(f.Limit)
	}
	var rows []Node
	if err := q.Find(&rows).Error; err != nil {
		return nil, err
	}
	out := make([]fleet.Node, len(rows))
	for i, row := range rows {
		out[i] = nodeFromRow(row)
	}
	return out, nil
}

func (r fleetReader) ReadyPricedNodes(ctx context.Context) ([]fleet.Node, error) {
	var rows []Node
	err := r.db(ctx).Where("state = ? AND price_micros IS NOT NULL", string(fleet.StateReady)).
		Order("id").Find(&rows).Error
	if err != nil {
		return nil, err
	}
	out := make([]fleet.Node, len(rows))
	for i, row := range rows {
		out[i] = nodeFromRow(row)
	}
	return out, nil
}

func workloadFromRow(w Workload) fleet.Workload {
	return fleet.Workload{NodeID: w.NodeID, RunID: w.RunID, AttemptID: w.AttemptID, State: w.State,
		ExitCode: w.ExitCode, ObservedAt: dbtime.Norm(w.ObservedAt), ReceivedAt: dbtime.Norm(w.ReceivedAt)}
}

func (r fleetReader) Workload(ctx context.Context, nodeID, runID, attemptID string) (fleet.Workload, error) {
	var row Workload
	err := r.db(ctx).Where("node_id = ? AND run_id = ? AND attempt_id = ?", nodeID, runID, attemptID).Take(&row).Error
	if err != nil {
		return fleet.Workload{}, notFound(err)
	}
	return workloadFromRow(row), nil
}

func (r fleetReader) Workloads(ctx context.Context, nodeID string) ([]fleet.Workload, error) {
	var rows []Workload
	if err := r.db(ctx).Where("node_id = ?", nodeID).Order("run_id, attempt_id").Find(&rows).Error; err != nil {
		return nil, err
	}
	out := make([]fleet.Workload, len(rows))
	for i, row := range rows {
		out[i] = workloadFromRow(row)
	}
	return out, nil
}

func (r fleetReader) WorkloadOutput(ctx context.Context, nodeID, runID, attemptID string) (fleet.WorkloadOutput, error) {
	var row WorkloadOutput
	err := r.db(ctx).Where("node_id = ? AND run_id = ? AND attempt_id = ?", nodeID, runID, attemptID).Take(&row).Error
	if err != nil {
		return fleet.WorkloadOutput{}, notFound(err)
	}
	return fleet.WorkloadOutput{NodeID: row.NodeID, RunID: row.RunID, AttemptID: row.AttemptID,
		StdoutTail: row.StdoutTail, StderrTail: row.StderrTail, Truncated: row.Truncated, ReceivedAt: dbtime.Norm(row.ReceivedAt)}, nil
}

func commandFromRow(c Command) fleet.Command {
	out := fleet.Command{
		OperationID: c.OperationID, NodeID: c.NodeID, Kind: c.Kind, Payload: json.RawMessage(c.Payload),
		PayloadDigest: c.PayloadDigest, FencingToken: c.FencingToken, IssuedAt: dbtime.Norm(c.IssuedAt),
		State: fleet.CommandState(c.State), DeliveredFencing: c.DeliveredFencing,
		FirstDeliveredAt: dbtime.NormPtr(c.FirstDeliveredAt), LastDeliveredAt: dbtime.NormPtr(c.LastDeliveredAt),
		DeliveryCount: c.DeliveryCount, SettledAt: dbtime.NormPtr(c.SettledAt),
	}
	if c.FailureCode != nil {
		out.FailureCode = *c.FailureCode
	}
	if c.FailureMessage != nil {
		out.FailureMessage = *c.FailureMessage
	}
	return out
}

func strp(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func rowFromCommand(c fleet.Command) Command {
	return Command{
		OperationID: c.OperationID, NodeID: c.NodeID, Kind: c.Kind, Payload: string(c.Payload),
		PayloadDigest: c.PayloadDigest, FencingToken: c.FencingToken, IssuedAt: dbtime.Norm(c.IssuedAt),
		State: string(c.State), FailureCode: strp(c.FailureCode), FailureMessage: strp(c.FailureMessage),
		DeliveredFencing: c.DeliveredFencing, FirstDeliveredAt: dbtime.NormPtr(c.FirstDeliveredAt),
		LastDeliveredAt: dbtime.NormPtr(c.LastDeliveredAt), DeliveryCount: c.DeliveryCount, SettledAt: dbtime.NormPtr(c.SettledAt),
	}
}

func (r fleetReader) Command(ctx context.Context, operationID string) (fleet.Command, error) {
	var row Command
	if err := r.db(ctx).Where("operation_id = ?", operationID).Take(&row).Error; err != nil {
		return fleet.Command{}, notFound(err)
	}
	return r.command(ctx, row)
}

// nodeCommandsQuery selects a node's commands in state ("" any), oldest
// first, at most limit (0: all), narrowed by more (nil: nothing more). A
// node's commands are in one of two partial indexes (migration 00021),
// commands_pending and commands_settled; each branch names its index's
// predicate literally, so every plan (a generic one too) can prove which
// index holds them, and "any" reads both, merged.
func nodeCommandsQuery(g *gorm.DB, nodeID string, state fleet.CommandState, limit int, more func(*gorm.DB) *gorm.DB) *gorm.DB {
	return nodeCommandsOrdered(g, nodeID, state, limit, more, "issued_at, operation_id")
}

// nodeCommandsOrdered is nodeCommandsQuery in another order (of issued_at
// and operation_id, which both partial indexes scan either way).
func nodeCommandsOrdered(g *gorm.DB, nodeID string, state fleet.CommandState, limit int, more func(*gorm.DB) *gorm.DB, order string) *gorm.DB {
	branch := func(g *gorm.DB, pending bool) *gorm.DB {
		q := g.Model(&Command{}).Where("node_id = ?", nodeID)
		if more != nil {
			q = more(q)
		}
		if pending {
			q = q.Where("state = 'pending'")
		} else {
			q = q.Where("state <> 'pending'")
			if state != "" {
				q = q.Where("state = ?", string(state))
			}
		}
		q = q.Order(order)
		if limit > 0 {
			q = q.Limit(limit)
		}
		return q
	}
	switch state {
	case fleet.CommandPending:
		return branch(g, true)
	case "":
		fresh := func() *gorm.DB { return g.Session(&gorm.Session{NewDB: true}) }
		sql := "SELECT * FROM (?) AS p UNION ALL SELECT * FROM (?) AS s ORDER BY " + order
		args := []any{branch(fresh(), true), branch(fresh(), false)}
		if limit > 0 {
			sql += " LIMIT ?"
			args = append(args, limit)
		}
		return g.Raw(sql, args...)
	default:
		return branch(g, false)
	}
}

func (r fleetReader) Commands(ctx context.Context, nodeID string, state fleet.CommandState, limit int) ([]fleet.Command, error) {
	var rows []Command
	if err := nodeCommandsQuery(r.db(ctx), nodeID, state, limit, nil).Find(&rows).Error; err != nil {
		return nil, err
	}
	return r.commands(ctx, rows)
}

func (r fleetReader) CommandHistory(ctx context.Context, nodeID string, state fleet.CommandState, before *fleet.CommandKey, limit int) ([]fleet.Command, error) {
	var older func(*gorm.DB) *gorm.DB
	if before != nil {
		at := dbtime.Norm(before.IssuedAt)
		older = func(q *gorm.DB) *gorm.DB {
			return q.Where("(issued_at < ? OR (issued_at = ? AND operation_id < ?))", at, at, before.OperationID)
		}
	}
	var rows []Command
	if err := nodeCommandsOrdered(r.db(ctx), nodeID, state, limit, older, "issued_at DESC, operation_id DESC").Find(&rows).Error; err != nil {
		return nil, err
	}
	return r.commands(ctx, rows)
}

func (r fleetReader) HasDue(ctx context.Context, d fleet.Due) (bool, error) {
	var ids []string
	err := r.db(ctx).Model(&Command{}).
		Where("node_id = ? AND state = 'pending' AND (last_delivered_at IS NULL OR last_delivered_at <= ?)",
			d.NodeID, dbtime.Norm(d.RedeliverBefore)).
		Limit(1).Pluck("operation_id", &ids).Error
	return len(ids) > 0, err
}

func (r fleetReader) AppliedOperationIDs(ctx context.Context, nodeID string) ([]string, error) {
	ids := []string{}
	err := nodeCommandsQuery(r.db(ctx), nodeID, fleet.CommandApplied, 0, nil).Pluck("operation_id", &ids).Error
	return ids, err
}

func (r fleetReader) Audit(ctx context.Context, nodeID string, before int64, limit int) ([]fleet.AuditEntry, error) {
	q := r.db(ctx).Where("node_id = ?", nodeID)
	if before > 0 {
		q = q.Where("id < ?", before)
	}
	return r.audit(ctx, q, limit)
}

func (r fleetReader) RecentAudit(ctx context.Context, limit int) ([]fleet.AuditEntry, error) {
	return r.audit(ctx, r.db(ctx), limit)
}

func (r fleetReader) CountNodesByState(ctx context.Context) (map[fleet.State]int64, error) {
	// The trigger-kept counter (migration 00013), never a scan of nodes:
	// its rows are one per state plus the changes since the last fold.
	var rows []struct {
		State string
		N     int64
	}
	if err := r.db(ctx).Raw(countNodesSQL).Scan(&rows).Error; err != nil {
		return nil, err
	}
	out := map[fleet.State]int64{}
	for _, row := range rows {
		if row.N != 0 {
			out[fleet.State(row.State)] = row.N
		}
	}
	return out, nil
}

const countNodesSQL = `SELECT state, SUM(n) AS n FROM node_state_counts GROUP BY state`

func (r fleetReader) audit(ctx context.Context, q *gorm.DB, limit int) ([]fleet.AuditEntry, error) {
	var rows []NodeAudit
	q = q.Order("id DESC")
	if limit > 0 {
		q = q.Limit(limit)
	}
	if err := q.Find(&rows).Error; err != nil {
		return nil, err
	}
	out := make([]fleet.AuditEntry, len(rows))
	for i, a := range rows {
		out[i] = fleet.AuditEntry{ID: a.ID, At: dbtime.Norm(a.At), Actor: a.Actor, Action: a.Action, NodeID: a.NodeID}
		_ = json.Unmarshal([]byte(a.Detail), &out[i].Detail)
	}
	return out, nil
}

// Writes.

func (t *fleetTx) LockNode(ctx context.Context, id string) (fleet.Node, error) {
	if err := t.stray(id); err != nil {
		return fleet.Node{}, err
	}
	q := lockNodeSQLite
	if t.dialect == Postgres {
		q = lockNodePostgres
	}
	var s nodeScan
	found := false
	err := eachRow(t.db(ctx), q, []any{id}, func(rows *sql.Rows) error {
		found = true
		return rows.Scan(s.dest()...)
	})
	if err != nil {
		return fleet.Node{}, err
	}
	if !found {
		return fleet.Node{}, fleet.ErrNoRows
	}
	return nodeFromRow(s.row()), nil
}

// LockNode's statement, sent around GORM (sqlpath.go): every submit of a
// command runs it on SQLite, inside the one writer's transaction.
var (
	lockNodeSQLite   = `SELECT ` + nodeColumns + ` FROM nodes WHERE id = ?`
	lockNodePostgres = numbered(lockNodeSQLite + ` FOR UPDATE`)
)

func (t *fleetTx) LockNodes(ctx context.Context, ids []string) (map[string]fleet.Node, error) {
	if err := t.strayAny(ids); err != nil {
		return nil, err
	}
	out := make(map[string]fleet.Node, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	q, args := idsStatement(t.dialect, lockNodesPostgres, `SELECT `+nodeColumns+` FROM nodes WHERE id IN (`, `) ORDER BY id`, ids)
	var s nodeScan
	err := eachRow(t.db(ctx), q, args, func(rows *sql.Rows) error {
		if err := rows.Scan(s.dest()...); err != nil {
			return err
		}
		n := nodeFromRow(s.row())
		out[n.ID] = n
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// lockNodesPostgres is LockNodes's statement on Postgres, sent around GORM
// (sqlpath.go): every fan-out release of node commands locks its nodes
// with it, in id order (as every batched statement locks). The ids are an
// array, so the statement has one text whatever their number.
const lockNodesPostgres = `SELECT ` + nodeColumns + ` FROM nodes WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE`

func (t *fleetTx) NodesOfRental(ctx context.Context, rentalID string) ([]fleet.Node, error) {
	var rows []Node
	if err := t.forUpdate(t.db(ctx)).Where("rental_id = ?", rentalID).Order("generation").Find(&rows).Error; err != nil {
		return nil, err
	}
	out := make([]fleet.Node, len(rows))
	for i, row := range rows {
		if err := t.stray(row.ID); err != nil {
			return nil, err
		}
		out[i] = nodeFromRow(row)
	}
	return out, nil
}

func (t *fleetTx) InsertNode(ctx context.Context, n fleet.Node) error {
	if err := t.stray(n.ID); err != nil {
		return err
	}
	row := rowFromNode(n)
	return dup(t.db(ctx).Create(&row).Error)
}

func (t *fleetTx) UpdateNode(ctx context.Context, n fleet.Node) error {
	if err := t.stray(n.ID); err != nil {
		return err
	}
	row := rowFromNode(n)
	// Select("*") writes zero values too (a cleared field stays cleared).
	return t.db(ctx).Model(&Node{ID: n.ID}).Select("*").Omit("id", "created_at").Updates(&row).Error
}

func invitationFromRow(r Invitation) fleet.Invitation {
	return fleet.Invitation{ID: r.ID, NodeID: r.NodeID, Generation: r.Generation, TokenDigest: r.TokenDigest,
		IssuedAt: dbtime.Norm(r.IssuedAt), ExpiresAt: dbtime.Norm(r.ExpiresAt), State: fleet.InvitationState(r.State), RedeemedAt: dbtime.NormPtr(r.RedeemedAt)}
}

func (t *fleetTx) InsertInvitation(ctx context.Context, inv fleet.Invitation) error {
	row := Invitation{ID: inv.ID, NodeID: inv.NodeID, Generation: inv.Generation, TokenDigest: inv.TokenDigest,
		IssuedAt: dbtime.Norm(inv.IssuedAt), ExpiresAt: dbtime.Norm(inv.ExpiresAt), State: string(inv.State), RedeemedAt: dbtime.NormPtr(inv.RedeemedAt)}
	return dup(t.db(ctx).Create(&row).Error)
}

// ReadInvitation implements fleet.Reader.
func (r fleetReader) ReadInvitation(ctx context.Context, id string) (fleet.Invitation, error) {
	var row Invitation
	if err := r.db(ctx).Where("id = ?", id).Take(&row).Error; err != nil {
		return fleet.Invitation{}, notFound(err)
	}
	return invitationFromRow(row), nil
}

func (t *fleetTx) Invitation(ctx context.Context, id string) (fleet.Invitation, error) {
	var row Invitation
	if err := t.forUpdate(t.db(ctx)).Where("id = ?", id).Take(&row).Error; err != nil {
		return fleet.Invitation{}, notFound(err)
	}
	return invitationFromRow(row), nil
}

func (t *fleetTx) OutstandingInvitations(ctx context.Context, nodeID string) ([]fleet.Invitation, error) {
	var rows []Invitation
	err := t.forUpdate(t.db(ctx)).Where("node_id = ? AND state = ?", nodeID, string(fleet.InvitationOutstanding)).
		Order("issued_at DESC, id").Find(&rows).Error
	if err != nil {
		return nil, err
	}
	out := make([]fleet.Invitation, len(rows))
	for i, r := range rows {
		out[i] = invitationFromRow(r)
	}
	return out, nil
}

func (t *fleetTx) SetInvitationState(ctx context.Context, id string, from, to fleet.InvitationState, at time.Time) (bool, error) {
	updates := map[string]any{"state": string(to)}
	if to == fleet.InvitationRedeemed {
		updates["redeemed_at"] = dbtime.Norm(at)
	}
	// The state in the WHERE clause is the exactly-once guard: of two
	// concurrent redemptions only one changes the row.
	res := t.db(ctx).Model(&Invitation{}).Where("id = ? AND state = ?", id, string(from)).Updates(updates)
	return res.RowsAffected == 1, res.Error
}

// RedeemInvitation implements fleet.Tx. On Postgres it is one statement
// (an enrollment's lock, lookup and redemption were three round trips, run
// one after another inside a group commit): the node is locked in the first
// CTE, and the invitation's UPDATE joins on it, so its row lock comes
// second. The UPDATE's WHERE re-checks the invitation's newest version
// (READ COMMITTED) once a concurrent redemption has committed, so exactly
// one redemption changes the row.
func (t *fleetTx) RedeemInvitation(ctx context.Context, nodeID, invitationID, tokenDigest string, at time.Time) (fleet.Node, bool, error) {
	if err := t.stray(nodeID); err != nil {
		return fleet.Node{}, false, err
	}
	if t.dialect == Postgres {
		var rows []redeemedRow
		err := t.db(ctx).Raw(`WITH n AS (SELECT * FROM nodes WHERE id = ? FOR UPDATE),
			inv AS (
				UPDATE invitations SET state = ?, redeemed_at = ?
				WHERE id = ? AND node_id IN (SELECT id FROM n) AND token_digest = ? AND state = ?
				RETURNING id)
			SELECT n.*, EXISTS (SELECT 1 FROM inv) AS redeemed FROM n`,
			nodeID, string(fleet.InvitationRedeemed), dbtime.Norm(at), invitationID, tokenDigest,
			string(fleet.InvitationOutstanding)).Scan(&rows).Error
		if err != nil {
			return fleet.Node{}, false, err
		}
		if len(rows) == 0 {
			return fleet.Node{}, false, fleet.ErrNoRows
		}
		return nodeFromRow(rows[0].Node), rows[0].Redeemed, nil
	}
	// SQLite: the transaction holds the database's write lock already.
	n, err := t.LockNode(ctx, nodeID)
	if err != nil {
		return fleet.Node{}, false, err
	}
	res := t.db(ctx).Model(&Invitation{}).
		Where("id = ? AND node_id = ? AND token_digest = ? AND state = ?", invitationID, nodeID, tokenDigest, string(fleet.InvitationOutstanding)).
		Updates(map[string]any{"state": string(fleet.InvitationRedeemed), "redeemed_at": dbtime.Norm(at)})
	return n, res.RowsAffected == 1, res.Error
}

// redeemedRow is a locked node and whether its invitation was redeemed.
type redeemedRow struct {
	Node     `gorm:"embedded"`
	Redeemed bool
}

func (t *fleetTx) RecordEventIDs(ctx context.Context, nodeID string, ids []string, at time.Time) (map[string]bool, error) {
	fresh := make(map[string]bool, len(ids))
	for _, id := range ids {
		res := t.db(ctx).Clauses(clause.OnConflict{DoNothing: true}).
			Create(&NodeEvent{NodeID: nodeID, EventID: id, ReceivedAt: dbtime.Norm(at)})
		if res.Error != nil {
			return nil, res.Error
		}
		if res.RowsAffected == 1 {
			fresh[id] = true
		}
	}
	return fresh, nil
}

// workloadRank orders states of one attempt, for observations stamped with
// the same time.
var workloadRank = map[string]int{"created": 1, "running": 2, "exited": 3}

func (t *fleetTx) UpsertWorkload(ctx context.Context, w fleet.Workload) error {
	var cur Workload
	err := t.forUpdate(t.db(ctx)).Where("node_id = ? AND run_id = ? AND attempt_id = ?", w.NodeID, w.RunID, w.AttemptID).Take(&cur).Error
	row := Workload{NodeID: w.NodeID, RunID: w.RunID, AttemptID: w.AttemptID, State: w.State, ExitCode: w.ExitCode,
		ObservedAt: dbtime.Norm(w.ObservedAt), ReceivedAt: dbtime.Norm(w.ReceivedAt)}
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return t.db(ctx).Create(&row).Error
	}
	if err != nil {
		return err
	}
	newer := row.ObservedAt.After(dbtime.Norm(cur.ObservedAt)) ||
		(row.ObservedAt.Equal(dbtime.Norm(cur.ObservedAt)) && workloadRank[row.State] > workloadRank[cur.State])
	if !newer {
		return nil
	}
	return t.db(ctx).Model(&Workload{}).Where("node_id = ? AND run_id = ? AND attempt_id = ?", w.NodeID, w.RunID, w.AttemptID).
		Select("state", "exit_code", "observed_at", "received_at").Updates(&row).Error
}

func (t *fleetTx) InsertWorkloadOutput(ctx context.Context, o fleet.WorkloadOutput) (bool, error) {
	row := WorkloadOutput{NodeID: o.NodeID, RunID: o.RunID, AttemptID: o.AttemptID,
		StdoutTail: o.StdoutTail, StderrTail: o.StderrTail, Truncated: o.Truncated, ReceivedAt: dbtime.Norm(o.ReceivedAt)}
	// The first report wins: a retry after a lost answer must not replace
	// what an administrator may already have read.
	res := t.db(ctx).Clauses(clause.OnConflict{DoNothing: true}).Create(&row)
	return res.RowsAffected == 1, res.Error
}

func (t *fleetTx) IssueToNode(ctx context.Context, c fleet.Command) (fleet.Node, bool, error) {
	handing := c.DeliveryCount == 1 && c.DeliveredFencing != nil
	if t.dialect != Postgres {
		// SQLite runs statements in-process: several cost no round trip.
		// The operation kept back waits for the node's read, which says
		// whether it starts running (handed to the poll) or pending.
		kept := t.later.take(c.OperationID)
		n, err := t.LockNode(ctx, c.NodeID)
		if err != nil || n.State != fleet.StateReady {
			if kept != nil {
				// Recorded as it came, as before the read: a taken id
				// is the ledger's answer whatever the node's state.
				if err := insertOperation(t.db(ctx), kept.op, kept.events); err != nil {
					return n, false, err
				}
			}
			return n, false, err
		}
		c.FencingToken = n.FencingToken
		handed := handing && *c.DeliveredFencing == n.FencingToken
		if !handed {
			c = undelivered(c)
		}
		if kept != nil {
			op, events := *kept.op, kept.events
			if handed {
				events = runningAtDelivery(&op, events, *c.FirstDeliveredAt)
			}
			if err := insertOperation(t.db(ctx), &op, events); err != nil {
				return n, false, err
			}
			kept.op.Cursor = op.Cursor
		}
		if err := t.InsertCommand(ctx, c); err != nil {
			return n, false, err
		}
		if handed {
			if kept != nil {
				t.noteOperations([]string{c.OperationID})
			} else if err := t.mirrorFirstDeliveries(ctx, []fleet.Command{c}, *c.FirstDeliveredAt); err != nil {
				return n, false, err
			}
		}
		return n, true, t.Notify(ctx, fleet.Notification{Kind: fleet.NotifyIssued, NodeID: n.ID})
	}
	if err := t.stray(c.NodeID); err != nil {
		return fleet.Node{}, false, err
	}
	// The command's operation, when the ledger kept it back for this
	// statement (later.go), is inserted by it too, with its events; the
	// ledger's quota count, when it asked ahead (ExpectNodeCount), rides
	// along.
	count := t.later.countFor(c.OperationID)
	if count != nil && count.node != c.NodeID {
		count = nil
	}
	kept := t.later.take(c.OperationID)
	if t.ahead != nil {
		// Its batch recorded it already, in a statement shared with other
		// submits (issue_ahead.go).
		return t.issuedAhead(ctx, c, kept, count, handing)
	}
	if handing {
		// Handed to a poll held at DeliveredFencing: recorded delivered
		// only if the node is ready at that token under the lock, which
		// is nearly always; else nothing is written and the command is
		// recorded pending below (the node re-enrolled since the poll
		// came, or is not ready and is refused).
		n, inserted, err := t.issue(ctx, c, kept, count, true)
		if err != nil || inserted {
			return n, inserted, err
		}
		c = undelivered(c)
	}
	return t.issue(ctx, c, kept, count, false)
}

// runningAtDelivery makes op, whose command is inserted delivered at at,
// what a claim's first delivery leaves it (running, accepted on the long
// poll) and answers its events with that one's.
func runningAtDelivery(op *ledger.Operation, events []ledger.Event, at time.Time) []ledger.Event {
	op.State, op.AcceptedAt, op.UpdatedAt = ledger.StateRunning, &at, at
	return append(slices.Clip(events), ledger.Event{OperationID: op.ID, Type: ledger.EventRunning, At: at,
		Data: json.RawMessage(`{"channel":"long_poll"}`)})
}

// undelivered is c recorded as never delivered.
func undelivered(c fleet.Command) fleet.Command {
	c.DeliveredFencing, c.FirstDeliveredAt, c.LastDeliveredAt, c.DeliveryCount = nil, nil, nil, 0
	return c
}

// issue runs IssueToNode's statement on Postgres (issueSQL): the lock and
// the insert in one round trip, the submit path's hot statement. The
// insert reads the locked row, so it happens only for a ready node (and,
// handed, only at the poll's fencing token) and carries the fencing token
// the node has under the lock. The other replicas hear of it once the
// transaction has committed (Notify: NotifyIssued may follow the commit).
//
// The lock is FOR KEY SHARE: enrollment and retirement (FOR UPDATE) wait
// for it and it for them, so the command carries the fencing token the
// node has when it commits; lease renewals and the lease sweep (FOR NO KEY
// UPDATE) and other submits do not. A node the sweep marks lost meanwhile
// keeps the command, as it would had the submit come a moment earlier.
// Submits to one node are ordered by the quota count's own lock instead
// (migration 00025). Sent around GORM (sqlpath.go), scanned by hand.
func (t *fleetTx) issue(ctx context.Context, c fleet.Command, kept *later, count *nodeCount, handed bool) (fleet.Node, bool, error) {
	events := -1
	var opValues, evArgs []any
	if kept != nil {
		op, evs := *kept.op, kept.events
		if handed {
			evs = runningAtDelivery(&op, evs, *c.FirstDeliveredAt)
		}
		opValues, evArgs = operationValues(rowFromOperation(op)), eventArgs(evs)
		events = len(evs)
	}
	row := rowFromCommand(c)
	ready := string(fleet.StateReady)
	var args []any
	if handed {
		args = append(args, c.NodeID)
		if kept != nil {
			args = append(append(append(args, opValues...), ready, *c.DeliveredFencing), evArgs...)
		}
		args = append(args, row.OperationID, row.Kind, row.Payload, row.PayloadDigest, row.IssuedAt, row.State,
			row.FirstDeliveredAt, row.LastDeliveredAt, ready, *c.DeliveredFencing)
	} else {
		args = append(append(opValues, evArgs...), c.NodeID,
			row.OperationID, row.Kind, row.Payload, row.PayloadDigest, row.IssuedAt, row.State, ready)
	}
	if count != nil {
		args = append(args, c.OperationID, count.except)
	}
	var a issueAnswer
	err := eachRow(t.db(ctx), issueSQL(issueShape{events, count != nil, handed}), args,
		func(rows *sql.Rows) error {
			a.found = true
			return rows.Scan(a.node.dest(&a.inserted, &a.opSeq, &a.others)...)
		})
	switch {
	case kept != nil && isDuplicate(err):
		// The operation's id or request id is taken (a command's id is
		// its operation's): the ledger's error, its replay lookup follows.
		return fleet.Node{}, false, ledger.ErrDuplicate
	case isDuplicate(err): // statements sent around GORM are not translated
		return fleet.Node{}, false, fleet.ErrDuplicate
	case err != nil:
		return fleet.Node{}, false, err
	}
	return t.issued(ctx, c, kept, count, handed, a)
}

// issueAnswer is what an issue's statement answered: the locked node
// (found false: no such node), whether the command was inserted, the
// operation's seq and the count of the node's other open operations.
type issueAnswer struct {
	found, inserted bool
	node            nodeScan
	opSeq, others   sql.NullInt64
}

// issued finishes an issue of c (issue, or a shared statement ahead of it:
// issue_ahead.go) with its statement's answer a.
func (t *fleetTx) issued(ctx context.Context, c fleet.Command, kept *later, count *nodeCount, handed bool, a issueAnswer) (fleet.Node, bool, error) {
	if !a.found {
		return fleet.Node{}, false, fleet.ErrNoRows
	}
	n := nodeFromRow(a.node.row())
	if !a.inserted {
		return n, false, nil
	}
	if kept != nil && a.opSeq.Valid {
		kept.op.Cursor = a.opSeq.Int64
	}
	_ = t.Notify(ctx, fleet.Notification{Kind: fleet.NotifyIssued, NodeID: n.ID})
	if handed {
		if kept != nil {
			t.noteOperations([]string{c.OperationID})
		} else if err := t.mirrorFirstDeliveries(ctx, []fleet.Command{c}, *c.FirstDeliveredAt); err != nil {
			// The operation was recorded by a statement of its own
			// before (or there is none): marked running by another.
			return fleet.Node{}, false, err
		}
	}
	if count != nil && a.others.Valid {
		// The count leaves the operation out (the migration says
		// why); it exists, recorded now or before this statement.
		count.answered, count.n = true, int(a.others.Int64)+1
	}
	return n, true, nil
}

// issueSQL is IssueToNode's statement on Postgres (issue), of one shape:
// with the insert of a kept-back operation with that many events when
// events is not negative, with the node's quota count when counted, and
// handed (the command inserted delivered at the poll's fencing token, its
// operation running) or not. It answers the locked node's nodeColumns,
// whether the command was inserted, the operation's seq (NULL with no
// operation) and the count of the node's other open operations (NULL when
// not counted); no row for no node. Built once per shape.
//
// Its arguments, unhanded: the operation's values and events'
// (operationArgs), if any; the node; the command's id, kind, payload,
// digest, issued_at and state; the ready state. Handed: the node; the
// operation's values, the ready state, the fencing token and the events'
// values, if any; the command's id, kind, payload, digest, issued_at,
// state, first and last delivery times; the ready state and the fencing
// token. Counted, then: the operation's id and the exempt kinds.
//
// Handed, the operation's insert reads the locked row as the command's
// does, so the two are written together or not at all.
func issueSQL(shape issueShape) string {
	return issueStatements.get(shape, func() string {
		lock := ` n AS (SELECT ` + nodeColumns + ` FROM nodes WHERE id = ? FOR KEY SHARE)`
		withOp, selectOp := "", ", NULL AS op_seq"
		if shape.events >= 0 {
			selectOp = ", (SELECT seq FROM op) AS op_seq"
		}
		// The count is a function of the locked row's id, so it runs once
		// the lock is held, under the node's quota lock, in a snapshot of its
		// own (migrations 00024, 00025).
		selectCount := ", NULL::bigint AS open_others"
		if shape.counted {
			selectCount = ", nodeward_open_for_node(n.id, ?, ?::text[]) AS open_others"
		}
		var q string
		if shape.handed {
			if shape.events >= 0 {
				withOp = "," + operationSelectSQL(shape.events, "n WHERE n.state = ? AND n.fencing_token = ?")
			}
			q = `WITH` + lock + withOp + `,
		ins AS (INSERT INTO commands (operation_id, node_id, kind, payload, payload_digest, fencing_token, issued_at, state,
				delivery_count, delivered_fencing, first_delivered_at, last_delivered_at)
			SELECT ?, n.id, ?, ?, ?, n.fencing_token, ?, ?, 1, n.fencing_token, ?, ? FROM n
			WHERE n.state = ? AND n.fencing_token = ?
			RETURNING 1)`
		} else {
			if shape.events >= 0 {
				withOp = operationSQL(shape.events) + ","
			}
			q = `WITH ` + withOp + lock + `,
		ins AS (INSERT INTO commands (operation_id, node_id, kind, payload, payload_digest, fencing_token, issued_at, state, delivery_count)
			SELECT ?, n.id, ?, ?, ?, n.fencing_token, ?, ?, 0 FROM n
			WHERE n.state = ?
			RETURNING 1)`
		}
		q = numbered(q + `
		SELECT ` + nodeColumns + `, EXISTS (SELECT 1 FROM ins) AS inserted` + selectOp + selectCount + ` FROM n`)
		return q
	})
}

// issueShape names one of issueSQL's statements.
type issueShape struct {
	events  int // -1: no operation
	counted bool
	handed  bool
}

// issueStatements holds issueSQL's statements by shape.
var issueStatements statementCache[issueShape]

func (t *fleetTx) InsertCommand(ctx context.Context, c fleet.Command) error {
	r := rowFromCommand(c)
	q := insertCommandSQLite
	if t.dialect == Postgres {
		q = insertCommandPostgres
	}
	_, err := execRows(t.db(ctx), q, commandValues(r)...)
	if isDuplicate(err) {
		return fleet.ErrDuplicate
	}
	return err
}

// InsertCommand's statement, sent around GORM (sqlpath.go): every submit
// of a command runs it on SQLite, inside the one writer's transaction.
var (
	insertCommandSQLite   = `INSERT INTO commands (` + commandColumns + `) VALUES (` + placeholders(commandColumnCount) + `)`
	insertCommandPostgres = numbered(insertCommandSQLite)
)

// commandValues are r's values in commandColumns's order.
func commandValues(r Command) []any {
	return []any{r.OperationID, r.NodeID, r.Kind, r.Payload, r.PayloadDigest, r.FencingToken, r.IssuedAt,
		r.State, orNull(r.FailureCode), orNull(r.FailureMessage), orNull(r.DeliveredFencing), orNull(r.FirstDeliveredAt),
		orNull(r.LastDeliveredAt), r.DeliveryCount, orNull(r.SettledAt), orNull(r.PayloadBody)}
}

// commandColumnCount is how many values commandValues answers.
const commandColumnCount = 16

// orNull is the value p points to, or nil (NULL) for a nil pointer.
func orNull[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// InsertCommands implements fleet.Tx. The commands of a fan-out's release
// carry one payload: each payload of at least sharedBodyMin is stored once
// in operation_bodies and the commands name it (Command.PayloadBody).
func (t *fleetTx) InsertCommands(ctx context.Context, cs []fleet.Command) error {
	if len(cs) == 0 {
		return nil
	}
	args := make([]any, 0, commandColumnCount*len(cs))
	var delivered []fleet.Command
	bodies := map[string]string{}   // digest → payload
	digests := map[string]*string{} // payload → digest
	for _, c := range cs {
		if c.DeliveryCount == 1 && c.LastDeliveredAt != nil {
			delivered = append(delivered, c)
		}
		var named *string
		if len(c.Payload) >= sharedBodyMin {
			if named = digests[string(c.Payload)]; named == nil {
				body := string(c.Payload)
				d := bodyDigest(body)
				named, bodies[d] = &d, body
				digests[body] = named
			}
			c.Payload = nil
		}
		row := rowFromCommand(c)
		row.PayloadBody = named
		args = append(args, commandValues(row)...)
	}
	if err := nameBodies(t.db(ctx), bodies, cs[0].IssuedAt); err != nil {
		return err
	}
	if err := insertRows(t.db(ctx), "commands", commandColumns, commandColumnCount, args); err != nil {
		if isDuplicate(err) {
			return fleet.ErrDuplicate
		}
		return err
	}
	if len(delivered) == 0 {
		return nil
	}
	return t.mirrorFirstDeliveries(ctx, delivered, *delivered[0].LastDeliveredAt)
}

func (t *fleetTx) LockCommand(ctx context.Context, operationID string) (fleet.Command, error) {
	var row Command
	if err := t.forUpdate(t.db(ctx)).Where("operation_id = ?", operationID).Take(&row).Error; err != nil {
		return fleet.Command{}, notFound(err)
	}
	if err := t.stray(row.NodeID); err != nil {
		return fleet.Command{}, err
	}
	return t.command(ctx, row)
}

// lockCommands is LockCommands, sent around GORM (sqlpath.go): the
// settlement's lock, one statement whatever the number of commands. SQLite
// takes the ids as an IN list (it has no arrays) and locks no rows (it
// has one writer); every settlement runs it in that writer's transaction.
func (t *fleetTx) lockCommands(ctx context.Context, ids []string, out map[string]fleet.Command) error {
	q, args := idsStatement(t.dialect, lockCommandsSQL,
		`SELECT `+commandColumns+` FROM commands WHERE operation_id IN (`, `) ORDER BY operation_id`, ids)
	var r commandScan
	dest := r.dest()
	var locked []Command
	err := eachRow(t.db(ctx), q, args, func(rows *sql.Rows) error {
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		if err := t.stray(r.nodeID.String); err != nil {
			return err
		}
		locked = append(locked, r.row())
		return nil
	})
	if err != nil {
		return err
	}
	cs, err := t.commands(ctx, locked)
	for _, c := range cs {
		out[c.OperationID] = c
	}
	return err
}

const lockCommandsSQL = `SELECT ` + commandColumns + ` FROM commands WHERE operation_id = ANY($1) ORDER BY operation_id FOR UPDATE`

func (t *fleetTx) UpdateCommand(ctx context.Context, c fleet.Command) error {
	row := rowFromCommand(c)
	// A payload never changes once recorded (a command asked again with
	// another is a conflict), and a shared one is not the row's to write.
	if err := t.db(ctx).Model(&Command{OperationID: c.OperationID}).Select("*").
		Omit("operation_id", "payload", "payload_body").Updates(&row).Error; err != nil {
		return err
	}
	return t.mirrorCommandEnd(ctx, c)
}

func (t *fleetTx) ClaimDue(ctx context.Context, d fleet.Due) (fleet.DueWork, []fleet.Command, error) {
	if err := t.stray(d.NodeID); err != nil {
		return fleet.DueWork{}, nil, err
	}
	now := dbtime.Norm(d.Now)
	args := []any{d.Fencing, d.Fencing, now, now, d.NodeID, dbtime.Norm(d.RedeliverBefore), d.Limit}
	var out []fleet.Command
	if t.dialect == Postgres {
		// One statement claims the commands (two polls of one node, an old
		// connection not yet gone, never claim the same command twice within
		// the visibility timeout: SKIP LOCKED), marks the operations of
		// first deliveries running, with their events,
		// and answers what DueWork would have (read in the statement's
		// snapshot, before the claim): a row per claimed command, or one
		// with no command when nothing was due. Sent around GORM
		// (sqlpath.go), scanned by hand.
		var work fleet.DueWork
		var running []string
		var claimed []Command
		var r commandScan
		var opRunning, duePending bool
		var dueConfig int64
		dest := r.dest(&opRunning, &duePending, &dueConfig)
		err := eachRow(t.db(ctx), claimSQL, append(args, now, now, now, d.NodeID,
			d.Fencing, d.Fencing, dbtime.Norm(d.RedeliverBefore), d.NodeID),
			func(rows *sql.Rows) error {
				if err := rows.Scan(dest...); err != nil {
					return err
				}
				work.Unsettled, work.Config = duePending, fleet.ConfigWake(dueConfig)
				if !r.present() {
					return nil // nothing claimed
				}
				claimed = append(claimed, r.row())
				if opRunning {
					running = append(running, r.operationID.String)
				}
				return nil
			})
		if err != nil {
			return fleet.DueWork{}, nil, err
		}
		if out, err = t.commands(ctx, claimed); err != nil {
			return fleet.DueWork{}, nil, err
		}
		t.noteOperations(running)
		sortCommands(out)
		work.Commands = len(out) > 0
		work.Unsettled = work.Unsettled && !work.Commands
		return work, out, nil
	}
	// SQLite: statements are function calls, so the read comes first.
	work, err := t.DueWork(ctx, d)
	if err != nil || !work.Commands {
		return work, nil, err
	}
	var rows []Command
	if err := t.db(ctx).Raw(claim+`) RETURNING *`, args...).Scan(&rows).Error; err != nil {
		return fleet.DueWork{}, nil, err
	}
	if out, err = t.commands(ctx, rows); err != nil {
		return fleet.DueWork{}, nil, err
	}
	sortCommands(out)
	work.Commands = len(out) > 0
	return work, out, t.mirrorFirstDeliveries(ctx, out, d.Now)
}

// claim is ClaimDue's update, less the end of its subquery (the dialects
// lock differently); its arguments: the fencing token twice, now twice,
// the node, the redelivery bound, the limit.
const claim = `UPDATE commands SET
			delivered_fencing = ?, fencing_token = ?, last_delivered_at = ?,
			first_delivered_at = COALESCE(first_delivered_at, ?), delivery_count = delivery_count + 1
		WHERE operation_id IN (
			SELECT operation_id FROM commands
			WHERE node_id = ? AND state = 'pending'
			  AND (last_delivered_at IS NULL OR last_delivered_at <= ?)
			ORDER BY issued_at, operation_id LIMIT ?`

// claimSQL is ClaimDue's statement on Postgres. Each row answers a claimed
// command's commandColumns (all NULL when nothing was claimed), whether its
// operation just became running, and the node's due work as the claim
// found it: a pending command, due or not; fleet.ConfigWake.
var claimSQL = numbered(`WITH claimed AS (` + claim + ` FOR UPDATE SKIP LOCKED) RETURNING ` + commandColumns + `),
			ops AS (
				UPDATE operations SET state = 'running', accepted_at = ?, updated_at = ?
				WHERE id IN (SELECT operation_id FROM claimed WHERE delivery_count = 1) AND state = 'pending'
				RETURNING id),
			ev AS (
				INSERT INTO operation_events (operation_id, type, at, data)
				SELECT ops.id, 'running', ?, '{"channel":"long_poll"}' FROM ops
				RETURNING operation_id),
			due AS (SELECT EXISTS (SELECT 1 FROM commands WHERE node_id = ? AND state = 'pending') AS pending,
				` + dueConfigSQL + ` AS config)
			SELECT ` + commandColumns + `,
				EXISTS (SELECT 1 FROM ev WHERE ev.operation_id = claimed.operation_id) AS operation_running,
				due.pending AS due_pending, due.config AS due_config
			FROM due LEFT JOIN claimed ON TRUE`)

func (t *fleetTx) AppendAudit(ctx context.Context, e fleet.AuditEntry) error {
	detail := "{}"
	if e.Detail != nil {
		b, err := json.Marshal(e.Detail)
		if err != nil {
			return err
		}
		detail = string(b)
	}
	*t.audit = append(*t.audit, NodeAudit{At: dbtime.Norm(e.At), Actor: e.Actor, Action: e.Action, NodeID: e.NodeID, Detail: detail})
	return nil
}

func (t *fleetTx) Notify(ctx context.Context, n fleet.Notification) error {
	*t.notes = append(*t.notes, n)
	switch {
	case t.dialect != Postgres || n.Local():
	case n.MayFollowCommit():
		// Sent to the other replicas once the transaction has committed
		// (announce.go says why).
		*t.after = append(*t.after, n.Encode(t.store.replica))
	default:
		// Delivered to the other replicas when (and only if) the
		// transaction commits: sent with the batch (group.go flushNotes).
		*t.pg = append(*t.pg, n.Encode(t.store.replica))
	}
	return nil
}

// LaunchCommands implements fleet.Reader. The payload is canonical JSON,
// so the text match narrows to the attempt's launches that carry handles
// (a shared payload is matched once read back) and the decode confirms
// each.
func (r fleetReader) LaunchCommands(ctx context.Context, nodeID, runID, attemptID string) ([]string, error) {
	var rows []Command
	launches := func(q *gorm.DB) *gorm.DB {
		return q.Select("operation_id", "payload", "payload_body", "issued_at").
			Where("kind = ? AND (payload LIKE ? OR payload_body IS NOT NULL)", api.KindLaunchWorkload, "%"+secrets.HandlePrefix+"%")
	}
	if err := nodeCommandsQuery(r.db(ctx), nodeID, "", 0, launches).Find(&rows).Error; err != nil {
		return nil, err
	}
	cs, err := r.commands(ctx, rows)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, c := range cs {
		if !bytes.Contains(c.Payload, []byte(secrets.HandlePrefix)) {
			continue
		}
		var p struct {
			RunID     string `json:"run_id"`
			AttemptID string `json:"attempt_id"`
		}
		if json.Unmarshal(c.Payload, &p) == nil && p.RunID == runID && p.AttemptID == attemptID {
			out = append(out, c.OperationID)
		}
	}
	return out, nil
}
