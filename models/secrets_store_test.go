package models_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
	"github.com/nodeward/nodeward/secrets"
)

// The secrets store conformance suite, on every dialect.

var sealer = secrets.Principal{Kind: "admin", ID: "u1"}

func sampleSealed(digest string, p secrets.Principal, at time.Time, ttl time.Duration) secrets.Sealed {
	return secrets.Sealed{Digest: digest, Principal: p, RequestID: "r1", Target: secrets.Target{Kind: "node", ID: "n1"},
		Field: "/env/DB", KeyID: "k1", Box: []byte{0, 1, 2, 0xff}, State: secrets.StateSealed, CreatedAt: at, ExpiresAt: at.Add(ttl)}
}

func sealAudit(digest string) secrets.AuditEntry {
	return secrets.AuditEntry{At: t0, Action: secrets.ActionSeal, Outcome: secrets.OutcomeOK, Principal: sealer,
		HandleDigest: digest[:16], RequestID: "r1", Target: secrets.Target{Kind: "node", ID: "n1"}, Field: "/env/DB"}
}

func TestSecretsStoreSealLookupUse(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := models.NewSecretsStore(db)
		d := "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
		require.NoError(t, s.Seal(ctx, sampleSealed(d, sealer, t0, time.Minute), sealAudit(d), 10))

		require.NoError(t, s.Tx(ctx, func(tx secrets.Tx) error {
			_, err := tx.Lookup(ctx, "missing")
			require.ErrorIs(t, err, secrets.ErrNoRows)
			got, err := tx.Lookup(ctx, d)
			require.NoError(t, err)
			require.Equal(t, sealer, got.Principal)
			require.Equal(t, secrets.Target{Kind: "node", ID: "n1"}, got.Target)
			require.Equal(t, "/env/DB", got.Field)
			require.Equal(t, []byte{0, 1, 2, 0xff}, got.Box)
			require.Equal(t, secrets.StateSealed, got.State)
			require.True(t, t0.Add(time.Minute).Equal(got.ExpiresAt))

			ok, err := tx.MarkUsed(ctx, d, "op1", t0)
			require.NoError(t, err)
			require.True(t, ok)
			ok, err = tx.MarkUsed(ctx, d, "op2", t0)
			require.NoError(t, err)
			require.False(t, ok, "a used handle is not used again")
			got, err = tx.Lookup(ctx, d)
			require.NoError(t, err)
			require.Equal(t, secrets.StateUsed, got.State)
			require.Equal(t, "op1", got.OperationID)
			return tx.InsertDeliveries(ctx, secrets.Delivery{OperationID: "op1", Field: "/env/DB", KeyID: "k1", Box: []byte("box"), CreatedAt: t0})
		}))
		ds, err := s.Deliveries(ctx, "op1")
		require.NoError(t, err)
		require.Len(t, ds, 1)
		require.Equal(t, []byte("box"), ds[0].Box)
		none, err := s.Deliveries(ctx, "op2")
		require.NoError(t, err)
		require.Empty(t, none)
		// op1 is no operation of the ledger's: its value is purged.
		n, err := s.PurgeDeliveries(ctx, time.Now(), 10)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Zero(t, dbtest.Count(t, db.DB, &models.SecretDelivery{}))
	})
}

func TestSecretsStoreQuota(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := models.NewSecretsStore(db)
		require.NoError(t, s.Seal(ctx, sampleSealed("d1xxxxxxxxxxxxxxxx", sealer, t0, time.Minute), sealAudit("d1xxxxxxxxxxxxxxxx"), 2))
		// An expired handle does not count.
		require.NoError(t, s.Seal(ctx, sampleSealed("d2xxxxxxxxxxxxxxxx", sealer, t0.Add(-time.Hour), time.Minute), sealAudit("d2xxxxxxxxxxxxxxxx"), 2))
		require.NoError(t, s.Seal(ctx, sampleSealed("d3xxxxxxxxxxxxxxxx", sealer, t0, time.Minute), sealAudit("d3xxxxxxxxxxxxxxxx"), 2))
		require.ErrorIs(t, s.Seal(ctx, sampleSealed("d4xxxxxxxxxxxxxxxx", sealer, t0, time.Minute), sealAudit("d4xxxxxxxxxxxxxxxx"), 2), secrets.ErrQuota)
		other := secrets.Principal{Kind: "package_host", ID: "u1"}
		require.NoError(t, s.Seal(ctx, sampleSealed("d5xxxxxxxxxxxxxxxx", other, t0, time.Minute), sealAudit("d5xxxxxxxxxxxxxxxx"), 2), "quotas are per principal")
		require.Equal(t, int64(4), dbtest.Count(t, db.DB, &models.SealedSecret{}), "nothing written past the quota")
		require.Equal(t, int64(4), dbtest.Count(t, db.DB, &models.SecretAudit{}))
	})
}

