package models

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/dbtime"
	"github.com/nodeward/nodeward/ledger"
)

// A fan-out's children share their operation: InsertOperations stores
// each distinct operation of at least sharedBodyMin bytes once in
// operation_bodies and has the children's rows name it by digest
// (migration 00030), and every read of operations puts it back
// (fleetReader.operations), so the ledger's callers never see the
// difference. Smaller operations, and every operation not recorded by a
// fan-out, stay in their row: a single command's payload is its own, and
// a row of its own would add a write to the command path.
//
// OperationBody is a row of operation_bodies.
type OperationBody struct {
	Digest string `gorm:"primaryKey"`
	Body   string
	UsedAt time.Time
}

// sharedBodyMin is the size from which a fan-out's children name their
// operation instead of holding it: below it the digest and the extra row
// cost about what the copies would.
const sharedBodyMin = 1 << 10

// bodyDigest names a body: the lowercase hex SHA-256 of its text.
func bodyDigest(body string) string {
	sum := sha256.Sum256([]byte(body))
	return hex.EncodeToString(sum[:])
}

// useBodies stores the bodies of digests (digest → body) once each, and
// stamps those already stored as used at now (the fan-out's clock).
// Retention deletes a body once no operation names it and it was last
// used before the operations it deletes ended (pruneBodies), so a
// transaction that names an old body keeps it: on Postgres the stamp
// locks the row until the commit, and retention's delete, waiting for it,
// then sees the row stamped.
func useBodies(g *gorm.DB, bodies map[string]string, now time.Time) error {
	q := useBodySQLite
	if onPostgres(g) {
		q = useBodyPostgres
	}
	now = dbtime.Norm(now)
	// One statement per body: a body may be 256 KiB, and few are shared
	// at once (one per fan-out, as a rule).
	for d, b := range bodies {
		if _, err := execRows(g, q, d, b, now); err != nil {
			return fmt.Errorf("store a shared operation: %w", err)
		}
		bodyCache.put(d, b)
	}
	return nil
}

var (
	useBodySQLite = `INSERT INTO operation_bodies (digest, body, used_at) VALUES (?, ?, ?)
		ON CONFLICT (digest) DO UPDATE SET used_at = excluded.used_at`
	useBodyPostgres = numbered(useBodySQLite)
)

// nameBodies is useBodies for the commands of a fan-out's release
// (InsertCommands). The write lanes record one fan-out's commands in
// concurrent transactions that all name its payload, and useBodies' stamp
// locks the body's row until each commits: the lanes would record one
// after another. Here a body already stored is stamped only when its last
// stamp is older than bodyRestamp, with no lock otherwise. That is as safe:
// retention deletes only bodies last used before its cut-off, the
// ledger's 90 days back, so a body stamped within the hour stays until
// this transaction has committed its commands, which name it.
func nameBodies(g *gorm.DB, bodies map[string]string, now time.Time) error {
	insert, restamp := nameBodySQLite, restampBodySQLite
	if onPostgres(g) {
		insert, restamp = nameBodyPostgres, restampBodyPostgres
	}
	now = dbtime.Norm(now)
	for d, b := range bodies {
		n, err := execRows(g, insert, d, b, now)
		if err == nil && n == 0 {
			_, err = execRows(g, restamp, now, d, now.Add(-bodyRestamp))
		}
		if err != nil {
			return fmt.Errorf("store a shared payload: %w", err)
		}
		bodyCache.put(d, b)
	}
	return nil
}

// bodyRestamp is how old a stored body's stamp may be before a command
// that names it stamps it again (nameBodies).
const bodyRestamp = time.Hour

var (
	nameBodySQLite      = `INSERT INTO operation_bodies (digest, body, used_at) VALUES (?, ?, ?) ON CONFLICT (digest) DO NOTHING`
	nameBodyPostgres    = numbered(nameBodySQLite)
	restampBodySQLite   = `UPDATE operation_bodies SET used_at = ? WHERE digest = ? AND used_at < ?`
	restampBodyPostgres = numbered(restampBodySQLite)
)

// pruneBodies deletes at most batch stored bodies that no operation names
// and that were last used before cutoff (retention's cut-off for ended
// operations: a body's children were recorded when it was last used,
// and they are pruned only once they ended before the cut-off). The
// outer used_at test is the one Postgres checks again on the row's
// newest version when the delete waited for a transaction that stamped
// it (the subquery's rows are the snapshot's).
func pruneBodies(g *gorm.DB, cutoff time.Time, batch int) error {
	cutoff = dbtime.Norm(cutoff)
	return g.Exec(pruneBodiesSQL, cutoff, cutoff, batch).Error
}

