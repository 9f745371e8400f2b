package models

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/dbtime"
	"github.com/nodeward/nodeward/ledger"
)

// NodeConfigRow is a row of node_configs: a node's desired configuration
// and its last report (DECISIONS.md §32).
type NodeConfigRow struct {
	NodeID         string `gorm:"primaryKey"`
	Revision       int64
	Hash           string
	Format         string
	KeyID          string
	Box            *string
	SealedPointers string
	// EarlierSecrets: base64 of fleet.NodeConfig.EarlierBox (migration
	// 00026), under EarlierSecretsKeyID.
	EarlierSecretsKeyID string
	EarlierSecrets      *string
	// DocumentID names the shared document (config_documents, migration
	// 00031) whose data key Box holds; NULL: Box holds the document.
	DocumentID        *string
	SizeBytes         int64
	UpdatedAt         time.Time `gorm:"autoUpdateTime:false"`
	OperationID       string
	SubmittedCursor   int64
	Settled           bool
	ReportedRevision  *int64
	ReportedHash      *string
	ReportedState     *string
	ReportedMessage   *string
	ReportedAt        *time.Time
	ReportedFencing   *int64
	AppliedRevision   int64
	Lagging           bool
	DeliveredFencing  *int64
	DeliveredRevision *int64
	DeliveredAt       *time.Time
}

// TableName pins the table name.
func (NodeConfigRow) TableName() string { return "node_configs" }

func rowFromConfig(c fleet.NodeConfig) NodeConfigRow {
	ptrs := c.SealedPointers
	if ptrs == nil {
		ptrs = []string{}
	}
	pj, _ := json.Marshal(ptrs)
	r := NodeConfigRow{NodeID: c.NodeID, Revision: c.Revision, Hash: c.Hash, Format: c.Format, KeyID: c.KeyID,
		SealedPointers: string(pj), SizeBytes: c.SizeBytes, UpdatedAt: dbtime.Norm(c.UpdatedAt), OperationID: c.OperationID,
		SubmittedCursor: c.SubmittedCursor, Settled: c.Settled, AppliedRevision: c.AppliedRevision, Lagging: c.Lagging,
		DeliveredFencing: c.DeliveredFencing, DeliveredRevision: c.DeliveredRevision, DeliveredAt: dbtime.NormPtr(c.DeliveredAt)}
	if c.Box != nil {
		b := base64.StdEncoding.EncodeToString(c.Box)
		r.Box = &b
	}
	if c.Shared != nil {
		id := c.Shared.ID
		r.DocumentID = &id
	}
	r.EarlierSecretsKeyID = c.EarlierKeyID
	if c.EarlierBox != nil {
		b := base64.StdEncoding.EncodeToString(c.EarlierBox)
		r.EarlierSecrets = &b
	}
	if rep := c.Reported; rep != nil {
		at := dbtime.Norm(rep.ObservedAt)
		r.ReportedRevision, r.ReportedHash, r.ReportedState = &rep.Revision, &rep.Hash, &rep.State
		r.ReportedMessage, r.ReportedAt, r.ReportedFencing = &rep.Message, &at, &rep.Fencing
	}
	return r
}

