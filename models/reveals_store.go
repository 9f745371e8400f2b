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

func revealRow(r secrets.Reveal) RevealHandle {
	return RevealHandle{Digest: r.Digest, PrincipalKind: r.Principal.Kind, PrincipalID: r.Principal.ID,
		RequestID: r.RequestID, OperationID: r.OperationID, Field: r.Field, KeyID: r.KeyID,
		Box: base64.StdEncoding.EncodeToString(r.Box), State: string(r.State),
		CreatedAt: dbtime.Norm(r.CreatedAt), ExpiresAt: dbtime.Norm(r.ExpiresAt), SpentAt: dbtime.NormPtr(r.SpentAt)}
}

func revealOf(r RevealHandle) (secrets.Reveal, error) {
	box, err := base64.StdEncoding.DecodeString(r.Box)
	return secrets.Reveal{Digest: r.Digest, Principal: secrets.Principal{Kind: r.PrincipalKind, ID: r.PrincipalID},
		RequestID: r.RequestID, OperationID: r.OperationID, Field: r.Field, KeyID: r.KeyID, Box: box,
		State: secrets.State(r.State), CreatedAt: r.CreatedAt.UTC(), ExpiresAt: r.ExpiresAt.UTC(),
		SpentAt: dbtime.NormPtr(r.SpentAt)}, err
}

// InsertReveals implements secrets.Tx.
func (t secretsTx) InsertReveals(ctx context.Context, rs ...secrets.Reveal) error {
	if len(rs) == 0 {
		return nil
	}
	rows := make([]RevealHandle, len(rs))
	for i, r := range rs {
		rows[i] = revealRow(r)
	}
	return t.r.db(ctx).Create(&rows).Error
}

// RevealsOf implements secrets.Store.
func (s *SecretsStore) RevealsOf(ctx context.Context, operationID string) ([]secrets.Reveal, error) {
	var rows []RevealHandle
	if err := s.db.WithContext(ctx).Where("operation_id = ?", operationID).Order("field").Find(&rows).Error; err != nil {
		return nil, err
	}
	out := make([]secrets.Reveal, len(rows))
	for i, r := range rows {
		var err error
		if out[i], err = revealOf(r); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// LookupReveal implements secrets.Store.
func (s *SecretsStore) LookupReveal(ctx context.Context, digest string) (secrets.Reveal, error) {
	var row RevealHandle
	err := s.db.WithContext(ctx).Where("digest = ?", digest).Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return secrets.Reveal{}, secrets.ErrNoRows
	}
	if err != nil {
		return secrets.Reveal{}, err
	}
	return revealOf(row)
}

// SpendReveal implements secrets.Store: the state condition makes exactly
// one of concurrent spends change the row; its audit row commits with it.
func (s *SecretsStore) SpendReveal(ctx context.Context, digest string, at time.Time, a secrets.AuditEntry) (bool, error) {
	spent := false
	err := s.db.Tx(ctx, func(g *gorm.DB) error {
		res := g.Model(&RevealHandle{}).Where("digest = ? AND state = ?", digest, string(secrets.RevealOpen)).
			Updates(map[string]any{"state": string(secrets.RevealSpent), "spent_at": dbtime.Norm(at)})
		if res.Error != nil || res.RowsAffected != 1 {
			return res.Error
		}
		spent = true
		return insertAudit(g, []secrets.AuditEntry{a})
	})
	return spent, err
}

// ExpireReveals implements secrets.Store.
func (s *SecretsStore) ExpireReveals(ctx context.Context, now time.Time, keep time.Duration, batch int) (int, error) {
	now = dbtime.Norm(now)
	n := 0
	err := s.db.Tx(ctx, func(g *gorm.DB) error {
		var rows []RevealHandle
		if err := g.Where("state = ? AND expires_at <= ?", string(secrets.RevealOpen), now).
			Order("expires_at").Limit(batch).Find(&rows).Error; err != nil {
			return err
		}
		var audit []secrets.AuditEntry
		var digests []string
		for _, r := range rows {
			digests = append(digests, r.Digest)
			audit = append(audit, secrets.AuditEntry{At: now, Action: secrets.ActionExpire, Outcome: secrets.OutcomeExpired,
				Principal: secrets.Principal{Kind: r.PrincipalKind, ID: r.PrincipalID}, HandleDigest: r.Digest[:16],
				RequestID: r.RequestID, OperationID: r.OperationID, Field: r.Field})
		}
		if len(digests) > 0 {
			res := g.Model(&RevealHandle{}).Where("digest IN ? AND state = ?", digests, string(secrets.RevealOpen)).
				Update("state", string(secrets.RevealExpired))
			if res.Error != nil {
				return res.Error
			}
			n = int(res.RowsAffected)
			if err := insertAudit(g, audit); err != nil {
				return err
			}
		}
		return g.Exec(pruneRevealsSQL, revealStates(), now.Add(-keep)).Error
	})
	return n, err
}

// pruneRevealsSQL deletes the handles past their keep, of every state
// (revealStates). Naming the states has SQLite read reveal_handles_expiry
// (state, expires_at); "expires_at <= ?" alone read every handle — a day
// of invitations' — inside the writer's transaction, holding every write
// back (117 ms with 15,000 handles, once a minute: BENCHMARKS.md,
// twenty-third sitting).
const pruneRevealsSQL = `DELETE FROM reveal_handles WHERE state IN ? AND expires_at <= ?`

func revealStates() []string {
	out := make([]string, len(secrets.RevealStates))
	for i, st := range secrets.RevealStates {
		out[i] = string(st)
	}
	return out
}
