package models_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// TestSharedConfigDocumentsReadBack: configuration rows that name one
// shared document read back with it, from the database as well as from
// the cache, locked, many at once and unlocked; a head read leaves it
// out. Retention deletes a document once no row names it.
func TestSharedConfigDocumentsReadBack(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s := models.NewFleetStore(db, "r1", nil)
		doc := fleet.SharedDocument{ID: "doc-1", Box: []byte("the sealed document")}
		named := func(node string) fleet.NodeConfig {
			return fleet.NodeConfig{NodeID: node, Revision: 1, Hash: "h1", Format: "t/v1", KeyID: "k1",
				Box: []byte("the key for " + node), Shared: &fleet.SharedDocument{ID: doc.ID}, UpdatedAt: t0}
		}
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
			if err := tx.SaveConfigDocuments(ctx, []fleet.SharedDocument{doc}); err != nil {
				return err
			}
			return tx.SaveNodeConfigs(ctx, []fleet.NodeConfig{named("n1"), named("n2")})
		}))
		whole := func(c fleet.NodeConfig, node string) {
			t.Helper()
			require.Equal(t, "the key for "+node, string(c.Box))
			require.NotNil(t, c.Shared, node)
			require.Equal(t, doc.ID, c.Shared.ID)
			require.Equal(t, string(doc.Box), string(c.Shared.Box), node)
		}
		for _, cold := range []bool{false, true} {
			if cold {
				models.ForgetConfigDocuments()
			}
			require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
				c, err := tx.LockNodeConfig(ctx, "n1")
				require.NoError(t, err)
				whole(c, "n1")
				head, err := tx.LockNodeConfigHead(ctx, "n2")
				require.NoError(t, err)
				require.Nil(t, head.Box)
				require.Equal(t, doc.ID, head.Shared.ID)
				require.Nil(t, head.Shared.Box, "a head read leaves the document out")
				if cold {
					models.ForgetConfigDocuments()
				}
				many, err := tx.LockNodeConfigs(ctx, []string{"n1", "n2"})
				require.NoError(t, err)
				whole(many["n1"], "n1")
				whole(many["n2"], "n2")
				return nil
			}))
			if cold {
				models.ForgetConfigDocuments()
			}
			c, err := s.NodeConfig(ctx, "n2")
			require.NoError(t, err)
			whole(c, "n2")
		}

		documents := func() (n int64) {
			require.NoError(t, db.Raw(`SELECT COUNT(*) FROM config_documents`).Scan(&n).Error)
			return n
		}
		prune := func() {
			t.Helper()
			_, _, pruned, err := models.NewLedgerStore(s).Prune(ctx, t0, t0, 100)
			require.NoError(t, err)
			require.True(t, pruned)
		}
		own := func(node string) fleet.NodeConfig {
			return fleet.NodeConfig{NodeID: node, Revision: 2, Hash: "h2", Format: "t/v1", KeyID: "k1", Box: []byte("own copy"), UpdatedAt: t0}
		}
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error { return tx.SaveNodeConfig(ctx, own("n1")) }))
		prune()
		require.EqualValues(t, 1, documents(), "a document one row still names is kept")
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error { return tx.SaveNodeConfig(ctx, own("n2")) }))
		prune()
		require.Zero(t, documents(), "retention deletes a document no row names")
		c, err := s.NodeConfig(ctx, "n2")
		require.NoError(t, err)
		require.Nil(t, c.Shared)
		require.Equal(t, "own copy", string(c.Box))
	})
}

// TestRetentionKeepsADocumentARecordingIsNaming: retention on one replica
// runs while a recording on another, not yet committed, stores a new
// shared document and moves a node's row onto it from an older one. It
// deletes neither: the new document is named by the time it can be seen,
// and the old one until the move commits. Once it has, the old one goes.
// On Postgres retention runs beside the open transaction; on SQLite it
// waits for the writer.
func TestRetentionKeepsADocumentARecordingIsNaming(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		s1, s2 := models.NewFleetStore(db, "r1", nil), models.NewFleetStore(db, "r2", nil)
		row := func(doc fleet.SharedDocument, revision int64) fleet.NodeConfig {
			return fleet.NodeConfig{NodeID: "n1", Revision: revision, Hash: "h", Format: "t/v1", KeyID: "k1",
				Box: []byte("key"), Shared: &fleet.SharedDocument{ID: doc.ID}, UpdatedAt: t0}
		}
		old, next := fleet.SharedDocument{ID: "doc-old", Box: []byte("old")}, fleet.SharedDocument{ID: "doc-new", Box: []byte("new")}
		save := func(s *models.FleetStore, doc fleet.SharedDocument, revision int64, hold func()) error {
			return s.Tx(ctx, func(tx fleet.Tx) error {
				if err := tx.SaveConfigDocuments(ctx, []fleet.SharedDocument{doc}); err != nil {
					return err
				}
				if err := tx.SaveNodeConfigs(ctx, []fleet.NodeConfig{row(doc, revision)}); err != nil {
					return err
				}
				hold()
				return nil
			})
		}
		require.NoError(t, save(s1, old, 1, func() {}))
		stored := func() (ids []string) {
			require.NoError(t, db.Raw(`SELECT id FROM config_documents ORDER BY id`).Scan(&ids).Error)
			return ids
		}
		prune := func() error {
			_, _, _, err := models.NewLedgerStore(s2).Prune(ctx, t0, t0, 100)
			return err
		}

		named, release, committed := make(chan struct{}), make(chan struct{}), make(chan error, 1)
		var releaseOnce sync.Once
		letGo := func() { releaseOnce.Do(func() { close(release) }) }
		defer letGo() // a failure below must not leave the transaction open
		go func() { committed <- save(s1, next, 2, func() { close(named); <-release }) }()
		<-named
		pruned := make(chan error, 1)
		go func() { pruned <- prune() }()
		if db.Dialect == models.Postgres {
			require.NoError(t, <-pruned, "retention runs beside the recording")
			require.Equal(t, []string{old.ID}, stored(), "the old document is still named")
			letGo()
		} else {
			letGo()
			require.NoError(t, <-pruned)
		}
		require.NoError(t, <-committed)
		require.NoError(t, prune())
		require.Equal(t, []string{next.ID}, stored(), "the new document is kept, the old one goes")
		models.ForgetConfigDocuments()
		c, err := s2.NodeConfig(ctx, "n1")
		require.NoError(t, err)
		require.Equal(t, "new", string(c.Shared.Box))
	})
}