func configFromRow(r NodeConfigRow) (fleet.NodeConfig, error) {
	c := fleet.NodeConfig{NodeID: r.NodeID, Revision: r.Revision, Hash: r.Hash, Format: r.Format, KeyID: r.KeyID,
		SizeBytes: r.SizeBytes, UpdatedAt: dbtime.Norm(r.UpdatedAt), OperationID: r.OperationID,
		SubmittedCursor: r.SubmittedCursor, Settled: r.Settled,
		AppliedRevision: r.AppliedRevision, Lagging: r.Lagging, DeliveredFencing: r.DeliveredFencing,
		DeliveredRevision: r.DeliveredRevision, DeliveredAt: dbtime.NormPtr(r.DeliveredAt)}
	_ = json.Unmarshal([]byte(r.SealedPointers), &c.SealedPointers)
	if r.Box != nil {
		b, err := base64.StdEncoding.DecodeString(*r.Box)
		if err != nil {
			return fleet.NodeConfig{}, err
		}
		c.Box = b
	}
	if r.DocumentID != nil {
		c.Shared = &fleet.SharedDocument{ID: *r.DocumentID}
	}
	c.EarlierKeyID = r.EarlierSecretsKeyID
	if r.EarlierSecrets != nil {
		b, err := base64.StdEncoding.DecodeString(*r.EarlierSecrets)
		if err != nil {
			return fleet.NodeConfig{}, err
		}
		c.EarlierBox = b
	}
	if r.ReportedAt != nil {
		rep := &fleet.ConfigReport{ObservedAt: dbtime.Norm(*r.ReportedAt)}
		if r.ReportedRevision != nil {
			rep.Revision = *r.ReportedRevision
		}
		if r.ReportedHash != nil {
			rep.Hash = *r.ReportedHash
		}
		if r.ReportedState != nil {
			rep.State = *r.ReportedState
		}
		if r.ReportedMessage != nil {
			rep.Message = *r.ReportedMessage
		}
		if r.ReportedFencing != nil {
			rep.Fencing = *r.ReportedFencing
		}
		c.Reported = rep
	}
	return c, nil
}

// DueWork implements fleet.Reader in one statement: the command check
// HasDue makes, and the node's configuration judged for the session
// (0 not due, 1 due but delivered to this fencing token within the
// visibility timeout, 2 due), by primary key.
func (r fleetReader) DueWork(ctx context.Context, d fleet.Due) (fleet.DueWork, error) {
	var row struct {
		Commands int
		Config   int
	}
	err := r.db(ctx).Raw(dueWorkSQL, dueWorkArgs(d)...).Scan(&row).Error
	return fleet.DueWork{Commands: row.Commands == 2, Unsettled: row.Commands == 1, Config: fleet.ConfigWake(row.Config)}, err
}

// dueWorkSQL answers commands 2 when a command is due, 1 when none is but
// one is pending (delivered within the visibility timeout, unsettled: it
// falls due again by time alone, so a poll may not take "nothing due" as
// lasting), 0 when the node has no pending command. The second probe runs
// only when the first finds nothing, on the same partial index.
const dueWorkSQL = `SELECT
		CASE WHEN EXISTS (SELECT 1 FROM commands WHERE node_id = ? AND state = 'pending'
			AND (last_delivered_at IS NULL OR last_delivered_at <= ?)) THEN 2
		WHEN EXISTS (SELECT 1 FROM commands WHERE node_id = ? AND state = 'pending') THEN 1
		ELSE 0 END AS commands,
		` + dueConfigSQL + ` AS config`

// dueConfigSQL judges the node's configuration for the session (fleet.
// ConfigWake), by primary key; its arguments: the fencing token twice, the
// redelivery bound, the node id.
const dueConfigSQL = `COALESCE((SELECT CASE
			WHEN revision = 0 THEN 0
			WHEN settled AND reported_fencing = ? THEN 0
			WHEN delivered_fencing = ? AND delivered_revision = revision AND delivered_at > ? THEN 1
			ELSE 2 END
		FROM node_configs WHERE node_id = ?), 0)`

func dueWorkArgs(d fleet.Due) []any {
	before := dbtime.Norm(d.RedeliverBefore)
	return []any{d.NodeID, before, d.NodeID, d.Fencing, d.Fencing, before, d.NodeID}
}

// NodesAtRest implements fleet.Reader: a page of the nodes by primary key,
// each judged as dueWorkSQL would judge a poll at the node's own fencing
// token — quiet when it has no pending command and its configuration
// needs nothing (none, or settled by a report under that token). Two
// probes a row, on the indexes a poll's read uses.
func (r fleetReader) NodesAtRest(ctx context.Context, after string, limit int) ([]fleet.NodeAtRest, error) {
	var rows []struct {
		Node
		Busy bool
	}
	err := r.db(ctx).Raw(nodesAtRestSQL, string(fleet.StateRetired), after, limit).Scan(&rows).Error
	if err != nil {
		return nil, err
	}
	out := make([]fleet.NodeAtRest, len(rows))
	for i, row := range rows {
		out[i] = fleet.NodeAtRest{Node: nodeFromRow(row.Node), Quiet: !row.Busy}
	}
	return out, nil
}

