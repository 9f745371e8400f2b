package models

import (
	"context"
	"encoding/base64"
	"errors"
	"time"

	"gorm.io/gorm"

	"github.com/nodeward/nodeward/internal/dbtime"
	"github.com/nodeward/nodeward/secrets"
)

// SecretsStore implements secrets.Store over GORM for both dialects.
type SecretsStore struct{ db *DB }

var _ secrets.Store = (*SecretsStore)(nil)

// NewSecretsStore returns the secrets' store.
func NewSecretsStore(db *DB) *SecretsStore { return &SecretsStore{db: db} }

// secretsTx is the secrets' store inside another transaction (the
// ledger's submitting one).
type secretsTx struct{ r fleetReader }

var _ secrets.Tx = secretsTx{}

func sealedRow(s secrets.Sealed) SealedSecret {
	return SealedSecret{Digest: s.Digest, PrincipalKind: s.Principal.Kind, PrincipalID: s.Principal.ID,
		RequestID: s.RequestID, TargetKind: s.Target.Kind, TargetID: s.Target.ID, Field: s.Field,
		KeyID: s.KeyID, Box: base64.StdEncoding.EncodeToString(s.Box), State: string(s.State), OperationID: s.OperationID,
		CreatedAt: dbtime.Norm(s.CreatedAt), ExpiresAt: dbtime.Norm(s.ExpiresAt), UsedAt: dbtime.NormPtr(s.UsedAt)}
}

func sealedOf(r SealedSecret) (secrets.Sealed, error) {
	box, err := base64.StdEncoding.DecodeString(r.Box)
	return secrets.Sealed{Digest: r.Digest, Principal: secrets.Principal{Kind: r.PrincipalKind, ID: r.PrincipalID},
		RequestID: r.RequestID, Target: secrets.Target{Kind: r.TargetKind, ID: r.TargetID}, Field: r.Field,
		KeyID: r.KeyID, Box: box, State: secrets.State(r.State), OperationID: r.OperationID,
		CreatedAt: r.CreatedAt.UTC(), ExpiresAt: r.ExpiresAt.UTC(), UsedAt: dbtime.NormPtr(r.UsedAt)}, err
}

func auditRows(as []secrets.AuditEntry) []SecretAudit {
	out := make([]SecretAudit, len(as))
	for i, a := range as {
		out[i] = SecretAudit{At: dbtime.Norm(a.At), Action: a.Action, Outcome: a.Outcome,
			PrincipalKind: a.Principal.Kind, PrincipalID: a.Principal.ID, HandleDigest: a.HandleDigest,
			RequestID: a.RequestID, OperationID: a.OperationID, TargetKind: a.Target.Kind, TargetID: a.Target.ID, Field: a.Field}
	}
	return out
}

func insertAudit(g *gorm.DB, as []secrets.AuditEntry) error {
	if len(as) == 0 {
		return nil
	}
	rows := auditRows(as)
	return g.Create(&rows).Error
}

// Seal implements secrets.Store.
func (s *SecretsStore) Seal(ctx context.Context, rec secrets.Sealed, a secrets.AuditEntry, maxLive int) error {
	return s.db.Tx(ctx, func(g *gorm.DB) error {
		if s.db.Dialect == Postgres {
			// Serialises the principal's seals so the count holds.
			if err := g.Exec("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))",
				"sealed:"+rec.Principal.Kind+":"+rec.Principal.ID).Error; err != nil {
				return err
			}
		}
		var n int64
		if err := g.Model(&SealedSecret{}).Where("principal_kind = ? AND principal_id = ? AND state = ? AND expires_at > ?",
			rec.Principal.Kind, rec.Principal.ID, string(secrets.StateSealed), dbtime.Norm(rec.CreatedAt)).Count(&n).Error; err != nil {
			return err
		}
		if n >= int64(maxLive) {
			return secrets.ErrQuota
		}
		row := sealedRow(rec)
		if err := g.Create(&row).Error; err != nil {
			return err
		}
		return insertAudit(g, []secrets.AuditEntry{a})
	})
}

// InsertAudit implements secrets.Store.
func (s *SecretsStore) InsertAudit(ctx context.Context, a ...secrets.AuditEntry) error {
	return insertAudit(s.db.WithContext(ctx), a)
}