func TestSecretsStoreConcurrentSealsHoldTheQuota(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := models.NewSecretsStore(db)
		var wg sync.WaitGroup
		var ok atomic.Int64
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d := "concurrent-" + string(rune('a'+i)) + "xxxxxxxx"
				if s.Seal(ctx, sampleSealed(d, sealer, t0, time.Minute), sealAudit(d), 3) == nil {
					ok.Add(1)
				}
			}()
		}
		wg.Wait()
		require.Equal(t, int64(3), ok.Load())
		require.Equal(t, int64(3), dbtest.Count(t, db.DB, &models.SealedSecret{}))
	})
}

func TestSecretsStoreConcurrentUseOneWins(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := models.NewSecretsStore(db)
		d := "racexxxxxxxxxxxxxxxx"
		require.NoError(t, s.Seal(ctx, sampleSealed(d, sealer, t0, time.Minute), sealAudit(d), 10))
		var wg sync.WaitGroup
		var won atomic.Int64
		for i := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = s.Tx(ctx, func(tx secrets.Tx) error {
					ok, err := tx.MarkUsed(ctx, d, "op"+string(rune('a'+i)), t0)
					if err == nil && ok {
						won.Add(1)
					}
					return err
				})
			}()
		}
		wg.Wait()
		require.Equal(t, int64(1), won.Load())
	})
}

func TestSecretsStorePurgeAndAudit(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := models.NewSecretsStore(db)
		for _, d := range []string{"p1xxxxxxxxxxxxxxxx", "p2xxxxxxxxxxxxxxxx", "p3xxxxxxxxxxxxxxxx"} {
			require.NoError(t, s.Seal(ctx, sampleSealed(d, sealer, t0, time.Minute), sealAudit(d), 10))
		}
		require.NoError(t, s.Seal(ctx, sampleSealed("livexxxxxxxxxxxxxx", sealer, t0, time.Hour), sealAudit("livexxxxxxxxxxxxxx"), 10))
		require.NoError(t, s.Tx(ctx, func(tx secrets.Tx) error {
			_, err := tx.MarkUsed(ctx, "p3xxxxxxxxxxxxxxxx", "op", t0)
			return err
		}))
		n, err := s.Purge(ctx, t0.Add(2*time.Minute), 2)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		n, err = s.Purge(ctx, t0.Add(2*time.Minute), 2)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, int64(1), dbtest.Count(t, db.DB, &models.SealedSecret{}), "the unexpired handle stays")

		all, err := s.Audit(ctx, secrets.AuditFilter{Limit: 100})
		require.NoError(t, err)
		require.Len(t, all, 6, "four seals and two expiries; the used one is purged without an expiry")
		require.Equal(t, secrets.ActionExpire, all[0].Action)
		require.Equal(t, secrets.OutcomePurged, all[0].Outcome)
		require.Equal(t, secrets.ActionSeal, all[5].Action)
		require.Greater(t, all[0].Cursor, all[1].Cursor, "newest first")
		page, err := s.Audit(ctx, secrets.AuditFilter{Before: all[1].Cursor, Limit: 2})
		require.NoError(t, err)
		require.Equal(t, []int64{all[2].Cursor, all[3].Cursor}, []int64{page[0].Cursor, page[1].Cursor})
	})
}

func TestSecretsStoreAuditFilters(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := models.NewSecretsStore(db)
		admin := secrets.Principal{Kind: "admin", ID: "u-1"}
		host := secrets.Principal{Kind: "package_host", ID: "ph-1"}
		entry := func(action, outcome string, p secrets.Principal, op, tkind, tid string) secrets.AuditEntry {
			return secrets.AuditEntry{At: t0, Action: action, Outcome: outcome, Principal: p, HandleDigest: "0123456789abcdef",
				RequestID: "r", OperationID: op, Target: secrets.Target{Kind: tkind, ID: tid}, Field: "f"}
		}
		require.NoError(t, s.InsertAudit(ctx,
			entry(secrets.ActionSeal, secrets.OutcomeOK, admin, "", "node", "n-1"),       // 0
			entry(secrets.ActionUse, secrets.OutcomeOK, admin, "op-1", "node", "n-1"),    // 1
			entry(secrets.ActionUse, secrets.OutcomeDenied, host, "op-2", "node", "n-2"), // 2
			entry(secrets.ActionReveal, secrets.OutcomeOK, admin, "op-3", "fleet", ""),   // 3
			entry(secrets.ActionSeal, secrets.OutcomeOK, host, "", "node", "n-2"),        // 4
			entry(secrets.ActionReveal, secrets.OutcomeSpent, host, "op-3", "fleet", ""), // 5
		))
		all, err := s.Audit(ctx, secrets.AuditFilter{Limit: 100})
		require.NoError(t, err)
		require.Len(t, all, 6)
		idx := func(rows []secrets.AuditEntry) []int {
			var out []int
			for _, r := range rows {
				for i, a := range all {
					if a.Cursor == r.Cursor {
						out = append(out, 5-i)
					}
				}
			}
			return out
		}
		for name, c := range map[string]struct {
			f    secrets.AuditFilter
			want []int
		}{
			"Principal":     {secrets.AuditFilter{PrincipalKind: "package_host", PrincipalID: "ph-1"}, []int{5, 4, 2}},
			"PrincipalID":   {secrets.AuditFilter{PrincipalID: "u-1"}, []int{3, 1, 0}},
			"PrincipalKind": {secrets.AuditFilter{PrincipalKind: "admin"}, []int{3, 1, 0}},
			"Operation":     {secrets.AuditFilter{OperationID: "op-3"}, []int{5, 3}},
			"Target":        {secrets.AuditFilter{TargetKind: "node", TargetID: "n-2"}, []int{4, 2}},
			"TargetKind":    {secrets.AuditFilter{TargetKind: "fleet"}, []int{5, 3}},
			"Action":        {secrets.AuditFilter{Action: secrets.ActionUse}, []int{2, 1}},
			"Outcome":       {secrets.AuditFilter{Outcome: secrets.OutcomeDenied}, []int{2}},
			"Combined":      {secrets.AuditFilter{Action: secrets.ActionReveal, Outcome: secrets.OutcomeOK, PrincipalID: "u-1"}, []int{3}},
			"None":          {secrets.AuditFilter{OperationID: "op-404"}, nil},
		} {
			t.Run(name, func(t *testing.T) {
				c.f.Limit = 100
				rows, err := s.Audit(ctx, c.f)
				require.NoError(t, err)
				require.Equal(t, c.want, idx(rows))
			})
		}
		// Keyset pages under a filter: each row once, newest first.
		f := secrets.AuditFilter{PrincipalKind: "package_host", Limit: 2}
		first, err := s.Audit(ctx, f)
		require.NoError(t, err)
		require.Equal(t, []int{5, 4}, idx(first))
		f.Before = first[1].Cursor
		rest, err := s.Audit(ctx, f)
		require.NoError(t, err)
		require.Equal(t, []int{2}, idx(rest))
	})
}

