package models_test

import (
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
