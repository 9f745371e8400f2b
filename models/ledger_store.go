package models

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"sort"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/dbtime"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/secrets"
)

// LedgerStore implements ledger.Store over GORM for both dialects. Its
// transactions are the fleet store's (group-committed on both dialects), so an
// operation and the fleet change it makes commit together.
type LedgerStore struct {
	fleet *FleetStore
}

var _ ledger.Store = (*LedgerStore)(nil)

// NewLedgerStore returns the ledger's store over the fleet store's
// database and transactions.
func NewLedgerStore(fs *FleetStore) *LedgerStore { return &LedgerStore{fleet: fs} }

type ledgerReader struct{ r fleetReader }

type ledgerTx struct {
	ledgerReader
	ftx        *fleetTx
	savepoints int
}

func (s *LedgerStore) reader() ledgerReader { return ledgerReader{r: s.fleet.fleetReader} }

// Tx runs fn in one transaction shared with the fleet.
func (s *LedgerStore) Tx(ctx context.Context, fn func(ledger.Tx) error) error {
	return s.fleet.Tx(ctx, onFleetTx(fn))
}

// onFleetTx runs a ledger transaction's fn on the fleet's transaction.
func onFleetTx(fn func(ledger.Tx) error) func(fleet.Tx) error {
	return func(ftx fleet.Tx) error {
		t := ftx.(*fleetTx)
		return fn(&ledgerTx{ledgerReader: ledgerReader{r: t.fleetReader}, ftx: t})
	}
}

func ledgerNotFound(err error) error {
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return ledger.ErrNoRows
	}
	return err
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func rawp(b json.RawMessage) *string {
	if len(b) == 0 {
		return nil
	}
	s := string(b)
	return &s
}

func raw(p *string) json.RawMessage {
	if p == nil {
		return nil
	}
	return json.RawMessage(*p)
}

func rowFromOperation(o ledger.Operation) Operation {
	targets, _ := json.Marshal(o.Targets)
	r := Operation{
		Seq: o.Cursor, ID: o.ID, RequestID: o.RequestID, Digest: o.Digest,
		PrincipalKind: string(o.PrincipalKind), PrincipalID: o.PrincipalID, PrincipalName: o.PrincipalName,
		PackageHostGeneration: o.PackageHostGeneration,
		Family:                o.Family, Kind: o.Kind, State: string(o.State), Terminal: o.State.Terminal(),
		Channel: string(o.Channel), Attempt: o.Attempt, Targets: string(targets),
		TargetKind: o.TargetKind, TargetID: o.TargetID, ParentID: strp(o.ParentID), Held: o.Held, Reason: o.Reason,
		Operation: string(o.Operation), Result: rawp(o.Result), Evidence: rawp(o.Evidence),
		CancelRequestedAt: dbtime.NormPtr(o.CancelRequestedAt), CancelReason: o.CancelReason, Owner: o.Owner,
		CreatedAt: dbtime.Norm(o.CreatedAt), AcceptedAt: dbtime.NormPtr(o.AcceptedAt), FinishedAt: dbtime.NormPtr(o.FinishedAt),
		Deadline: dbtime.Norm(o.Deadline), UpdatedAt: dbtime.Norm(o.UpdatedAt),
	}
	if o.Counts != nil {
		c, _ := json.Marshal(o.Counts)
		r.Counts = rawp(c)
	}
	if o.Error != nil {
		r.ErrorCode, r.ErrorMessage, r.ErrorRetryable = &o.Error.Code, &o.Error.Message, &o.Error.Retryable
	}
	return r
}

// convertRow answers a row as the ledger's operation, its operation as
// the row holds it: fleetReader.operations puts back a shared one first.
func convertRow(r Operation) ledger.Operation {
	o := ledger.Operation{
		Cursor: r.Seq, ID: r.ID, RequestID: r.RequestID, Digest: r.Digest,
		PrincipalKind: ledger.PrincipalKind(r.PrincipalKind), PrincipalID: r.PrincipalID, PrincipalName: r.PrincipalName,
		PackageHostGeneration: r.PackageHostGeneration,
		Family:                r.Family, Kind: r.Kind, State: ledger.State(r.State), Channel: ledger.Channel(r.Channel),
		Attempt: r.Attempt, TargetKind: r.TargetKind, TargetID: r.TargetID, ParentID: deref(r.ParentID), Held: r.Held,
		Reason: r.Reason, Operation: json.RawMessage(r.Operation), Result: raw(r.Result), Evidence: raw(r.Evidence),
		CancelRequestedAt: dbtime.NormPtr(r.CancelRequestedAt), CancelReason: r.CancelReason, Owner: r.Owner,
		CreatedAt: r.CreatedAt.UTC(), AcceptedAt: dbtime.NormPtr(r.AcceptedAt), FinishedAt: dbtime.NormPtr(r.FinishedAt),
		Deadline: r.Deadline.UTC(), UpdatedAt: r.UpdatedAt.UTC(),
	}
	_ = json.Unmarshal([]byte(r.Targets), &o.Targets)
	if o.Targets == nil {
		o.Targets = []ledger.Target{}
	}
	if r.Counts != nil {
		o.Counts = &ledger.Counts{}
		_ = json.Unmarshal([]byte(*r.Counts), o.Counts)
	}
	if r.ErrorCode != nil {
		o.Error = &ledger.Error{Code: *r.ErrorCode, Message: deref(r.ErrorMessage), Retryable: r.ErrorRetryable != nil && *r.ErrorRetryable}
	}
	return o
}

// Reader.

func (s *LedgerStore) Operation(ctx context.Context, id string) (ledger.Operation, error) {
	return s.reader().Operation(ctx, id)
}

func (s *LedgerStore) OperationByRequest(ctx context.Context, p ledger.Principal, requestID string) (ledger.Operation, error) {
	return s.reader().OperationByRequest(ctx, p, requestID)
}

func (s *LedgerStore) List(ctx context.Context, f ledger.Filter) ([]ledger.Operation, error) {
	return s.reader().List(ctx, f)
}

func (s *LedgerStore) Events(ctx context.Context, operationID string, after int64, limit int) ([]ledger.Event, error) {
	return s.reader().Events(ctx, operationID, after, limit)
}

func (r ledgerReader) Operation(ctx context.Context, id string) (ledger.Operation, error) {
	row, err := r.r.operationByID(ctx, id, operationByIDSQLite, operationByIDPostgres)
	if err != nil {
		return ledger.Operation{}, err
	}
	return r.r.operation(ctx, row)
}