const nodesAtRestSQL = `SELECT n.*,
		(EXISTS (SELECT 1 FROM commands c WHERE c.node_id = n.id AND c.state = 'pending')
		OR EXISTS (SELECT 1 FROM node_configs k WHERE k.node_id = n.id AND k.revision <> 0
			AND NOT COALESCE(k.settled AND k.reported_fencing = n.fencing_token, FALSE))) AS busy
	FROM nodes n WHERE n.state <> ? AND n.id > ? ORDER BY n.id LIMIT ?`

// NodeConfig implements fleet.Reader: the row and its shared document in
// one statement, since it locks nothing that keeps retention from
// deleting a document between two.
func (r fleetReader) NodeConfig(ctx context.Context, nodeID string) (fleet.NodeConfig, error) {
	var row struct {
		NodeConfigRow
		SharedBox *string
	}
	err := r.db(ctx).Table("node_configs AS c").Select("c.*, d.box AS shared_box").
		Joins("LEFT JOIN config_documents d ON d.id = c.document_id").Where("c.node_id = ?", nodeID).Take(&row).Error
	if err != nil {
		return fleet.NodeConfig{}, notFound(err)
	}
	c, err := configFromRow(row.NodeConfigRow)
	if err != nil || c.Shared == nil {
		return c, err
	}
	if row.SharedBox == nil {
		return fleet.NodeConfig{}, fmt.Errorf("node %s's configuration names shared document %s, which is not stored", nodeID, c.Shared.ID)
	}
	c.Shared.Box, err = base64.StdEncoding.DecodeString(*row.SharedBox)
	return c, err
}

func (r fleetReader) LaggingConfigs(ctx context.Context, before string, limit int) ([]fleet.NodeConfig, error) {
	var rows []NodeConfigRow
	if err := laggingQuery(r.db(ctx), before, limit).Scan(&rows).Error; err != nil {
		return nil, err
	}
	out := make([]fleet.NodeConfig, 0, len(rows))
	for _, row := range rows {
		c, err := configFromRow(row)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

func laggingQuery(g *gorm.DB, before string, limit int) *gorm.DB {
	q := g.Table("node_configs AS c").Select("c.*").Joins("JOIN nodes n ON n.id = c.node_id").
		Where("c.lagging AND n.state <> ?", string(fleet.StateRetired)).Order("c.node_id DESC")
	if before != "" {
		q = q.Where("c.node_id < ?", before)
	}
	if limit > 0 {
		q = q.Limit(limit)
	}
	return q
}

func (r fleetReader) CountConfigs(ctx context.Context) (int64, int64, error) {
	var row struct {
		Lagging int64
		Never   int64
	}
	err := r.db(ctx).Raw(countConfigsSQL, string(fleet.StateRetired), string(fleet.StateRetired)).Scan(&row).Error
	return row.Lagging, row.Never, err
}

const countConfigsSQL = `SELECT
		(SELECT COUNT(*) FROM node_configs c JOIN nodes n ON n.id = c.node_id
			WHERE c.lagging AND n.state <> ?) AS lagging,
		(SELECT COUNT(*) FROM node_configs c JOIN nodes n ON n.id = c.node_id
			WHERE c.revision > 0 AND c.reported_at IS NULL AND n.state <> ?) AS never`

func (t *fleetTx) LockNodeConfig(ctx context.Context, nodeID string) (fleet.NodeConfig, error) {
	if err := t.stray(nodeID); err != nil {
		return fleet.NodeConfig{}, err
	}
	var row NodeConfigRow
	if err := t.forUpdate(t.db(ctx)).Where("node_id = ?", nodeID).Take(&row).Error; err != nil {
		return fleet.NodeConfig{}, notFound(err)
	}
	c, err := configFromRow(row)
	if err != nil {
		return fleet.NodeConfig{}, err
	}
	return c, fillShared(t.db(ctx), t.dialect, []*fleet.NodeConfig{&c})
}

// LockNodeConfigHead implements fleet.Tx: the row's every column but
// the document's, which a configuration report neither needs nor
// changes; a 256 KiB document is 340 KB of base64 to read and decode.
func (t *fleetTx) LockNodeConfigHead(ctx context.Context, nodeID string) (fleet.NodeConfig, error) {
	if err := t.stray(nodeID); err != nil {
		return fleet.NodeConfig{}, err
	}
	var row NodeConfigRow
	if err := t.forUpdate(t.db(ctx)).Omit("box").Where("node_id = ?", nodeID).Take(&row).Error; err != nil {
		return fleet.NodeConfig{}, notFound(err)
	}
	return configFromRow(row)
}

func (t *fleetTx) SaveNodeConfig(ctx context.Context, c fleet.NodeConfig) error {
	row := rowFromConfig(c)
	return t.db(ctx).Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "node_id"}}, UpdateAll: true}).Create(&row).Error
}

