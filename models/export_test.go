package models

import (
	"time"

	"gorm.io/gorm"

	"github.com/nodeward/nodeward/fleet"
)

// LaneOf is laneOf for the external tests: the write lane of a node among
// n lanes.
var LaneOf = laneOf

// GateWaiting answers how many lane batches wait for the exclusive lane
// now.
func GateWaiting(s *FleetStore) int { return int(s.group.gateWaiting.Load()) }

// QueuedExclusive answers how many requests wait in the store's exclusive
// lane for the next batch.
func QueuedExclusive(s *FleetStore) int {
	l := s.group.excl
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.pending) + len(l.finishing) + len(l.background)
}

// MaxBatch bounds one write batch's requests.
const MaxBatch = maxBatch

// MaxBackground bounds one write batch's background requests.
const MaxBackground = maxBackground

// CommandColumns, NodeColumns and OperationColumns are the column lists of
// the statements sent around GORM, in the order their rows are scanned.
const (
	CommandColumns   = commandColumns
	NodeColumns      = nodeColumns
	OperationColumns = operationScanColumns
)

// Numbered is numbered for the external tests.
var Numbered = numbered

// RenewRunSQL is the statement that renews a run of leases (Postgres).
var RenewRunSQL = renewRunSQL

// SettlePendingSQL is the settlement statement for n settlements and m
// endings (Postgres).
var SettlePendingSQL = settlePendingSQL

// StmtCacheSize bounds each SQLite pool's kept statements.
const StmtCacheSize = stmtCacheSize

// KeptStatements answers, for each SQLite pool (the readers', the
// writer's), how many statements it keeps and how many texts it has
// prepared to keep.
func KeptStatements(db *DB) (kept, prepares [2]int) {
	for i, p := range db.stmts {
		p.mu.Lock()
		kept[i] = p.lru.Len()
		p.mu.Unlock()
		prepares[i] = int(p.prepares.Load())
	}
	return kept, prepares
}

// NodeCommandsStatement is the statement of a node's commands in state
// ("" any), as the fleet store sends it, launches narrowing it to the
// launch commands LaunchCommands reads.
func NodeCommandsStatement(db *DB, nodeID string, state string, limit int, launches bool) Statement {
	var more func(g *gorm.DB) *gorm.DB
	if launches {
		more = func(g *gorm.DB) *gorm.DB { return g.Where("kind = ? AND payload LIKE ?", "launch_workload", "%h%") }
	}
	st := nodeCommandsQuery(db.DB.Session(&gorm.Session{DryRun: true, NewDB: true}), nodeID, fleet.CommandState(state), limit, more).
		Find(&[]Command{}).Statement
	return Statement{SQL: st.SQL.String(), Args: st.Vars}
}

// PoolAsked answers how many statements asked the Postgres pool's fair
// queue for a connection.
func PoolAsked(db *DB) int64 { return db.DB.ConnPool.(*fairPool).asked.Load() }

// Announce hands payloads to the store's announcer, as a committed
// transaction does.
func Announce(s *FleetStore, payloads ...string) { s.announcer.add(payloads...) }

// PruneReveals is ExpireReveals' delete of the handles past their keep.
func PruneReveals(before time.Time) Statement {
	return Statement{SQL: pruneRevealsSQL, Args: []any{revealStates(), before}}
}

// SweepLock is the lease sweep's advisory lock, as SQL (per schema).
const SweepLock = sweepLock

// RowsThatFit and StatementBytes are how multi-row statements are cut
// (sqlpath.go), for the external tests.
var RowsThatFit = rowsThatFit

const StatementBytes = statementBytes

// ForgetBodies empties this process's cache of shared operations, so a
// read must find them in the database.
func ForgetBodies() { bodyCache = newSizedLRU[string](bodyCache.max) }

// SharedBodyMin is the size from which a fan-out's children share their
// stored operation.
const SharedBodyMin = sharedBodyMin

// ForgetConfigDocuments empties the cache of shared configuration
// documents, so reads go to the database.
func ForgetConfigDocuments() { documentCache = newSizedLRU[[]byte](documentCache.max) }