// An operation by its id, sent around GORM (sqlpath.go): a fan-out's
// parent is locked for every advance of its children, and a waiting submit
// and the dispatcher's cancel check read operations by id.
var (
	operationByIDSQLite       = `SELECT ` + operationScanColumns + ` FROM operations WHERE id = ?`
	operationByIDPostgres     = numbered(operationByIDSQLite)
	lockOperationByIDPostgres = operationByIDPostgres + ` FOR UPDATE`
	// LockParent's: the targets are not read (an empty text in their
	// place).
	lockParentSQLite   = `SELECT ` + withoutTargets(operationScanColumns) + ` FROM operations WHERE id = ?`
	lockParentPostgres = numbered(lockParentSQLite) + ` FOR UPDATE`
)

// withoutTargets answers columns (operationScanColumns) with the targets
// column's value replaced by an empty text.
func withoutTargets(columns string) string {
	out := strings.Replace(columns, " targets,", " '' AS targets,", 1)
	if out == columns {
		panic("models: no targets column in " + columns)
	}
	return out
}

// operationByID answers the operation with id, through sqlite's statement
// or postgres's (a lock for update is Postgres's alone: SQLite has one
// writer), or ledger.ErrNoRows.
func (r fleetReader) operationByID(ctx context.Context, id, sqlite, postgres string) (Operation, error) {
	q := sqlite
	if r.dialect == Postgres {
		q = postgres
	}
	var row Operation
	found := false
	err := eachRow(r.db(ctx), q, []any{id}, func(rows *sql.Rows) error {
		found = true
		return rows.Scan(operationDest(&row)...)
	})
	switch {
	case err != nil:
		return Operation{}, err
	case !found:
		return Operation{}, ledger.ErrNoRows
	}
	return row, nil
}

// operationScanColumns are the operations table's columns in the order
// operationDest receives them.
const operationScanColumns = `seq, ` + operationColumns

// operationDest answers r's fields as the scan destinations of
// operationScanColumns (a NULL leaves a pointer field nil).
func operationDest(r *Operation) []any {
	return []any{&r.Seq, &r.ID, &r.RequestID, &r.Digest, &r.PrincipalKind, &r.PrincipalID, &r.PrincipalName,
		&r.PackageHostGeneration, &r.Family, &r.Kind, &r.State, &r.Terminal, &r.Channel, &r.Attempt, &r.Targets,
		&r.TargetKind, &r.TargetID, &r.ParentID, &r.Held, &r.Counts, &r.Reason, &r.Operation, &r.Result, &r.ErrorCode,
		&r.ErrorMessage, &r.ErrorRetryable, &r.Evidence, &r.CancelRequestedAt, &r.CancelReason, &r.Owner,
		&r.CreatedAt, &r.AcceptedAt, &r.FinishedAt, &r.Deadline, &r.UpdatedAt, &r.BodyDigest}
}

func (r ledgerReader) OperationByRequest(ctx context.Context, p ledger.Principal, requestID string) (ledger.Operation, error) {
	var row Operation
	if err := byRequestQuery(r.r.db(ctx), p, requestID).Take(&row).Error; err != nil {
		return ledger.Operation{}, ledgerNotFound(err)
	}
	return r.r.operation(ctx, row)
}

// The queries below are built by functions that both the store and
// LedgerStatements (the query-plan tool's view) call, so the plans in
// docs/ledger-plans.md are of the SQL the store runs.

func byRequestQuery(g *gorm.DB, p ledger.Principal, requestID string) *gorm.DB {
	return g.Where("principal_kind = ? AND principal_id = ? AND request_id = ?", string(p.Kind), p.ID, requestID)
}

func (r ledgerReader) List(ctx context.Context, f ledger.Filter) ([]ledger.Operation, error) {
	if f.Kinds != nil && len(f.Kinds) == 0 {
		return nil, nil // no kind can match (an unknown family or target kind)
	}
	var rows []Operation
	if err := listQuery(r.r.db(ctx), r.r.dialect, f).Find(&rows).Error; err != nil {
		return nil, err
	}
	return r.r.operations(ctx, rows)
}

// listQuery is the listing's statement. The family and target_kind
// filters have no index of their own (migration 00021): Registry.Narrow
// turns family, kind and target_kind into the (kind, target kind) pairs
// they leave possible, each an exact range of operations_kind_target,
// written as literals so that even a generic plan tells a rare kind from
// a common one. With no other filter that an index narrows, each pair is
// its own newest-first branch, limited, and the branches merge (a rare
// family finds its rows in its few ranges, a common one its first page at
// the top of its ranges, the cursor bounding each); with one (an id, a
// target, a parent, an open state) that index leads and the filters'
// columns are compared on its few rows (on SQLite, named:
// sqliteListIndex).
func listQuery(g *gorm.DB, dialect string, f ledger.Filter) *gorm.DB {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	narrowed := f.RequestID != "" || f.OperationID != "" || f.ParentID != "" || f.TargetID != "" ||
		(f.State != "" && !f.State.Terminal())
	kinds := f.Kinds
	if narrowed && len(kinds) > 0 {
		kinds = nil
	}
	if len(kinds) < 2 {
		q := g.Model(&Operation{})
		if idx := sqliteListIndex(f); dialect == SQLite && idx != "" {
			q = q.Table("operations INDEXED BY " + idx)
		}
		return listWhere(q, f, kinds).Order("seq DESC").Limit(limit)
	}
	branches := make([]string, len(kinds))
	args := make([]any, 0, len(kinds)+1)
	for i, k := range kinds {
		branches[i] = "SELECT * FROM (?) AS k" + strconv.Itoa(i)
		b := listWhere(g.Session(&gorm.Session{NewDB: true}).Model(&Operation{}), f, []ledger.KindTarget{k})
		args = append(args, b.Order("seq DESC").Limit(limit))
	}
	return g.Raw(strings.Join(branches, " UNION ALL ")+" ORDER BY seq DESC LIMIT ?", append(args, limit)...)
}

// sqliteListIndex is the index a narrowed listing leads with on SQLite,
// which plans without statistics (nothing analyzes the embedded database).
// Its heuristics count equal columns: they took operations_kind_target for
// a kind and a target id, and operations_ended for a parent's children in
// an ended state — a kind's or a state's whole history read for a node's or
// a fan-out's few rows — and flipped between the two with the cursor.
// Postgres chooses from its statistics (docs/ledger-plans.md). "" leaves
// the choice to SQLite: an operation id is a unique key, which it always
// takes, and without a narrowing filter the branches above decide.
func sqliteListIndex(f ledger.Filter) string {
	switch {
	case f.OperationID != "":
		return ""
	case f.RequestID != "":
		return "operations_request"
	case f.ParentID != "":
		return "operations_parent"
	case f.TargetID != "":
		return "operations_target_id"
	case f.State != "" && !f.State.Terminal():
		return "operations_open"
	}
	return ""
}