// reportColumnsSQL writes a configuration report's columns (SaveConfigReport).
const reportColumnsSQL = `UPDATE node_configs SET reported_revision = ?, reported_hash = ?, reported_state = ?,
	reported_message = ?, reported_at = ?, reported_fencing = ?, settled = ?, applied_revision = ?, lagging = ?
	WHERE node_id = ?`

// SaveConfigReport implements fleet.Tx. On Postgres a report that ends
// operations is one statement, the row's update a part of the end's
// (endConfiguresPostgres).
func (t *fleetTx) SaveConfigReport(ctx context.Context, c fleet.NodeConfig, end *fleet.ConfigEnd) (int, error) {
	if err := t.stray(c.NodeID); err != nil {
		return 0, err
	}
	rep := c.Reported
	if rep == nil {
		return 0, fmt.Errorf("configuration report of node %s: no report to save", c.NodeID)
	}
	args := []any{rep.Revision, rep.Hash, rep.State, rep.Message, dbtime.Norm(rep.ObservedAt), rep.Fencing,
		c.Settled, c.AppliedRevision, c.Lagging, c.NodeID}
	if end != nil && t.dialect == Postgres {
		return t.endConfiguresPostgres(ctx, c.NodeID, "", *end, "cfg AS ("+reportColumnsSQL+"), ", args...)
	}
	if err := t.db(ctx).Exec(reportColumnsSQL, args...).Error; err != nil {
		return 0, err
	}
	if end == nil {
		return 0, nil
	}
	return t.EndConfigureOperations(ctx, c.NodeID, "", *end)
}

// LockNodeConfigs implements fleet.Tx: one statement, the rows locked in
// node id order, as every batched statement locks.
func (t *fleetTx) LockNodeConfigs(ctx context.Context, ids []string) (map[string]fleet.NodeConfig, error) {
	if err := t.strayAny(ids); err != nil {
		return nil, err
	}
	out := make(map[string]fleet.NodeConfig, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	var rows []NodeConfigRow
	if err := t.forUpdate(t.db(ctx)).Where("node_id IN ?", ids).Order("node_id").Find(&rows).Error; err != nil {
		return nil, err
	}
	cs := make([]*fleet.NodeConfig, len(rows))
	for i, r := range rows {
		c, err := configFromRow(r)
		if err != nil {
			return nil, err
		}
		cs[i] = &c
	}
	if err := fillShared(t.db(ctx), t.dialect, cs); err != nil {
		return nil, err
	}
	for _, c := range cs {
		out[c.NodeID] = *c
	}
	return out, nil
}

// SaveNodeConfigs implements fleet.Tx: one multi-row upsert (in batches
// that keep a statement under SQLite's limit of bound values).
func (t *fleetTx) SaveNodeConfigs(ctx context.Context, cs []fleet.NodeConfig) error {
	if len(cs) == 0 {
		return nil
	}
	rows := make([]NodeConfigRow, len(cs))
	for i, c := range cs {
		rows[i] = rowFromConfig(c)
	}
	for len(rows) > 0 {
		// The documents dominate a row: statementBytes bounds them.
		n := rowsThatFit(len(rows), saveConfigsPerStatement, func(i int) int {
			return paramBytes(rows[i].Box) + paramBytes(rows[i].EarlierSecrets) + 256
		})
		batch := rows[:n]
		err := t.db(ctx).Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "node_id"}}, UpdateAll: true}).Create(&batch).Error
		if err != nil {
			return err
		}
		rows = rows[n:]
	}
	return nil
}