// Audit implements secrets.Store.
func (s *SecretsStore) Audit(ctx context.Context, f secrets.AuditFilter) ([]secrets.AuditEntry, error) {
	q := s.db.WithContext(ctx).Order("seq DESC").Limit(f.Limit)
	if f.Before > 0 {
		q = q.Where("seq < ?", f.Before)
	}
	// The ids, action and outcome each have an index ending in seq
	// (migration 00012).
	for _, c := range []struct{ col, val string }{
		{"principal_kind", f.PrincipalKind}, {"principal_id", f.PrincipalID}, {"operation_id", f.OperationID},
		{"target_kind", f.TargetKind}, {"target_id", f.TargetID}, {"action", f.Action}, {"outcome", f.Outcome},
	} {
		if c.val != "" {
			q = q.Where(c.col+" = ?", c.val)
		}
	}
	var rows []SecretAudit
	if err := q.Find(&rows).Error; err != nil {
		return nil, err
	}
	out := make([]secrets.AuditEntry, len(rows))
	for i, r := range rows {
		out[i] = secrets.AuditEntry{Cursor: r.Seq, At: r.At.UTC(), Action: r.Action, Outcome: r.Outcome,
			Principal: secrets.Principal{Kind: r.PrincipalKind, ID: r.PrincipalID}, HandleDigest: r.HandleDigest,
			RequestID: r.RequestID, OperationID: r.OperationID, Target: secrets.Target{Kind: r.TargetKind, ID: r.TargetID}, Field: r.Field}
	}
	return out, nil
}

// Purge implements secrets.Store.
func (s *SecretsStore) Purge(ctx context.Context, now time.Time, batch int) (int, error) {
	n := 0
	err := s.db.Tx(ctx, func(g *gorm.DB) error {
		var rows []SealedSecret
		if err := g.Where("expires_at <= ?", dbtime.Norm(now)).Order("expires_at").Limit(batch).Find(&rows).Error; err != nil {
			return err
		}
		if len(rows) == 0 {
			return nil
		}
		digests := make([]string, len(rows))
		var audit []secrets.AuditEntry
		for i, r := range rows {
			digests[i] = r.Digest
			if r.State == string(secrets.StateSealed) {
				audit = append(audit, secrets.AuditEntry{At: dbtime.Norm(now), Action: secrets.ActionExpire, Outcome: secrets.OutcomePurged,
					Principal: secrets.Principal{Kind: r.PrincipalKind, ID: r.PrincipalID}, HandleDigest: r.Digest[:16],
					RequestID: r.RequestID, Target: secrets.Target{Kind: r.TargetKind, ID: r.TargetID}, Field: r.Field})
			}
		}
		res := g.Where("digest IN ?", digests).Delete(&SealedSecret{})
		if res.Error != nil {
			return res.Error
		}
		n = int(res.RowsAffected)
		return insertAudit(g, audit)
	})
	return n, err
}

// Deliveries implements secrets.Store.
func (s *SecretsStore) Deliveries(ctx context.Context, operationID string) ([]secrets.Delivery, error) {
	return deliveries(s.db.WithContext(ctx), operationID)
}

// Deliveries implements secrets.Tx.
func (t secretsTx) Deliveries(ctx context.Context, operationID string) ([]secrets.Delivery, error) {
	return deliveries(t.r.db(ctx), operationID)
}

func deliveries(g *gorm.DB, operationID string) ([]secrets.Delivery, error) {
	var rows []SecretDelivery
	if err := g.Where("operation_id = ?", operationID).Order("field").Find(&rows).Error; err != nil {
		return nil, err
	}
	out := make([]secrets.Delivery, len(rows))
	for i, r := range rows {
		box, err := base64.StdEncoding.DecodeString(r.Box)
		if err != nil {
			return nil, err
		}
		out[i] = secrets.Delivery{OperationID: r.OperationID, Field: r.Field, KeyID: r.KeyID, Box: box, CreatedAt: r.CreatedAt.UTC()}
	}
	return out, nil
}