// listWhere is the listing's conditions, kinds (when not nil: none, or
// one pair of a branch) standing for the family, kind and target_kind
// filters.
func listWhere(q *gorm.DB, f ledger.Filter, kinds []ledger.KindTarget) *gorm.DB {
	eq := func(col, v string) {
		if v != "" {
			q = q.Where(col+" = ?", v)
		}
	}
	eq("principal_kind", string(f.PrincipalKind))
	eq("principal_id", f.PrincipalID)
	switch {
	case kinds == nil:
		eq("family", f.Family)
		eq("kind", f.Kind)
		eq("target_kind", f.TargetKind)
	case len(kinds) == 0:
		q = q.Where("1 = 0")
	case len(kinds) == 1:
		q = q.Where(kindTargetSQL(kinds[0]))
	default:
		panic("listWhere: one pair a branch")
	}
	if f.State != "" {
		// No index reads state (migration 00017: a first delivery's update
		// stays HOT): an ended state is end_state's, an open one is
		// filtered among the open operations (operations_open, whose
		// predicate end_state IS NULL names: migration 00020).
		if f.State.Terminal() {
			q = q.Where("end_state = ?", string(f.State))
		} else {
			q = q.Where("terminal = FALSE AND end_state IS NULL AND state = ?", string(f.State))
		}
	}
	eq("request_id", f.RequestID)
	eq("id", f.OperationID)
	eq("parent_id", f.ParentID)
	eq("target_id", f.TargetID)
	if f.Before > 0 {
		q = q.Where("seq < ?", f.Before)
	}
	return q
}

// kindTargetSQL is the condition that matches the pair, its names (the
// registry's, never a request's) written as SQL string literals.
func kindTargetSQL(k ledger.KindTarget) string {
	lit := func(v string) string { return "'" + strings.ReplaceAll(v, "'", "''") + "'" }
	if k.TargetKind == "" {
		return "kind = " + lit(k.Kind)
	}
	return "kind = " + lit(k.Kind) + " AND target_kind = " + lit(k.TargetKind)
}

func (r ledgerReader) Events(ctx context.Context, operationID string, after int64, limit int) ([]ledger.Event, error) {
	var rows []OperationEvent
	if err := eventsQuery(r.r.db(ctx), operationID, after, limit).Find(&rows).Error; err != nil {
		return nil, err
	}
	out := make([]ledger.Event, len(rows))
	for i, e := range rows {
		out[i] = ledger.Event{Cursor: e.Seq, OperationID: e.OperationID, Type: e.Type, At: e.At.UTC(), Data: json.RawMessage(e.Data)}
	}
	return out, nil
}

func (s *LedgerStore) NodeEvents(ctx context.Context, nodeID string, limit int) ([]ledger.NodeEvent, error) {
	return s.reader().NodeEvents(ctx, nodeID, limit)
}

func (r ledgerReader) NodeEvents(ctx context.Context, nodeID string, limit int) ([]ledger.NodeEvent, error) {
	type row struct {
		OperationEvent `gorm:"embedded"`
		Kind           string
		PrincipalKind  string
		PrincipalName  string
	}
	var rows []row
	// The newest operations on the node first (its target index), then
	// their newest events.
	err := r.r.db(ctx).Raw(`SELECT e.seq, e.operation_id, e.type, e.at, e.data, o.kind, o.principal_kind, o.principal_name
		FROM (SELECT id, kind, principal_kind, principal_name FROM operations
		      WHERE target_kind = ? AND target_id = ? ORDER BY seq DESC LIMIT ?) o
		JOIN operation_events e ON e.operation_id = o.id
		ORDER BY e.seq DESC LIMIT ?`, ledger.TargetNode, nodeID, limit, limit).Scan(&rows).Error
	if err != nil {
		return nil, err
	}
	out := make([]ledger.NodeEvent, len(rows))
	for i, e := range rows {
		out[i] = ledger.NodeEvent{
			Event: ledger.Event{Cursor: e.Seq, OperationID: e.OperationID, Type: e.Type, At: e.At.UTC(), Data: json.RawMessage(e.Data)},
			Kind:  e.Kind, PrincipalKind: ledger.PrincipalKind(e.PrincipalKind), PrincipalName: e.PrincipalName,
		}
	}
	return out, nil
}

func eventsQuery(g *gorm.DB, operationID string, after int64, limit int) *gorm.DB {
	if limit <= 0 {
		limit = 500
	}
	return g.Where("operation_id = ? AND seq > ?", operationID, after).Order("seq").Limit(limit)
}

// Tx.

func (t *ledgerTx) Fleet() fleet.Tx { return t.ftx }

// Auth is the administrators' store over this same transaction.
func (t *ledgerTx) Auth() auth.Store { return authStoreIn(t.ftx.store.db, t.ftx) }

// Secrets is the sealed secrets' store over this same transaction.
func (t *ledgerTx) Secrets() secrets.Tx { return secretsTx{r: t.ftx.fleetReader} }

func (t *ledgerTx) LockKey(ctx context.Context, key string) error {
	if t.r.dialect != Postgres {
		return nil // SQLite transactions already hold the one write lock
	}
	if err := t.ftx.strayKey(key); err != nil {
		return err
	}
	return t.r.db(ctx).Exec("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", key).Error
}

func (t *ledgerTx) LockOperation(ctx context.Context, id string) (ledger.Operation, error) {
	return t.lockOperation(ctx, id, operationByIDSQLite, lockOperationByIDPostgres)
}

func (t *ledgerTx) LockParent(ctx context.Context, id string) (ledger.Operation, error) {
	return t.lockOperation(ctx, id, lockParentSQLite, lockParentPostgres)
}

func (t *ledgerTx) lockOperation(ctx context.Context, id, sqlite, postgres string) (ledger.Operation, error) {
	row, err := t.r.operationByID(ctx, id, sqlite, postgres)
	if err != nil {
		return ledger.Operation{}, err
	}
	if err := t.strayOperation(row); err != nil {
		return ledger.Operation{}, err
	}
	return t.r.operation(ctx, row)
}