// saveConfigsPerStatement keeps a multi-row upsert of node_configs (28
// columns) well under SQLite's 32,766 bound values.
const saveConfigsPerStatement = 500

// MarkConfigDelivered implements fleet.Tx. A delivery (revision > 0) also
// makes the node's pending configure operations running — accepted on
// channel long_poll, like a command's first delivery — with their events:
// on Postgres in the same statement as the delivery mark, on SQLite in
// the same transaction; announced as noteOperations says. Only the
// first delivery finds them pending, so a redelivery writes no more.
func (t *fleetTx) MarkConfigDelivered(ctx context.Context, nodeID string, fencing, revision int64, at time.Time) error {
	const mark = `UPDATE node_configs SET delivered_fencing = ?, delivered_revision = ?, delivered_at = ? WHERE node_id = ?`
	at = dbtime.Norm(at)
	if revision <= 0 {
		return t.db(ctx).Exec(mark, fencing, revision, at, nodeID).Error
	}
	pending := configuresRunningSQL(t.dialect)
	var running []string
	if t.dialect == Postgres {
		err := t.db(ctx).Raw(`WITH cfg AS (`+mark+` RETURNING node_id),
			ops AS (`+pending+` AND EXISTS (SELECT 1 FROM cfg) RETURNING id),
			ev AS (
				INSERT INTO operation_events (operation_id, type, at, data)
				SELECT ops.id, 'running', ?, '{"channel":"long_poll"}' FROM ops
				RETURNING operation_id)
			SELECT operation_id FROM ev`,
			fencing, revision, at, nodeID, at, at, nodeID, ledger.TargetNode, ledger.KindNodeConfigure,
			at).Scan(&running).Error
		if err != nil {
			return err
		}
		t.noteOperations(running)
		return nil
	}
	if err := t.db(ctx).Exec(mark, fencing, revision, at, nodeID).Error; err != nil {
		return err
	}
	if err := t.db(ctx).Raw(pending+` RETURNING id`, at, at, nodeID, ledger.TargetNode, ledger.KindNodeConfigure).Scan(&running).Error; err != nil {
		return err
	}
	events := make([]ledger.Event, len(running))
	for i, id := range running {
		events[i] = ledger.Event{OperationID: id, Type: ledger.EventRunning, At: at, Data: json.RawMessage(`{"channel":"long_poll"}`)}
	}
	if err := appendEvents(t.db(ctx), events); err != nil {
		return err
	}
	t.noteOperations(running)
	return nil
}

// configuresRunningSQL marks a node's pending configure operations
// running (its arguments: accepted_at, updated_at, the node's id, the
// target kind and the kind), in dialect.
func configuresRunningSQL(dialect string) string {
	return `UPDATE ` + nodeOpenOperations(dialect) + ` SET state = 'running', accepted_at = ?, updated_at = ?
		WHERE target_id = ? AND terminal = FALSE AND state = 'pending' AND held = FALSE
		  AND target_kind = ? AND kind = ?`
}

// sqliteNodeOpenOperations names the operations table in a SQLite statement
// that reads one node's open operations of a kind, pinned to the index of
// open operations by target. Nothing analyzes an embedded database, and
// without statistics SQLite's planner prefers the index with more equal
// columns, operations_kind_target (kind, target_kind): a delivery's or a
// report's statement then read every configure operation the ledger held,
// ended ones included, to find the node's one or two. That was over two
// thirds of the process's CPU in a fleet.configure to 10,000 nodes
// (BENCHMARKS.md, thirty-eighth sitting), and it grows with the ledger's
// history. Postgres plans from statistics it keeps (docs/ledger-plans.md).
const sqliteNodeOpenOperations = "operations INDEXED BY operations_open_target"