// PurgeDeliveries implements secrets.Store.
func (s *SecretsStore) PurgeDeliveries(ctx context.Context, keepLaunchSince time.Time, batch int) (int, error) {
	// A command's payload is its own or a shared body (migration 00032).
	const payload = "COALESCE(b.body, c.payload)"
	field := func(f string) string { return "json_extract(" + payload + ", '$." + f + "')" }
	if s.db.Dialect == Postgres {
		field = func(f string) string { return "(" + payload + "::jsonb ->> '" + f + "')" }
	}
	// A launch still owed its output keeps the values its output is
	// scrubbed of: its own (a single launch) or its fan-out parent's (the
	// children of a fleet.command read their parent's).
	noOutput := `NOT EXISTS (SELECT 1 FROM workload_outputs w WHERE w.node_id = c.node_id
			AND w.run_id = ` + field("run_id") + ` AND w.attempt_id = ` + field("attempt_id") + `)`
	owed := `ch.kind = 'node.launch_workload' AND ch.state = 'succeeded' AND ch.finished_at > ?`
	keep := dbtime.Norm(keepLaunchSince)
	var purged int64
	err := s.db.Write(ctx, func(g *gorm.DB) error {
		res := g.Exec(`DELETE FROM secret_deliveries WHERE operation_id IN (
		SELECT d.operation_id FROM secret_deliveries d LEFT JOIN operations o ON o.id = d.operation_id
		WHERE o.id IS NULL OR (o.terminal
			AND NOT EXISTS (SELECT 1 FROM operations ch JOIN commands c ON c.operation_id = ch.id
				LEFT JOIN operation_bodies b ON b.digest = c.payload_body
				WHERE ch.id = o.id AND `+owed+` AND `+noOutput+`)
			AND NOT EXISTS (SELECT 1 FROM operations ch JOIN commands c ON c.operation_id = ch.id
				LEFT JOIN operation_bodies b ON b.digest = c.payload_body
				WHERE ch.parent_id = o.id AND `+owed+` AND `+noOutput+`))
		LIMIT ?)`, keep, keep, batch)
		purged = res.RowsAffected
		return res.Error
	})
	return int(purged), err
}

// Lookup implements secrets.Tx.
func (t secretsTx) Lookup(ctx context.Context, digest string) (secrets.Sealed, error) {
	var row SealedSecret
	err := t.r.db(ctx).Where("digest = ?", digest).Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return secrets.Sealed{}, secrets.ErrNoRows
	}
	if err != nil {
		return secrets.Sealed{}, err
	}
	return sealedOf(row)
}

// MarkUsed implements secrets.Tx: the state condition makes exactly one
// of concurrent uses change the row.
func (t secretsTx) MarkUsed(ctx context.Context, digest, operationID string, at time.Time) (bool, error) {
	at = dbtime.Norm(at)
	res := t.r.db(ctx).Model(&SealedSecret{}).Where("digest = ? AND state = ?", digest, string(secrets.StateSealed)).
		Updates(map[string]any{"state": string(secrets.StateUsed), "operation_id": operationID, "used_at": at})
	return res.RowsAffected == 1, res.Error
}

// InsertDeliveries implements secrets.Tx.
func (t secretsTx) InsertDeliveries(ctx context.Context, ds ...secrets.Delivery) error {
	if len(ds) == 0 {
		return nil
	}
	rows := make([]SecretDelivery, len(ds))
	for i, d := range ds {
		rows[i] = SecretDelivery{OperationID: d.OperationID, Field: d.Field, KeyID: d.KeyID,
			Box: base64.StdEncoding.EncodeToString(d.Box), CreatedAt: dbtime.Norm(d.CreatedAt)}
	}
	return t.r.db(ctx).Create(&rows).Error
}

// InsertAudit implements secrets.Tx.
func (t secretsTx) InsertAudit(ctx context.Context, a ...secrets.AuditEntry) error {
	return insertAudit(t.r.db(ctx), a)
}

// Tx runs fn in a transaction of its own (the ledger's Tx.Secrets joins
// the submitting one instead).
func (s *SecretsStore) Tx(ctx context.Context, fn func(secrets.Tx) error) error {
	return s.db.Tx(ctx, func(g *gorm.DB) error {
		return fn(secretsTx{r: fleetReader{g: g, dialect: s.db.Dialect}})
	})
}