// strayOperation is fleetTx.stray for an operation's row: one node's
// operation is that node's row; any other (a fan-out's parent) belongs
// only to a transaction routed to it (fleet.OnOperation), or to none.
func (t *ledgerTx) strayOperation(row Operation) error {
	r := t.ftx.route
	switch {
	case r == nil:
		return nil
	case row.TargetKind == ledger.TargetNode:
		return t.ftx.stray(row.TargetID)
	case r.Node == "" && r.Operation == row.ID:
		return nil
	}
	*r.strayed = true
	return errStrayed
}

func (t *ledgerTx) InsertOperation(ctx context.Context, op *ledger.Operation, events ...ledger.Event) error {
	if t.r.later.hold(op, events) {
		return nil // its command's insert records it (later.go)
	}
	return insertOperation(t.r.db(ctx), op, events)
}

// insertOperationSQLite is insertOperation's first statement on SQLite:
// a fixed statement (one kept statement) with the columns
// insertOperationStatement names. GORM's Create reflected over the row,
// most of a submit's cost on SQLite, and its Raw(…).Scan renders the
// statement with every value for its trace recorder, logging off or not.
var insertOperationSQLite = `INSERT INTO operations (` + operationColumns + `) VALUES (` + placeholders(operationValueCount) + `) RETURNING seq`

func (t *ledgerTx) UpdateOperation(ctx context.Context, op ledger.Operation) error {
	row := rowFromOperation(op)
	return t.r.db(ctx).Model(&Operation{}).Where("id = ?", op.ID).Select(
		"state", "terminal", "attempt", "held", "counts", "result", "error_code", "error_message", "error_retryable",
		"evidence", "cancel_requested_at", "cancel_reason", "owner", "accepted_at", "finished_at", "updated_at",
	).Updates(&row).Error
}

// ExpectNodeCount: on Postgres the command's insert counts too (issueSQL);
// SQLite counts with a statement of its own, in-process.
func (t *ledgerTx) ExpectNodeCount(nodeID, operationID string, except []string) {
	if t.r.dialect == Postgres {
		t.r.later.expectCount(nodeID, operationID, except)
	}
}

func (t *ledgerTx) CountOpenForNode(ctx context.Context, nodeID string, except []string) (int, error) {
	if n, ok := t.r.later.counted(nodeID, except); ok {
		return n, nil
	}
	var n int64
	if t.r.dialect == Postgres {
		// The count the submit's command insert takes (issueSQL), on its
		// own: it takes the node's quota lock first (migration 00025).
		// Sent around GORM (sqlpath.go).
		if except == nil {
			except = []string{}
		}
		err := eachRow(t.r.db(ctx), countOpenForNodeSQL, []any{nodeID, except}, func(rows *sql.Rows) error { return rows.Scan(&n) })
		return int(n), err
	}
	// Sent around GORM (sqlpath.go): every submit of a node-targeted
	// kind counts, and GORM's Count ran its builder and callbacks.
	q, args := countOpenForNodeSQLite(nodeID, except)
	err := eachRow(t.r.db(ctx), q, args, func(rows *sql.Rows) error { return rows.Scan(&n) })
	return int(n), err
}

// countOpenForNodeSQLite is CountOpenForNode's statement on SQLite and its
// arguments: the node's open operations, the exempt kinds left out.
func countOpenForNodeSQLite(nodeID string, except []string) (string, []any) {
	q := `SELECT COUNT(*) FROM operations WHERE target_id = ? AND terminal = FALSE AND target_kind = ?`
	args := []any{nodeID, ledger.TargetNode}
	if len(except) > 0 {
		in, kinds := inList(except)
		q += ` AND kind NOT IN (` + in + `)`
		args = append(args, kinds...)
	}
	return q, args
}

// countOpenForNodeSQL is CountOpenForNode's statement on Postgres: no
// operation left out (none has the empty id).
var countOpenForNodeSQL = numbered(`SELECT nodeward_open_for_node(?, '', ?::text[])`)

// openForNodeFunctionSQL is the count nodeward_open_for_node runs once it
// holds the node's quota lock (migrations 00024, 00025), with its
// parameters numbered: the node, the operation left out, the exempt
// kinds. The query-plan tool explains it (LedgerStatements).
const openForNodeFunctionSQL = `SELECT count(*) FROM operations
		WHERE target_id = $1 AND terminal = FALSE AND target_kind = 'node'
			AND id <> $2 AND kind <> ALL ($3::text[])`