// nodeOpenOperations is the table to read one node's open operations of a
// kind from, in dialect (sqliteNodeOpenOperations).
func nodeOpenOperations(dialect string) string {
	if dialect == SQLite {
		return sqliteNodeOpenOperations
	}
	return "operations"
}

// EndConfigureOperations implements fleet.Tx through the ledger's own
// ending (state, event, announcement, the fan-out parent told), in this
// same transaction.
func (t *fleetTx) EndConfigureOperations(ctx context.Context, nodeID, except string, end fleet.ConfigEnd) (int, error) {
	if t.dialect == Postgres {
		return t.endConfiguresPostgres(ctx, nodeID, except, end, "")
	}
	var rows []Operation
	if err := t.forUpdate(openConfiguresQuery(t.db(ctx), t.dialect, nodeID, except)).Find(&rows).Error; err != nil {
		return 0, err
	}
	if len(rows) == 0 {
		return 0, nil
	}
	ops, err := t.operations(ctx, rows)
	if err != nil {
		return 0, err
	}
	ltx := &ledgerTx{ledgerReader: ledgerReader{r: t.fleetReader}, ftx: t}
	return len(ops), ledger.EndConfigures(ctx, ltx, ops, end)
}

// endConfiguresPostgres is EndConfigureOperations in one statement, as a
// command's end is (mirrorCommandEnd): every configuration report ends
// its node's configure operations, and selecting them, ending each and
// appending each one's event were a round trip apiece. The event says the
// state each ended from, as ledger's end of an operation does. before,
// when not empty, is a common table expression ("name AS (…), ") that
// runs in the same statement, its arguments beforeArgs.
func (t *fleetTx) endConfiguresPostgres(ctx context.Context, nodeID, except string, end fleet.ConfigEnd, before string, beforeArgs ...any) (int, error) {
	var opErr *ledger.Error
	var code, msg *string
	var retryable *bool
	if end.Code != "" {
		opErr = &ledger.Error{Code: end.Code, Message: end.Message, Retryable: end.Retryable}
		code, msg, retryable = &opErr.Code, &opErr.Message, &opErr.Retryable
	}
	eventData := func(from ledger.State) string {
		data := map[string]any{"from": from}
		if opErr != nil {
			data["error"] = opErr
		}
		b, _ := json.Marshal(data)
		return string(b)
	}
	at := dbtime.Norm(end.At)
	var ended []endedOperation
	args := append(beforeArgs, nodeID, ledger.TargetNode, ledger.KindNodeConfigure, except,
		end.State, rawp(end.Result), code, msg, retryable, at, at,
		end.State, at, eventData(ledger.StatePending), eventData(ledger.StateRunning))
	err := t.db(ctx).Raw("WITH "+before+endConfiguresPostgresSQL, args...).Scan(&ended).Error
	if err != nil {
		return 0, err
	}
	for _, e := range ended {
		t.noteOperations([]string{e.ID})
		if e.ParentID != nil {
			*t.notes = append(*t.notes, fleet.Notification{Kind: fleet.NotifyChildEnded, NodeID: *e.ParentID})
		}
	}
	return len(ended), nil
}

// endConfiguresPostgresSQL: the node's open configure operations locked
// in seq order, ended, and each given its event. Open operations are
// pending or running, both of which may end so.
const endConfiguresPostgresSQL = `cur AS (
		SELECT seq, state FROM operations
		WHERE target_id = ? AND terminal = FALSE AND target_kind = ? AND kind = ? AND held = FALSE AND id <> ?
		ORDER BY seq FOR UPDATE),
	op AS (
		UPDATE operations o SET state = ?, terminal = TRUE, result = ?, error_code = ?, error_message = ?,
			error_retryable = ?, finished_at = ?, updated_at = ?
		FROM cur WHERE o.seq = cur.seq
		RETURNING o.seq, o.id, o.parent_id, cur.state AS from_state),
	ev AS (
		INSERT INTO operation_events (operation_id, type, at, data)
		SELECT op.id, ?, ?, CASE op.from_state WHEN 'pending' THEN ? ELSE ? END FROM op ORDER BY op.seq
		RETURNING operation_id)
	SELECT op.id, op.parent_id FROM op JOIN ev ON ev.operation_id = op.id ORDER BY op.seq`

