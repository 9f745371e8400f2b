package fleet_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/secrets"
)

// TestFanOutNodesShareOneSealedDocument: the nodes a fan-out configures
// in one transaction share one sealed copy of a large document, each
// row holding only the document's key sealed for its node and revision,
// and nothing a node or an administrator reads changes: the node is
// handed the whole document with its real values, an administrator reads
// it masked, a report is scrubbed of its values. A node's key opens
// nothing for another node. Retention deletes a copy no row names.
func TestFanOutNodesShareOneSealedDocument(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		b.svc.UseDocumentSealer(secrets.New(secrets.Options{Store: models.NewSecretsStore(b.db), Keys: b.ring, Now: b.clock.Now}))
		const n = 4
		ids := make([]string, n)
		sessions := make([]fleet.Session, n)
		for i := range ids {
			ids[i], sessions[i], _ = b.readyNode(t)
		}
		secret := "s3cret-" + randomSuffix()
		pad := strings.Repeat("p", 2048) // above the size from which nodes share it
		document := func(v string) json.RawMessage {
			return json.RawMessage(`{"pad":"` + pad + `","token":"` + v + `"}`)
		}
		configureAll := func(doc json.RawMessage) {
			t.Helper()
			ins := make([]fleet.Configure, n)
			for i, id := range ids {
				ins[i] = fleet.Configure{NodeID: id, OperationID: "cfg-" + randomSuffix(), Format: "app/v1", Document: doc,
					SealedPointers: []string{"/token"}}
			}
			require.NoError(t, b.store.Tx(ctx, func(tx fleet.Tx) error {
				_, refused, err := b.svc.ConfigureManyTx(ctx, tx, ins, func([]int) (map[int]error, error) { return nil, nil })
				for _, r := range refused {
					require.NoError(t, r)
				}
				return err
			}))
		}
		type stored struct {
			NodeID     string
			DocumentID *string
			BoxBytes   int
		}
		rows := func() []stored {
			t.Helper()
			var out []stored
			require.NoError(t, b.db.Raw(`SELECT node_id, document_id, LENGTH(box) AS box_bytes FROM node_configs
				WHERE node_id IN ? ORDER BY node_id`, ids).Scan(&out).Error)
			require.Len(t, out, n)
			return out
		}
		documents := func() (count int64) {
			require.NoError(t, b.db.Raw(`SELECT COUNT(*) FROM config_documents`).Scan(&count).Error)
			return count
		}

		configureAll(document(secret))
		require.EqualValues(t, 1, documents(), "one sealed copy for the transaction's nodes")
		first := rows()
		for _, r := range first {
			require.NotNil(t, r.DocumentID, r.NodeID)
			require.Equal(t, *first[0].DocumentID, *r.DocumentID, "every node names the one copy")
			require.Less(t, r.BoxBytes, 256, "a node's row holds a key, not the document")
		}
		var dump []string
		require.NoError(t, b.db.Raw(`SELECT box FROM config_documents`).Scan(&dump).Error)
		require.NotContains(t, strings.Join(dump, ""), secret, "the copy is sealed")

		for i, sess := range sessions {
			a := b.pollNow(t, sess)
			require.NotNil(t, a.Config, ids[i])
			require.JSONEq(t, string(document(secret)), string(a.Config.Document), "the node is handed the whole document")
		}
		view, err := b.svc.NodeConfig(ctx, ids[0])
		require.NoError(t, err)
		require.JSONEq(t, string(document(fleet.SealedMask)), string(view.Desired.Document), "administrators read it masked")
		b.reportConfig(t, sessions[0], view.Desired.Revision, view.Desired.Hash, api.ConfigFailed, "refused "+secret)
		view, err = b.svc.NodeConfig(ctx, ids[0])
		require.NoError(t, err)
		require.Equal(t, "refused [secret]", view.Reported.Message, "a report is scrubbed of the shared document's values")

		// A database writer who gives node 1 node 0's key gets nothing:
		// the key is sealed for node 0.
		var own struct{ Box, KeyID string }
		require.NoError(t, b.db.Raw(`SELECT box, key_id FROM node_configs WHERE node_id = ?`, ids[1]).Scan(&own).Error)
		require.NoError(t, b.db.Exec(`UPDATE node_configs SET box = (SELECT box FROM node_configs WHERE node_id = ?),
			key_id = (SELECT key_id FROM node_configs WHERE node_id = ?), delivered_revision = NULL WHERE node_id = ?`,
			ids[0], ids[0], ids[1]).Error)
		b.clock.Advance(2 * time.Minute) // past the visibility timeout: due again
		_, err = b.svc.PollWork(ctx, sessions[1], 0, "")
		require.Error(t, err, "a key moved to another node's row opens nothing")
		require.NoError(t, b.db.Exec(`UPDATE node_configs SET box = ?, key_id = ? WHERE node_id = ?`, own.Box, own.KeyID, ids[1]).Error)

		// A new document for every node: the old copy is named by no row,
		// and retention deletes it, and only it.
		configureAll(document(secret + "-2"))
		require.EqualValues(t, 2, documents())
		_, _, pruned, err := models.NewLedgerStore(b.store).Prune(ctx, b.clock.Now().Add(-time.Hour), b.clock.Now().Add(-time.Hour), 100)
		require.NoError(t, err)
		require.True(t, pruned)
		require.EqualValues(t, 1, documents(), "retention deletes the copy no row names")
		second := rows()
		require.NotEqual(t, *first[0].DocumentID, *second[0].DocumentID)
		b.clock.Advance(2 * time.Minute)
		for i, sess := range sessions {
			a := b.pollNow(t, sess)
			require.NotNil(t, a.Config, ids[i])
			require.JSONEq(t, string(document(secret+"-2")), string(a.Config.Document), ids[i])
		}

		// A small document, and one node's own configure, keep their own
		// sealed copy.
		configureAll(json.RawMessage(`{"token":"` + secret + `"}`))
		for _, r := range rows() {
			require.Nil(t, r.DocumentID, "a small document stays in the node's row")
		}
		require.Equal(t, int64(4), b.configure(t, ids[2], string(document(secret+"-3")), false).Revision)
		for _, r := range rows() {
			require.Nil(t, r.DocumentID, "one node's configure seals its own copy")
		}
	})
}