// CountOpenForNodes counts in one statement sent around GORM (sqlpath.go):
// every fan-out release of node commands runs it. On Postgres the nodes
// and the exempt kinds are arrays, so the statement has one text whatever
// their number, prepared and planned once per connection (as an IN list,
// each length of a release was a statement of its own, planned afresh:
// 23 texts in one fan-out run). SQLite, which has no arrays, takes IN
// lists.
func (t *ledgerTx) CountOpenForNodes(ctx context.Context, nodeIDs []string, except []string) (map[string]int, error) {
	out := make(map[string]int, len(nodeIDs))
	if len(nodeIDs) == 0 {
		return out, nil
	}
	q, args := countOpenForNodesSQL, []any{nodeIDs, except}
	if except == nil {
		args[1] = []string{}
	}
	if t.r.dialect != Postgres {
		q, args = countOpenForNodesSQLite(nodeIDs, except)
	}
	err := eachRow(t.r.db(ctx), q, args, func(rows *sql.Rows) error {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return err
		}
		out[id] = n
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// countOpenForNodesSQL is CountOpenForNodes's statement on Postgres: the
// nodes, then the exempt kinds.
const countOpenForNodesSQL = `SELECT target_id, count(*) FROM operations
		WHERE target_id = ANY($1::text[]) AND terminal = FALSE AND target_kind = 'node' AND kind <> ALL ($2::text[])
		GROUP BY target_id`

// countOpenForNodesSQLite is CountOpenForNodes's statement on SQLite and
// its arguments.
func countOpenForNodesSQLite(nodeIDs, except []string) (string, []any) {
	in, args := inList(nodeIDs)
	q := `SELECT target_id, count(*) FROM operations WHERE target_id IN (` + in + `) AND terminal = FALSE AND target_kind = ?`
	args = append(args, ledger.TargetNode)
	if len(except) > 0 {
		kin, kinds := inList(except)
		q += ` AND kind NOT IN (` + kin + `)`
		args = append(args, kinds...)
	}
	return q + ` GROUP BY target_id`, args
}

func (t *ledgerTx) CountOpenForPrincipal(ctx context.Context, p ledger.Principal) (int, error) {
	var n int64
	err := openForPrincipalQuery(t.r.db(ctx), p).Count(&n).Error
	return int(n), err
}

func openForPrincipalQuery(g *gorm.DB, p ledger.Principal) *gorm.DB {
	return g.Model(&Operation{}).
		Where("principal_kind = ? AND principal_id = ? AND terminal = FALSE AND parent_id IS NULL", string(p.Kind), p.ID)
}

func (t *ledgerTx) AppendEvents(ctx context.Context, events ...ledger.Event) error {
	return appendEvents(t.r.db(ctx), events)
}

func appendEvents(g *gorm.DB, events []ledger.Event) error {
	// Every command writes two or three events, and GORM's Exec ran its
	// builder and callbacks for each (insertRows says how they go now).
	args := make([]any, 0, eventColumnCount*len(events))
	for _, e := range events {
		data := string(e.Data)
		if data == "" {
			data = "{}"
		}
		args = append(args, e.OperationID, e.Type, dbtime.Norm(e.At), data)
	}
	return insertRows(g, "operation_events", eventColumns, eventColumnCount, args)
}

// eventColumns are the columns appendEvents writes.
const (
	eventColumns     = `operation_id, type, at, data`
	eventColumnCount = 4
)

func (t *ledgerTx) Notify(ctx context.Context, operationID string) error {
	return t.ftx.Notify(ctx, fleet.Notification{Kind: fleet.NotifyOperation, NodeID: operationID})
}

func (t *ledgerTx) NotifyDispatch(ctx context.Context, operationID string) error {
	return t.ftx.Notify(ctx, fleet.Notification{Kind: fleet.NotifyDispatch, NodeID: operationID})
}

func (t *ledgerTx) NotifyParent(ctx context.Context, parentID string) error {
	*t.ftx.notes = append(*t.ftx.notes, fleet.Notification{Kind: fleet.NotifyChildEnded, NodeID: parentID})
	return nil
}

func (t *ledgerTx) Savepoint(ctx context.Context, fn func() error) error {
	t.savepoints++
	name := "ledger_sp" + strconv.Itoa(t.savepoints)
	g := t.r.db(ctx)
	if err := g.SavePoint(name).Error; err != nil {
		return err
	}
	notes := len(*t.ftx.notes)
	if err := fn(); err != nil {
		*t.ftx.notes = (*t.ftx.notes)[:notes]
		if rerr := g.RollbackTo(name).Error; rerr != nil {
			return rerr
		}
		return err
	}
	return nil
}

// Store.

// Claim takes pending local operations in one statement: on Postgres the
// rows are locked with SKIP LOCKED, so concurrent dispatchers on other
// replicas pass over each other's claims instead of waiting or sharing, and
// the running events are written by the same statement.
func (s *LedgerStore) Claim(ctx context.Context, replica string, now time.Time, limit int) ([]ledger.Operation, error) {
	now = dbtime.Norm(now)
	// A claim is stamped no earlier than its operation's submission: the
	// dispatcher reads its clock before the statement sees the queue, and
	// an operation submitted in between would otherwise start before it
	// was created (by a test's advanced clock, by 91 days: pruned as old).
	later := "GREATEST"
	if s.fleet.dialect != Postgres {
		later = "MAX" // SQLite's scalar max of its arguments
	}
	// Mirrors ledger.CanTransition(pending, running).
	claim := `UPDATE operations
			SET state = 'running', owner = ?, attempt = attempt + 1,
			    accepted_at = COALESCE(accepted_at, ` + later + `(?, created_at)), updated_at = ` + later + `(?, created_at)
			WHERE seq IN (` + claimQueueSQL(s.fleet.dialect) + `) RETURNING *`
	var rows []Operation
	if s.fleet.dialect == Postgres {
		err := s.fleet.db.WithContext(ctx).Raw(`WITH c AS (`+claim+`),
			ev AS (
				INSERT INTO operation_events (operation_id, type, at, data)
				SELECT c.id, 'running', c.updated_at, json_build_object('owner', c.owner, 'attempt', c.attempt)::text FROM c
				RETURNING 1)
			SELECT * FROM c`, replica, now, now, limit).Scan(&rows).Error
		if err != nil {
			return nil, err
		}
		sort.Slice(rows, func(i, j int) bool { return rows[i].Seq < rows[j].Seq })
		return s.fleet.fleetReader.operations(ctx, rows)
	}
	var out []ledger.Operation
	err := s.Tx(ctx, func(tx ledger.Tx) error {
		t := tx.(*ledgerTx)
		rows = rows[:0]
		if err := t.r.db(ctx).Raw(claim, replica, now, now, limit).Scan(&rows).Error; err != nil {
			return err
		}
		sort.Slice(rows, func(i, j int) bool { return rows[i].Seq < rows[j].Seq })
		var err error
		if out, err = t.r.operations(ctx, rows); err != nil {
			return err
		}
		events := make([]ledger.Event, len(out))
		for i, op := range out {
			data, _ := json.Marshal(map[string]any{"owner": replica, "attempt": op.Attempt})
			events[i] = ledger.Event{OperationID: op.ID, Type: ledger.EventRunning, At: op.UpdatedAt, Data: data}
		}
		return appendEvents(t.r.db(ctx), events)
	})
	return out, err
}

// claimQueueSQL selects the seqs Claim takes (one argument: the limit); on
// Postgres the rows are locked with SKIP LOCKED.
func claimQueueSQL(dialect string) string {
	q := `SELECT seq FROM operations WHERE terminal = FALSE AND channel = 'local' AND held = FALSE AND state = 'pending'
		ORDER BY seq LIMIT ?`
	if dialect == Postgres {
		q += " FOR UPDATE SKIP LOCKED"
	}
	return q
}

// RenewOwner upserts the replica's lease.
func (s *LedgerStore) RenewOwner(ctx context.Context, replica string, until time.Time) error {
	return s.fleet.db.Write(ctx, func(g *gorm.DB) error {
		return g.Exec(`INSERT INTO operation_owners (replica, expires_at) VALUES (?, ?)
			ON CONFLICT (replica) DO UPDATE SET expires_at = excluded.expires_at`, replica, dbtime.Norm(until)).Error
	})
}

// DropOwner deletes the replica's lease.
func (s *LedgerStore) DropOwner(ctx context.Context, replica string) error {
	return s.fleet.db.Write(ctx, func(g *gorm.DB) error {
		return g.Exec(`DELETE FROM operation_owners WHERE replica = ?`, replica).Error
	})
}

// DropOwners deletes the leases of the owners named prefix… but except
// (substr, not LIKE: a replica's name may hold LIKE's wildcards).
func (s *LedgerStore) DropOwners(ctx context.Context, prefix, except string) error {
	return s.fleet.db.Write(ctx, func(g *gorm.DB) error {
		return g.Exec(`DELETE FROM operation_owners WHERE substr(replica, 1, ?) = ? AND replica <> ?`,
			len([]rune(prefix)), prefix, except).Error
	})
}

// Orphans answers running local operations whose owner has no current
// lease.
func (s *LedgerStore) Orphans(ctx context.Context, except string, now time.Time, limit int) ([]ledger.Operation, error) {
	var rows []Operation
	err := s.fleet.db.WithContext(ctx).Raw(orphansSQL, except, dbtime.Norm(now), limit).Scan(&rows).Error
	if err != nil {
		return nil, err
	}
	return s.fleet.fleetReader.operations(ctx, rows)
}

// orphansSQL: a fan-out parent has no owner once its children are
// recorded; one still owned was being recorded (ledger.executeFanOut).
//
// The scan reads operations_owned — the open local operations — whatever
// the statistics: the owner is asked for as a range (greater than the
// empty string, which sorts first: the same rows as "not empty", the
// column being never NULL), and "+seq" keeps SQLite from walking the
// table in seq order to save the sort, which it did without statistics
// (it never gathers them itself): every operation kept for 90 days, on
// every replica every 5 s (BENCHMARKS.md, twenty-third sitting).
const orphansSQL = `SELECT * FROM operations
		WHERE terminal = FALSE AND channel = 'local' AND state = 'running' AND owner > '' AND owner <> ?
		  AND owner NOT IN (SELECT replica FROM operation_owners WHERE expires_at > ?)
		ORDER BY +seq LIMIT ?`

// ChildCounts counts a parent's children by state, and those held.
func (t *ledgerTx) ChildCounts(ctx context.Context, parentID string) (map[ledger.State]int, int, error) {
	type row struct {
		State   string
		Held    bool
		Missing bool
		N       int
	}
	var rows []row
	err := t.r.db(ctx).Raw(childCountsSQL, parentID).Scan(&rows).Error
	out, held := map[ledger.State]int{}, 0
	for _, r := range rows {
		out[ledger.State(r.State)] += r.N
		if r.Missing {
			out[ledger.CountCapabilityMissing] += r.N
		}
		if r.Held {
			held += r.N
		}
	}
	return out, held, err
}

// OpenNodeOperations answers a node's operations not yet ended, locked.
func (t *ledgerTx) OpenNodeOperations(ctx context.Context, nodeID string) ([]ledger.Operation, error) {
	var rows []Operation
	q := t.r.db(ctx).Where("target_id = ? AND terminal = FALSE AND target_kind = ?", nodeID, ledger.TargetNode).Order("seq")
	err := t.r.forUpdate(q).Find(&rows).Error
	if err != nil {
		return nil, err
	}
	return t.r.operations(ctx, rows)
}

// The third column singles out children that failed capability_missing
// (ledger.CountCapabilityMissing).
const childCountsSQL = `SELECT state, held, COALESCE(error_code, '') = 'capability_missing' AS missing, COUNT(*) AS n
	FROM operations WHERE parent_id = ? GROUP BY state, held, missing`

// insertBatch bounds the rows of one multi-row insert: an operation binds
// about 30 parameters; Postgres takes at most 65,535 per statement, SQLite
// 32,766.
const insertBatch = 500

// InsertOperations records a fan-out's children with one multi-row insert
// per insertBatch operations and as many for their events, not a statement
// each.
func (t *ledgerTx) InsertOperations(ctx context.Context, ops []ledger.Operation, events []ledger.Event) error {
	if len(ops) == 0 {
		return nil
	}
	args := make([]any, 0, operationValueCount*len(ops))
	// A fan-out's children carry one operation: they share one string of
	// it, not a copy each (a 250 KB document over 10,000 children was
	// 2.5 GB held at once), and from sharedBodyMin bytes one stored copy,
	// named by digest (operation_bodies.go).
	var text string
	var digest *string
	var from json.RawMessage
	shared := map[string]string{}
	for _, op := range ops {
		body := op.Operation
		op.Operation = nil
		r := rowFromOperation(op)
		if from == nil || !bytes.Equal(body, from) {
			text, from, digest = string(body), body, nil
			if len(text) >= sharedBodyMin {
				d := bodyDigest(text)
				shared[d], digest = text, &d
			}
		}
		if digest == nil {
			r.Operation = text
		}
		r.BodyDigest = digest
		args = append(args, operationValues(r)...)
	}
	if err := useBodies(t.r.db(ctx), shared, ops[0].CreatedAt); err != nil {
		return err
	}
	if err := insertRows(t.r.db(ctx), "operations", operationColumns, operationValueCount, args); err != nil {
		if isDuplicate(err) {
			return ledger.ErrDuplicate
		}
		return err
	}
	return appendEvents(t.r.db(ctx), events)
}

// ReleaseChildren implements ledger.Tx: one UPDATE … RETURNING of the
// named rows, which the caller locked (in id order), so it takes no lock
// of its own.
func (t *ledgerTx) ReleaseChildren(ctx context.Context, ids []string, now time.Time) ([]ledger.Operation, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	var rows []Operation
	err := t.r.db(ctx).Raw(`UPDATE operations SET held = FALSE, updated_at = ? WHERE id IN ? AND held = TRUE RETURNING *`,
		dbtime.Norm(now), ids).Scan(&rows).Error
	if err != nil {
		return nil, err
	}
	out, err := t.r.operations(ctx, rows)
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// ReleaseHeld releases a parent's oldest held children in one UPDATE …
// RETURNING. The parent's row, locked by the caller, serialises every
// advance of its children, so the rows need no locking order of their
// own.
func (t *ledgerTx) ReleaseHeld(ctx context.Context, parentID string, limit int, now time.Time) ([]ledger.Operation, error) {
	if r := t.ftx.route; r != nil {
		// The children are their nodes' rows, of every lane.
		*r.strayed = true
		return nil, errStrayed
	}
	var rows []Operation
	err := t.r.db(ctx).Raw(`UPDATE operations SET held = FALSE, updated_at = ?
		WHERE seq IN (SELECT seq FROM operations WHERE parent_id = ? AND held = TRUE AND state = 'pending' ORDER BY seq LIMIT ?)
		RETURNING *`, dbtime.Norm(now), parentID, limit).Scan(&rows).Error
	if err != nil {
		return nil, err
	}
	// RETURNING answers in no promised order: oldest first, as released.
	sort.Slice(rows, func(i, j int) bool { return rows[i].Seq < rows[j].Seq })
	return t.r.operations(ctx, rows)
}

// HeldChildren reads through operations_parent, as ReleaseHeld's
// subquery does; sent around GORM (sqlpath.go), as the rows are scanned
// by hand.
func (t *ledgerTx) HeldChildren(ctx context.Context, parentID string, limit int) ([]ledger.Operation, error) {
	q := heldChildrenSQLite
	if t.r.dialect == Postgres {
		q = heldChildrenPostgres
	}
	var rows []Operation
	err := eachRow(t.r.db(ctx), q, []any{parentID, limit}, func(r *sql.Rows) error {
		rows = append(rows, Operation{})
		return r.Scan(operationDest(&rows[len(rows)-1])...)
	})
	if err != nil {
		return nil, err
	}
	return t.r.operations(ctx, rows)
}

var (
	heldChildrenSQLite = `SELECT ` + operationScanColumns + ` FROM operations
		WHERE parent_id = ? AND held = TRUE AND state = 'pending' ORDER BY seq LIMIT ?`
	heldChildrenPostgres = numbered(heldChildrenSQLite)
)

// OpenChildren answers a parent's children not yet ended, oldest first.
func (t *ledgerTx) OpenChildren(ctx context.Context, parentID string) ([]ledger.Operation, error) {
	var rows []Operation
	err := t.r.db(ctx).Where("parent_id = ? AND terminal = FALSE", parentID).Order("seq").Find(&rows).Error
	if err != nil {
		return nil, err
	}
	return t.r.operations(ctx, rows)
}

// LockOperations locks the operations of ids in id order (the order
// every other locker of several operations uses) and answers them. Each
// is one node's operation and counts as that node's rows for the write
// lanes (stray), as in LockOperation.
func (t *ledgerTx) LockOperations(ctx context.Context, ids []string) ([]ledger.Operation, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	q, args := idsStatement(t.r.dialect, lockOperationsPostgres,
		`SELECT `+operationScanColumns+` FROM operations WHERE id IN (`, `) ORDER BY id`, ids)
	var rows []Operation
	err := eachRow(t.r.db(ctx), q, args, func(r *sql.Rows) error {
		rows = append(rows, Operation{})
		return r.Scan(operationDest(&rows[len(rows)-1])...)
	})
	if err != nil {
		return nil, err
	}
	for _, row := range rows {
		if err := t.strayOperation(row); err != nil {
			return nil, err
		}
	}
	return t.r.operations(ctx, rows)
}

// lockOperationsPostgres is LockOperations's statement on Postgres, sent
// around GORM (sqlpath.go): a fan-out's children are locked with it as
// their agents' results end them. The ids are an array, so the statement
// has one text whatever their number.
const lockOperationsPostgres = `SELECT ` + operationScanColumns + ` FROM operations WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE`

// Unrecorded reads the parent's children through operations_parent and
// looks each up in commands by its key: a fan-out's children, a few
// thousand rows at most, and only when a recording was cut short.
func (t *ledgerTx) Unrecorded(ctx context.Context, parentID string, kinds []string) ([]ledger.Operation, error) {
	if len(kinds) == 0 {
		return nil, nil
	}
	var rows []Operation
	err := t.r.db(ctx).Raw(`SELECT * FROM operations o
		WHERE o.parent_id = ? AND o.terminal = FALSE AND o.held = FALSE AND o.state = 'pending' AND o.kind IN ?
		  AND NOT EXISTS (SELECT 1 FROM commands c WHERE c.operation_id = o.id)
		ORDER BY o.seq`, parentID, kinds).Scan(&rows).Error
	if err != nil {
		return nil, err
	}
	return t.r.operations(ctx, rows)
}

// WriteLane answers the lane of the group commit a node's transactions
// are routed to (0 without lanes: SQLite, or one lane).
func (s *LedgerStore) WriteLane(nodeID string) int {
	if n := len(s.fleet.group.lanes); n > 0 {
		return laneOf(nodeID, n)
	}
	return 0
}

func (s *LedgerStore) WriteLanes() int { return len(s.fleet.group.lanes) }

// FanningOut answers the ids of running fan-out parents.
func (s *LedgerStore) FanningOut(ctx context.Context, limit int) ([]string, error) {
	var ids []string
	err := s.fleet.db.WithContext(ctx).Raw(fanningOutSQL, limit).Scan(&ids).Error
	return ids, err
}

const fanningOutSQL = `SELECT id FROM operations WHERE terminal = FALSE AND counts IS NOT NULL AND state = 'running' ORDER BY seq LIMIT ?`

// Overdue answers undelivered node operations past their deadline.
func (s *LedgerStore) Overdue(ctx context.Context, now time.Time, limit int) ([]ledger.Operation, error) {
	var rows []Operation
	err := s.fleet.db.WithContext(ctx).Raw(overdueSQL, dbtime.Norm(now), limit).Scan(&rows).Error
	if err != nil {
		return nil, err
	}
	return s.fleet.fleetReader.operations(ctx, rows)
}

// overdueSQL: undelivered node operations, and configure operations
// delivered (running) but not yet reported, through the partial index of
// open long_poll operations by deadline (operations_waiting; configure
// kinds are long_poll). That index also holds delivered commands, which
// wait for their node's answer past their deadline: the state filter
// passes over them.
const overdueSQL = `SELECT * FROM operations
		WHERE terminal = FALSE AND channel = 'long_poll' AND (state = 'pending' OR kind = 'node.configure')
		  AND deadline < ?
		ORDER BY deadline LIMIT ?`

// pruneLock is the advisory lock that makes pruning a singleton across
// replicas, one per schema (as sweepLock).
const pruneLock = `hashtextextended('nodeward.prune.' || current_schema(), 0)`

// Prune deletes what retention no longer keeps, in bounded batches.
func (s *LedgerStore) Prune(ctx context.Context, opsBefore, eventsBefore time.Time, batch int) (int, int, bool, error) {
	var ops, events int
	pruned := true
	err := s.Tx(ctx, func(tx ledger.Tx) error {
		g := tx.(*ledgerTx).r.db(ctx)
		if s.fleet.dialect == Postgres {
			var got bool
			if err := g.Raw("SELECT pg_try_advisory_xact_lock(" + pruneLock + ")").Scan(&got).Error; err != nil {
				return err
			}
			if !got {
				pruned = false
				return nil
			}
		}
		var ids []string
		if err := g.Raw(pruneOperationsSQL, s.Statements().PruneOperations(opsBefore, batch).Args...).Scan(&ids).Error; err != nil {
			return err
		}
		if len(ids) > 0 {
			if err := g.Exec(`DELETE FROM operation_events WHERE operation_id IN ?`, ids).Error; err != nil {
				return err
			}
			// Settled commands go with their operations (DECISIONS.md §41);
			// a node's reconciliation answers from what remains.
			if err := g.Exec(`DELETE FROM commands WHERE operation_id IN ? AND state <> 'pending'`, ids).Error; err != nil {
				return err
			}
			res := g.Exec(`DELETE FROM operations WHERE id IN ?`, ids)
			if res.Error != nil {
				return res.Error
			}
			ops = int(res.RowsAffected)
		}
		if err := pruneBodies(g, opsBefore, batch); err != nil {
			return err
		}
		if err := pruneConfigDocuments(g, batch); err != nil {
			return err
		}
		res := g.Exec(`DELETE FROM operation_events WHERE seq IN (`+pruneEventsSQL+`)`, batch, dbtime.Norm(eventsBefore))
		events = int(res.RowsAffected)
		if res.Error != nil {
			return res.Error
		}
		// Leases of processes gone long ago (every crash leaves one), once
		// nothing they ran is left running.
		return g.Exec(`DELETE FROM operation_owners WHERE expires_at < ?
			AND replica NOT IN (SELECT owner FROM operations WHERE terminal = FALSE AND channel = 'local' AND state = 'running')`,
			dbtime.Norm(eventsBefore)).Error
	})
	if err != nil || !pruned {
		return 0, 0, pruned, err
	}
	return ops, events, true, nil
}

// Prune's selects: the ended operations it deletes, and the expired events.
const (
	// The oldest ended operations: the oldest of each end state (a range
	// of operations_ended_finished each, migration 00021), merged.
	// Arguments: the cut-off and the batch, per end state, then the batch.
	pruneOperationsSQL = `SELECT id FROM (` + pruneEndedSQL + `'succeeded'` + pruneEndedTail +
		` UNION ALL ` + pruneEndedSQL + `'failed'` + pruneEndedTail +
		` UNION ALL ` + pruneEndedSQL + `'cancelled'` + pruneEndedTail + `) AS ended ORDER BY finished_at LIMIT ?`
	pruneEndedSQL  = `SELECT * FROM (SELECT id, finished_at FROM operations WHERE end_state = `
	pruneEndedTail = ` AND finished_at < ? ORDER BY finished_at LIMIT ?) AS e`
	// The oldest events by seq (the primary key's start), those of them
	// expired: events are appended as they happen, so seq order is time
	// order (up to the clock skew between replicas) and the expired ones
	// are the table's head. An index on at, written three times per
	// command, served only this (migration 00018). An event behind a
	// whole batch of newer ones waits until they expire: kept longer,
	// never pruned early. Arguments: the batch, then the cut-off.
	pruneEventsSQL = `SELECT seq FROM (SELECT seq, at FROM operation_events ORDER BY seq LIMIT ?) AS oldest WHERE at < ?`
)

// CountOpen answers how many operations are pending and running (the
// partial indexes answer it without reading ended rows; end_state IS NULL
// names operations_open's predicate, migration 00020).
func (s *LedgerStore) CountOpen(ctx context.Context) (map[ledger.State]int64, error) {
	type row struct {
		State string
		N     int64
	}
	var rows []row
	err := s.fleet.db.WithContext(ctx).Raw(countOpenSQL).Scan(&rows).Error
	out := map[ledger.State]int64{ledger.StatePending: 0, ledger.StateRunning: 0}
	for _, r := range rows {
		out[ledger.State(r.State)] = r.N
	}
	return out, err
}

const countOpenSQL = `SELECT state, COUNT(*) AS n FROM operations WHERE terminal = FALSE AND end_state IS NULL GROUP BY state`

// Summarize answers the overview's counts of operations in one statement:
// the open states among the open operations created since recentSince
// (operations_open: no index tells pending from running, migration 00017;
// end_state IS NULL names its predicate, migration 00020), and the ended
// states, each one range of operations_ended_finished (the states written
// as literals so each subquery is its own index range; migration 00021):
// ended since recentSince, and failed since failedSince. The ranges carry
// an upper bound no row reaches: a generic plan cannot see the lower
// bound's value and guesses a third of the table for a one-sided range (a
// parallel sequential scan at a million operations, docs/ledger-plans.md),
// but a small share for a two-sided one, so it keeps the index.
func (s *LedgerStore) Summarize(ctx context.Context, recentSince, failedSince time.Time) (ledger.Summary, error) {
	var row struct {
		Pending, Running, Succeeded, Failed, Cancelled, FailedRecently int64
	}
	st := s.Statements().Summarize(recentSince, failedSince)
	err := s.fleet.db.WithContext(ctx).Raw(summarizeOpsSQL, st.Args...).Scan(&row).Error
	return ledger.Summary{RecentByState: map[ledger.State]int64{
		ledger.StatePending: row.Pending, ledger.StateRunning: row.Running, ledger.StateSucceeded: row.Succeeded,
		ledger.StateFailed: row.Failed, ledger.StateCancelled: row.Cancelled,
	}, Failed: row.FailedRecently}, err
}

const summarizeOpsSQL = `SELECT
 (SELECT COUNT(*) FROM operations WHERE terminal = FALSE AND end_state IS NULL AND state = 'pending' AND created_at >= ?) AS pending,
 (SELECT COUNT(*) FROM operations WHERE terminal = FALSE AND end_state IS NULL AND state = 'running' AND created_at >= ?) AS running,
 (SELECT COUNT(*) FROM operations WHERE end_state = 'succeeded' AND finished_at >= ? AND finished_at < ?) AS succeeded,
 (SELECT COUNT(*) FROM operations WHERE end_state = 'failed' AND finished_at >= ? AND finished_at < ?) AS failed,
 (SELECT COUNT(*) FROM operations WHERE end_state = 'cancelled' AND finished_at >= ? AND finished_at < ?) AS cancelled,
 (SELECT COUNT(*) FROM operations WHERE end_state = 'failed' AND finished_at >= ? AND finished_at < ?) AS failed_recently`