// pruneBodiesSQL: whether an operation or a command names a body is one
// probe each of operations_body and commands_payload_body (the rows that
// name one).
const pruneBodiesSQL = `DELETE FROM operation_bodies WHERE used_at < ? AND digest IN (
		SELECT b.digest FROM operation_bodies b
		WHERE b.used_at < ? AND NOT EXISTS (SELECT 1 FROM operations o WHERE o.body_digest = b.digest)
			AND NOT EXISTS (SELECT 1 FROM commands c WHERE c.payload_body = b.digest)
		LIMIT ?)`

// operations answers rows as the ledger's operations, each with its
// operation put back: from this process's cache, or else in one read
// through r (the caller's transaction, which may have stored them
// itself), made only when a row names one the cache lacks.
func (r fleetReader) operations(ctx context.Context, rows []Operation) ([]ledger.Operation, error) {
	if err := r.resolveBodies(ctx, rows); err != nil {
		return nil, err
	}
	out := make([]ledger.Operation, len(rows))
	// Rows that name one stored operation share one copy of it: a
	// recording transaction reads a fan-out's children by the hundred.
	var shared map[string]json.RawMessage
	for i, row := range rows {
		d := row.BodyDigest
		if d == nil {
			out[i] = convertRow(row)
			continue
		}
		if shared == nil {
			shared = map[string]json.RawMessage{}
		}
		if body, ok := shared[*d]; ok {
			row.Operation = ""
			out[i] = convertRow(row)
			out[i].Operation = body
			continue
		}
		out[i] = convertRow(row)
		shared[*d] = out[i].Operation
	}
	return out, nil
}

// operation is operations for one row.
func (r fleetReader) operation(ctx context.Context, row Operation) (ledger.Operation, error) {
	if row.BodyDigest == nil {
		return convertRow(row), nil
	}
	rows := []Operation{row}
	if err := r.resolveBodies(ctx, rows); err != nil {
		return ledger.Operation{}, err
	}
	return convertRow(rows[0]), nil
}

func (r fleetReader) resolveBodies(ctx context.Context, rows []Operation) error {
	var digests []string
	for i := range rows {
		if d := rows[i].BodyDigest; d != nil {
			digests = append(digests, *d)
		}
	}
	if len(digests) == 0 {
		return nil
	}
	found, err := r.bodies(ctx, digests)
	if err != nil {
		return fmt.Errorf("read shared operations: %w", err)
	}
	for i := range rows {
		if d := rows[i].BodyDigest; d != nil {
			rows[i].Operation = found[*d]
		}
	}
	return nil
}

// bodies answers the stored bodies of digests: from this process's cache,
// or else in one read through r. A digest not stored is an error (a row
// names it, and retention keeps what rows name).
func (r fleetReader) bodies(ctx context.Context, digests []string) (map[string]string, error) {
	found := make(map[string]string, len(digests))
	var missing []string
	for _, d := range digests {
		if _, ok := found[d]; ok {
			continue
		}
		if b, ok := bodyCache.get(d); ok {
			found[d] = b
		} else {
			missing = append(missing, d)
		}
	}
	if len(missing) == 0 {
		return found, nil
	}
	read, err := readThrough(r.db(ctx), r.dialect, "operation_bodies", "digest", "body", missing,
		func(b string) (string, error) { return b, nil }, bodyCache)
	if err != nil {
		return nil, err
	}
	for _, d := range missing {
		b, ok := read[d]
		if !ok {
			return nil, fmt.Errorf("body %s is named but not stored", d)
		}
		found[d] = b
	}
	return found, nil
}

// bodyCache keeps shared operations this process stored or read.
var bodyCache = newSizedLRU[string](64 << 20)

// commands answers rows as the fleet's commands, each with its payload
// put back where the row names a stored body (Command.PayloadBody): from
// this process's cache, or else in one read through r. Rows naming one
// body share one copy of it: a settlement locks a fan-out's commands by
// the hundred.
func (r fleetReader) commands(ctx context.Context, rows []Command) ([]fleet.Command, error) {
	var digests []string
	for _, row := range rows {
		if d := row.PayloadBody; d != nil {
			digests = append(digests, *d)
		}
	}
	shared := map[string]json.RawMessage{}
	if len(digests) > 0 {
		found, err := r.bodies(ctx, digests)
		if err != nil {
			return nil, fmt.Errorf("read shared payloads: %w", err)
		}
		for d, b := range found {
			shared[d] = json.RawMessage(b)
		}
	}
	out := make([]fleet.Command, len(rows))
	for i, row := range rows {
		out[i] = commandFromRow(row)
		if row.PayloadBody != nil {
			out[i].Payload = shared[*row.PayloadBody]
		}
	}
	return out, nil
}

// command is commands for one row.
func (r fleetReader) command(ctx context.Context, row Command) (fleet.Command, error) {
	if row.PayloadBody == nil {
		return commandFromRow(row), nil
	}
	out, err := r.commands(ctx, []Command{row})
	if err != nil {
		return fleet.Command{}, err
	}
	return out[0], nil
}
