package models

import (
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/nodeward/nodeward/internal/dbtime"
	"github.com/nodeward/nodeward/ledger"
)

// Statement is one SQL statement as the store sends it: placeholders in
// the dialect's style and the arguments bound to them.
type Statement struct {
	SQL  string
	Args []any
}

// LedgerStatements builds, without running them, the statements the ledger
// store runs for its listing and its hot paths, with the same code the
// store uses; the query-plan tool (internal/ledgerplans) explains them.
type LedgerStatements struct {
	db      *gorm.DB
	dialect string
}

// Statements answers the builder of the store's statements.
func (s *LedgerStore) Statements() LedgerStatements {
	return LedgerStatements{db: s.fleet.db.DB, dialect: s.fleet.dialect}
}

func (q LedgerStatements) build(fn func(g *gorm.DB) *gorm.DB) Statement {
	st := fn(q.db.Session(&gorm.Session{DryRun: true, NewDB: true})).Statement
	return Statement{SQL: st.SQL.String(), Args: st.Vars}
}

func (q LedgerStatements) raw(sql string, args ...any) Statement {
	return q.build(func(g *gorm.DB) *gorm.DB { return g.Raw(sql, args...) })
}

// List is the listing's query for f.
func (q LedgerStatements) List(f ledger.Filter) Statement {
	return q.build(func(g *gorm.DB) *gorm.DB { return listQuery(g, q.dialect, f).Find(&[]Operation{}) })
}

// OperationByRequest is the idempotency lookup.
func (q LedgerStatements) OperationByRequest(p ledger.Principal, requestID string) Statement {
	return q.build(func(g *gorm.DB) *gorm.DB { return byRequestQuery(g, p, requestID).Take(&Operation{}) })
}

// Events is an operation's page of events.
func (q LedgerStatements) Events(operationID string, after int64, limit int) Statement {
	return q.build(func(g *gorm.DB) *gorm.DB { return eventsQuery(g, operationID, after, limit).Find(&[]OperationEvent{}) })
}

// CountOpenForNode is the per-node quota count (on Postgres, the query
// the store's function runs under the node's quota lock).
func (q LedgerStatements) CountOpenForNode(nodeID string, except []string) Statement {
	if q.dialect == Postgres {
		// The kinds as an array literal: the plan tool binds text.
		quoted := make([]string, len(except))
		for i, k := range except {
			quoted[i] = `"` + k + `"`
		}
		return Statement{SQL: openForNodeFunctionSQL, Args: []any{nodeID, "", "{" + strings.Join(quoted, ",") + "}"}}
	}
	sql, args := countOpenForNodeSQLite(nodeID, except)
	return q.raw(sql, args...)
}

// CountOpenForPrincipal is the per-principal quota count.
func (q LedgerStatements) CountOpenForPrincipal(p ledger.Principal) Statement {
	var n int64
	return q.build(func(g *gorm.DB) *gorm.DB { return openForPrincipalQuery(g, p).Count(&n) })
}

// ClaimQueue is the subquery of Claim's update that picks what it takes.
func (q LedgerStatements) ClaimQueue(limit int) Statement {
	return q.raw(claimQueueSQL(q.dialect), limit)
}

// Orphans is the recovery scan for operations whose owner's lease lapsed.
func (q LedgerStatements) Orphans(except string, now time.Time, limit int) Statement {
	return q.raw(orphansSQL, except, dbtime.Norm(now), limit)
}

// FanningOut is the scan for running fan-out parents.
func (q LedgerStatements) FanningOut(limit int) Statement {
	return q.raw(fanningOutSQL, limit)
}

// Overdue is the scan for undelivered node operations past their deadline.
func (q LedgerStatements) Overdue(now time.Time, limit int) Statement {
	return q.raw(overdueSQL, dbtime.Norm(now), limit)
}

// PruneOperations is Prune's select of ended operations to delete.
func (q LedgerStatements) PruneOperations(before time.Time, batch int) Statement {
	b := dbtime.Norm(before)
	return q.raw(pruneOperationsSQL, b, batch, b, batch, b, batch, batch)
}

// PruneEvents is Prune's select of expired events to delete.
func (q LedgerStatements) PruneEvents(before time.Time, batch int) Statement {
	return q.raw(pruneEventsSQL, batch, dbtime.Norm(before))
}

// PruneBodies is Prune's delete of the stored operations no operation
// names any more.
func (q LedgerStatements) PruneBodies(before time.Time, batch int) Statement {
	b := dbtime.Norm(before)
	return q.raw(pruneBodiesSQL, b, b, batch)
}

// PruneConfigDocuments is Prune's delete of the shared configuration
// documents no configuration row names.
func (q LedgerStatements) PruneConfigDocuments(batch int) Statement {
	return q.raw(pruneConfigDocumentsSQL, batch)
}

// ChildCounts is a fan-out parent's count of its children by state.
func (q LedgerStatements) ChildCounts(parentID string) Statement {
	return q.raw(childCountsSQL, parentID)
}

// Summarize is the fleet overview's count of operations.
func (q LedgerStatements) Summarize(recentSince, failedSince time.Time) Statement {
	c, f := dbtime.Norm(recentSince), dbtime.Norm(failedSince)
	never := c.AddDate(100, 0, 0) // the ended ranges' upper bound (see Summarize)
	return q.raw(summarizeOpsSQL, c, c, c, never, c, never, c, never, f, never)
}

// CountOpen is the count of pending and running operations (a metric).
func (q LedgerStatements) CountOpen() Statement {
	return q.raw(countOpenSQL)
}
