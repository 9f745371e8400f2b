package models

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"strings"

	"gorm.io/gorm"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/dbtime"
	"github.com/nodeward/nodeward/ledger"
)

// The ledger's hot writes. On Postgres each is one statement, run on its
// own (no BEGIN/COMMIT around it): the write, its events and the
// cross-replica notifications travel together, so an operation of a local
// kind costs one statement to record, a share of one to claim and a share
// of one to end. SQLite runs the same writes inside a (group-committed)
// transaction: its round trips are function calls, its cost is the fsync.

const operationColumns = `id, request_id, digest, principal_kind, principal_id, principal_name, package_host_generation,
	family, kind, state, terminal, channel, attempt, targets, target_kind, target_id, parent_id, held, counts, reason,
	operation, result, error_code, error_message, error_retryable, evidence, cancel_requested_at, cancel_reason, owner,
	created_at, accepted_at, finished_at, deadline, updated_at, body_digest`

func operationValues(r Operation) []any {
	return []any{r.ID, r.RequestID, r.Digest, r.PrincipalKind, r.PrincipalID, r.PrincipalName, r.PackageHostGeneration,
		r.Family, r.Kind, r.State, r.Terminal, r.Channel, r.Attempt, r.Targets, r.TargetKind, r.TargetID, r.ParentID, r.Held,
		r.Counts, r.Reason, r.Operation, r.Result, r.ErrorCode, r.ErrorMessage, r.ErrorRetryable, r.Evidence,
		r.CancelRequestedAt, r.CancelReason, r.Owner, r.CreatedAt, r.AcceptedAt, r.FinishedAt, r.Deadline, r.UpdatedAt, r.BodyDigest}
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

// announce hands notifications of a write made outside a fleet
// transaction to this replica's own listeners.
func (s *LedgerStore) announce(notes []fleet.Notification) {
	if len(notes) > 0 && s.fleet.onCommit != nil {
		s.fleet.onCommit(notes)
	}
}

// isDuplicate reports a unique-key violation, translated by GORM or, for
// raw statements, as Postgres's SQLSTATE 23505 or SQLite's extended codes
// SQLITE_CONSTRAINT_UNIQUE and SQLITE_CONSTRAINT_PRIMARYKEY.
func isDuplicate(err error) bool {
	var coded interface{ SQLState() string }
	var lite *sqlite.Error
	return errors.Is(err, gorm.ErrDuplicatedKey) || (errors.As(err, &coded) && coded.SQLState() == "23505") ||
		(errors.As(err, &lite) && (lite.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE || lite.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY))
}

// Insert records an operation with its events and announces it for
// dispatch.
func (s *LedgerStore) Insert(ctx context.Context, op *ledger.Operation, events ...ledger.Event) error {
	if s.fleet.dialect != Postgres {
		return s.Tx(ctx, func(tx ledger.Tx) error {
			t := tx.(*ledgerTx)
			if err := t.InsertOperation(ctx, op, events...); err != nil {
				return err
			}
			*t.ftx.notes = append(*t.ftx.notes, fleet.Notification{Kind: fleet.NotifyDispatch, NodeID: op.ID})
			return nil
		})
	}
	seq, err := insertOperationStatement(s.fleet.db.WithContext(ctx), *op, events)
	if err != nil {
		return err
	}
	op.Cursor = seq
	s.announce([]fleet.Notification{{Kind: fleet.NotifyDispatch, NodeID: op.ID}})
	s.pokeReplicas()
	return nil
}

// insertOperationStatement records op and its events in one Postgres
// statement, sent around GORM (sqlpath.go), and answers its cursor;
// ErrDuplicate on a taken id or request.
func insertOperationStatement(g *gorm.DB, op ledger.Operation, events []ledger.Event) (int64, error) {
	var seq []int64
	err := eachRow(g, insertOperationPostgresSQL(len(events)), operationArgs(op, events), func(rows *sql.Rows) error {
		seq = append(seq, 0)
		return rows.Scan(&seq[len(seq)-1])
	})
	if err != nil {
		if isDuplicate(err) {
			return 0, ledger.ErrDuplicate
		}
		return 0, err
	}
	if len(seq) != 1 {
		return 0, errors.New("insert operation: no row answered")
	}
	return seq[0], nil
}

// insertOperationPostgresSQL is insertOperationStatement's text for an
// operation with n events, built once per n.
func insertOperationPostgresSQL(n int) string {
	return insertOperationStatements.get(n, func() string {
		return numbered(`WITH ` + operationSQL(n) + ` SELECT op.seq FROM op`)
	})
}

// insertOperationStatements holds insertOperationPostgresSQL's statements
// by events count.
var insertOperationStatements statementCache[int]

// pokeReplicas tells the other replicas that work may be claimable, in
// the announcer's next statement however many submits there were (the
// payload names no operation: it only wakes dispatchers, which also
// poll): a NOTIFY in each submit would serialise every submitting commit
// on Postgres's one notification queue lock. This replica's own
// dispatcher was told at once.
func (s *LedgerStore) pokeReplicas() {
	s.fleet.announcer.add(dispatchPrefix(s.fleet.replica))
}

// dispatchPrefix is the notification payload announcing a claimable
// operation, less the id the statement appends.
func dispatchPrefix(replica string) string {
	return fleet.Notification{Kind: fleet.NotifyDispatch}.Encode(replica)
}

// Finish ends running local operations of replica in one write.
func (s *LedgerStore) Finish(ctx context.Context, replica string, ends []ledger.End) ([]ledger.Ended, error) {
	if len(ends) == 0 {
		return nil, nil
	}
	var rows []endedRow
	var notes []fleet.Notification
	note := func() {
		for _, r := range rows {
			notes = append(notes, fleet.Notification{Kind: fleet.NotifyOperation, NodeID: r.ID})
			if r.ParentID != nil {
				notes = append(notes, fleet.Notification{Kind: fleet.NotifyChildEnded, NodeID: *r.ParentID})
			}
		}
	}
	endData := func(e ledger.End) string {
		data, _ := json.Marshal(map[string]any{"from": ledger.StateRunning, "error": e.Error})
		return string(data)
	}
	if s.fleet.dialect != Postgres {
		err := s.Tx(ctx, func(tx ledger.Tx) error {
			t := tx.(*ledgerTx)
			rows = rows[:0]
			var events []ledger.Event
			for _, e := range ends {
				r := endRow(e)
				var got []endedRow
				err := t.r.db(ctx).Raw(`UPDATE operations SET state = ?, terminal = TRUE, result = ?, error_code = ?,
						error_message = ?, error_retryable = ?, finished_at = ?, updated_at = ?
					WHERE id = ? AND state = 'running' AND owner = ? RETURNING id, kind, parent_id`,
					r.State, r.Result, r.ErrorCode, r.ErrorMessage, r.ErrorRetryable, r.FinishedAt, r.UpdatedAt, e.OperationID, replica).
					Scan(&got).Error
				if err != nil {
					return err
				}
				if len(got) == 1 {
					rows = append(rows, got[0])
					events = append(events, ledger.Event{OperationID: e.OperationID, Type: string(e.State), At: e.At, Data: json.RawMessage(endData(e))})
				}
			}
			if err := appendEvents(t.r.db(ctx), events); err != nil {
				return err
			}
			notes = notes[:0]
			note()
			*t.ftx.notes = append(*t.ftx.notes, notes...)
			return nil
		})
		return ended(rows, err)
	}
	var values []string
	var args []any
	for _, e := range ends {
		r := endRow(e)
		values = append(values, "(CAST(? AS text), CAST(? AS text), CAST(? AS text), CAST(? AS text), CAST(? AS text), CAST(? AS boolean), CAST(? AS timestamptz), CAST(? AS text))")
		args = append(args, e.OperationID, r.State, r.Result, r.ErrorCode, r.ErrorMessage, r.ErrorRetryable, r.FinishedAt, endData(e))
	}
	args = append(args, replica)
	err := s.fleet.db.WithContext(ctx).Raw(`WITH v (id, state, result, code, message, retryable, at, data) AS (VALUES `+strings.Join(values, ", ")+`),
		op AS (
			UPDATE operations o SET state = v.state, terminal = TRUE, result = v.result, error_code = v.code,
				error_message = v.message, error_retryable = v.retryable, finished_at = v.at, updated_at = v.at
			FROM v WHERE o.id = v.id AND o.state = 'running' AND o.owner = ?
			RETURNING o.id, o.kind, o.parent_id, v.state, v.at, v.data),
		ev AS (
			INSERT INTO operation_events (operation_id, type, at, data)
			SELECT op.id, op.state, op.at, op.data FROM op
			RETURNING 1)
		SELECT op.id, op.kind, op.parent_id FROM op`, args...).Scan(&rows).Error
	if err == nil {
		note()
		s.announce(notes)
		for _, r := range rows {
			s.fleet.announcer.add(fleet.Notification{Kind: fleet.NotifyOperation, NodeID: r.ID}.Encode(s.fleet.replica))
		}
	}
	return ended(rows, err)
}

// endRow is the stored form of an end.
func endRow(e ledger.End) Operation {
	op := ledger.Operation{State: e.State, Result: e.Result, Error: e.Error}
	r := rowFromOperation(op)
	at := dbtime.Norm(e.At)
	r.FinishedAt, r.UpdatedAt = &at, at
	return r
}

// endedRow is an operation Finish ended.
type endedRow struct {
	ID       string
	Kind     string
	ParentID *string
}

func ended(rows []endedRow, err error) ([]ledger.Ended, error) {
	if err != nil {
		return nil, err
	}
	out := make([]ledger.Ended, len(rows))
	for i, r := range rows {
		out[i] = ledger.Ended{OperationID: r.ID, Kind: r.Kind, ParentID: deref(r.ParentID)}
	}
	return out, nil
}
