package models_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/models"
)

// Package hosts in the auth store conformance suite.

func sampleHost(id, name string, at time.Time) auth.PackageHost {
	return auth.PackageHost{ID: id, Name: name, Families: []string{"commands", "nodes"}, Generation: 1, CreatedAt: at, UpdatedAt: at}
}

func TestAuthStorePackageHosts(t *testing.T) {
	withAuthStore(t, func(t *testing.T, s *models.AuthStore) {
		_, err := s.PackageHost(ctx, "missing")
		require.ErrorIs(t, err, auth.ErrNoRows)
		_, err = s.PackageHostByName(ctx, "ci")
		require.ErrorIs(t, err, auth.ErrNoRows)

		require.NoError(t, s.InsertPackageHost(ctx, sampleHost("h1", "ci", t0)))
		require.ErrorIs(t, s.InsertPackageHost(ctx, sampleHost("h2", "ci", t0)), auth.ErrDuplicate, "same name")
		require.ErrorIs(t, s.InsertPackageHost(ctx, sampleHost("h1", "other", t0)), auth.ErrDuplicate, "same id")
		require.NoError(t, s.InsertPackageHost(ctx, sampleHost("h2", "deployer", t0.Add(time.Second))))
		require.NoError(t, s.InsertPackageHost(ctx, sampleHost("h3", "ünïcode ✓", t0.Add(2*time.Second))))

		h, err := s.PackageHost(ctx, "h1")
		require.NoError(t, err)
		require.Equal(t, "ci", h.Name)
		require.Equal(t, []string{"commands", "nodes"}, h.Families)
		require.Equal(t, int64(1), h.Generation)
		require.True(t, t0.Equal(h.CreatedAt))
		require.Nil(t, h.RevokedAt)
		require.Positive(t, h.Cursor)
		byName, err := s.PackageHostByName(ctx, "ünïcode ✓")
		require.NoError(t, err)
		require.Equal(t, "h3", byName.ID)

		// Newest first, keyset-paged.
		page, err := s.PackageHosts(ctx, 0, 2)
		require.NoError(t, err)
		require.Equal(t, []string{"h3", "h2"}, []string{page[0].ID, page[1].ID})
		page, err = s.PackageHosts(ctx, page[1].Cursor, 2)
		require.NoError(t, err)
		require.Len(t, page, 1)
		require.Equal(t, "h1", page[0].ID)

		// Revocation inside a transaction: the locked read sees the row.
		revoked := t0.Add(time.Minute)
		require.NoError(t, s.Tx(ctx, func(tx auth.Store) error {
			h, err := tx.PackageHost(ctx, "h1")
			if err != nil {
				return err
			}
			h.Generation, h.RevokedAt, h.UpdatedAt = 2, &revoked, revoked
			return tx.UpdatePackageHost(ctx, h)
		}))
		h, err = s.PackageHost(ctx, "h1")
		require.NoError(t, err)
		require.Equal(t, int64(2), h.Generation)
		require.True(t, revoked.Equal(*h.RevokedAt))
		require.True(t, revoked.Equal(h.UpdatedAt))
		h.Generation, h.RevokedAt = 3, nil
		require.NoError(t, s.UpdatePackageHost(ctx, h))
		h, err = s.PackageHost(ctx, "h1")
		require.NoError(t, err)
		require.Nil(t, h.RevokedAt, "a new token lifts the revocation")

		// A failed transaction leaves nothing behind.
		boom := errors.New("boom")
		err = s.Tx(ctx, func(tx auth.Store) error {
			require.NoError(t, tx.InsertPackageHost(ctx, sampleHost("h9", "gone", t0)))
			return boom
		})
		require.ErrorIs(t, err, boom)
		_, err = s.PackageHost(ctx, "h9")
		require.ErrorIs(t, err, auth.ErrNoRows, "rolled back")
	})
}

func TestAuthStorePackageHostTokens(t *testing.T) {
	withAuthStore(t, func(t *testing.T, s *models.AuthStore) {
		require.NoError(t, s.InsertPackageHost(ctx, sampleHost("h1", "ci", t0)))
		tok := auth.PackageHostToken{TokenHash: "d1", HostID: "h1", Generation: 1, OperationID: "op-1", CreatedAt: t0}
		require.NoError(t, s.InsertPackageHostToken(ctx, tok))
		require.ErrorIs(t, s.InsertPackageHostToken(ctx, tok), auth.ErrDuplicate, "same digest")
		require.NoError(t, s.InsertPackageHostToken(ctx, auth.PackageHostToken{TokenHash: "d2", HostID: "h1", Generation: 2,
			OperationID: "op-2", CreatedAt: t0.Add(time.Second)}))

		got, h, err := s.PackageHostByToken(ctx, "d1")
		require.NoError(t, err)
		require.Equal(t, tok, got)
		require.Equal(t, "h1", h.ID)
		require.Equal(t, "ci", h.Name)
		require.Equal(t, []string{"commands", "nodes"}, h.Families)
		require.Equal(t, int64(1), h.Generation)
		require.Positive(t, h.Cursor)
		got, _, err = s.PackageHostByToken(ctx, "d2")
		require.NoError(t, err)
		require.Equal(t, int64(2), got.Generation, "each token keeps the generation it was minted at")
		_, _, err = s.PackageHostByToken(ctx, "nope")
		require.ErrorIs(t, err, auth.ErrNoRows)
	})
}