// TestSecretsStoreExpireReveals: open handles past their TTL become
// expired (each audited), and handles of every state past the keep are
// deleted; newer ones stay.
func TestSecretsStoreExpireReveals(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := models.NewSecretsStore(db)
		keep := 24 * time.Hour
		now := t0.Add(48 * time.Hour)
		handle := func(digest string, state secrets.State, expires time.Time) secrets.Reveal {
			return secrets.Reveal{Digest: digest, Principal: sealer, RequestID: "r-" + digest, OperationID: "op-" + digest,
				Field: "enrollment_token", KeyID: "k1", Box: []byte{1, 2, 3}, State: state,
				CreatedAt: expires.Add(-secrets.RevealTTL), ExpiresAt: expires}
		}
		old := now.Add(-keep - time.Minute)
		require.NoError(t, s.Tx(ctx, func(tx secrets.Tx) error {
			return tx.InsertReveals(ctx,
				handle("old-open-xxxxxxxxxxxx", secrets.RevealOpen, old),
				handle("old-spent-xxxxxxxxxxx", secrets.RevealSpent, old),
				handle("old-expired-xxxxxxxxx", secrets.RevealExpired, old),
				handle("lapsed-open-xxxxxxxxx", secrets.RevealOpen, now.Add(-time.Minute)),
				handle("recent-spent-xxxxxxxx", secrets.RevealSpent, now.Add(-time.Minute)),
				handle("live-open-xxxxxxxxxxx", secrets.RevealOpen, now.Add(time.Minute)))
		}))
		n, err := s.ExpireReveals(ctx, now, keep, 500)
		require.NoError(t, err)
		require.Equal(t, 2, n, "the two open handles past their TTL expired")
		states := map[string]secrets.State{}
		for _, d := range []string{"old-open-xxxxxxxxxxxx", "old-spent-xxxxxxxxxxx", "old-expired-xxxxxxxxx",
			"lapsed-open-xxxxxxxxx", "recent-spent-xxxxxxxx", "live-open-xxxxxxxxxxx"} {
			r, err := s.LookupReveal(ctx, d)
			if err == nil {
				states[d] = r.State
			}
		}
		require.Equal(t, map[string]secrets.State{"lapsed-open-xxxxxxxxx": secrets.RevealExpired,
			"recent-spent-xxxxxxxx": secrets.RevealSpent, "live-open-xxxxxxxxxxx": secrets.RevealOpen}, states,
			"every handle past the keep went, whatever its state")
		all, err := s.Audit(ctx, secrets.AuditFilter{Limit: 100})
		require.NoError(t, err)
		require.Len(t, all, 2)
		for _, a := range all {
			require.Equal(t, secrets.ActionExpire, a.Action)
		}
	})
}

// TestSQLiteRevealPruneReadsTheIndex: the sweeper's delete of reveal
// handles past their keep runs in the writer's transaction; on a database
// without statistics it reads reveal_handles_expiry, not every handle.
func TestSQLiteRevealPruneReadsTheIndex(t *testing.T) {
	db := dbtest.Open(t, models.SQLite)
	plan := sqlitePlan(t, db, models.PruneReveals(t0))
	require.Len(t, plan, 1, "%q", plan)
	require.Contains(t, plan[0], "USING INDEX reveal_handles_expiry", "%q", plan)
}