// EndConfigureOperationsOf implements fleet.Tx.
func (t *fleetTx) EndConfigureOperationsOf(ctx context.Context, ends map[string]fleet.ConfigEnd, except []string) (int, error) {
	if len(ends) == 0 {
		return 0, nil
	}
	nodes := make([]string, 0, len(ends))
	for id := range ends {
		nodes = append(nodes, id)
	}
	slices.Sort(nodes)
	var rows []Operation
	if err := t.forUpdate(openConfiguresOfQuery(t.db(ctx), t.dialect, nodes, except)).Find(&rows).Error; err != nil {
		return 0, err
	}
	ops, err := t.operations(ctx, rows)
	if err != nil {
		return 0, err
	}
	ltx := &ledgerTx{ledgerReader: ledgerReader{r: t.fleetReader}, ftx: t}
	for _, op := range ops {
		if err := ledger.EndConfigures(ctx, ltx, []ledger.Operation{op}, ends[op.TargetID]); err != nil {
			return 0, err
		}
	}
	return len(rows), nil
}

func openConfiguresQuery(g *gorm.DB, dialect, nodeID, except string) *gorm.DB {
	return g.Table(nodeOpenOperations(dialect)).Where("target_id = ? AND terminal = FALSE AND target_kind = ? AND kind = ? AND held = FALSE AND id <> ?",
		nodeID, ledger.TargetNode, ledger.KindNodeConfigure, except).Order("seq")
}

func openConfiguresOfQuery(g *gorm.DB, dialect string, nodeIDs, except []string) *gorm.DB {
	q := g.Table(nodeOpenOperations(dialect)).Where("target_id IN ? AND terminal = FALSE AND target_kind = ? AND kind = ? AND held = FALSE",
		nodeIDs, ledger.TargetNode, ledger.KindNodeConfigure)
	if len(except) > 0 {
		q = q.Where("id NOT IN ?", except)
	}
	return q.Order("seq")
}

// The desired configuration's statements, for the query-plan tool.

// DueWork is a poll's one read of due commands and configuration.
func (q LedgerStatements) DueWork(d fleet.Due) Statement {
	return q.raw(dueWorkSQL, dueWorkArgs(d)...)
}

// LaggingConfigs is the lagging listing's page.
func (q LedgerStatements) LaggingConfigs(before string, limit int) Statement {
	return q.build(func(g *gorm.DB) *gorm.DB { return laggingQuery(g, before, limit).Scan(&[]NodeConfigRow{}) })
}

// CountConfigs is the lagging and never-reported count (the listing's
// and the metric's).
func (q LedgerStatements) CountConfigs() Statement {
	return q.raw(countConfigsSQL, string(fleet.StateRetired), string(fleet.StateRetired))
}

// OpenConfigures is the select of a node's open configure operations a
// report or a new revision ends.
func (q LedgerStatements) OpenConfigures(nodeID string) Statement {
	return q.build(func(g *gorm.DB) *gorm.DB { return openConfiguresQuery(g, q.dialect, nodeID, "").Find(&[]Operation{}) })
}

// OpenConfiguresOf is the select of the open configure operations a
// fleet.configure's new revisions supersede, over the nodes it names.
func (q LedgerStatements) OpenConfiguresOf(nodeIDs []string) Statement {
	return q.build(func(g *gorm.DB) *gorm.DB {
		return openConfiguresOfQuery(g, q.dialect, nodeIDs, nil).Find(&[]Operation{})
	})
}

// ConfiguresRunning is the update a configuration's delivery makes.
func (q LedgerStatements) ConfiguresRunning(nodeID string, at time.Time) Statement {
	at = dbtime.Norm(at)
	return q.raw(configuresRunningSQL(q.dialect), at, at, nodeID, ledger.TargetNode, ledger.KindNodeConfigure)
}
