package models

import (
	"context"
	"encoding/base64"
	"fmt"

	"gorm.io/gorm"

	"github.com/nodeward/nodeward/fleet"
)

// ConfigDocument is a row of config_documents (migration 00031): a
// configuration document many nodes share (fleet.SharedDocument), its box
// base64 as every sealed box is stored.
type ConfigDocument struct {
	ID  string `gorm:"primaryKey"`
	Box string
}

// documentCache keeps shared documents this process stored or read,
// decoded: a wave's deliveries each read their node's row and open the
// one document through it.
var documentCache = newSizedLRU[[]byte](64 << 20)

// SaveConfigDocuments implements fleet.Tx: one insert per document (each
// up to 340 KB, and a recording stores one as a rule).
func (t *fleetTx) SaveConfigDocuments(ctx context.Context, docs []fleet.SharedDocument) error {
	for _, d := range docs {
		err := t.db(ctx).Exec(`INSERT INTO config_documents (id, box) VALUES (?, ?)`, d.ID,
			base64.StdEncoding.EncodeToString(d.Box)).Error
		if err != nil {
			return fmt.Errorf("store a shared configuration document: %w", err)
		}
		documentCache.put(d.ID, d.Box)
	}
	return nil
}

// fillShared puts back the shared documents cs name: from this process's
// cache, or else in one read through g (the caller's transaction, which
// locked the rows that name them, so retention cannot have deleted them).
// A row read without its document (Box nil) is left as it is.
func fillShared(g *gorm.DB, dialect string, cs []*fleet.NodeConfig) error {
	var missing []string
	for _, c := range cs {
		if c.Shared == nil || c.Box == nil {
			continue
		}
		if box, ok := documentCache.get(c.Shared.ID); ok {
			c.Shared.Box = box
		} else {
			missing = append(missing, c.Shared.ID)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	found, err := readThrough(g, dialect, "config_documents", "id", "box", missing, base64.StdEncoding.DecodeString, documentCache)
	if err != nil {
		return fmt.Errorf("read shared configuration documents: %w", err)
	}
	for _, c := range cs {
		if c.Shared == nil || c.Box == nil || c.Shared.Box != nil {
			continue
		}
		box, ok := found[c.Shared.ID]
		if !ok {
			return fmt.Errorf("node %s's configuration names shared document %s, which is not stored", c.NodeID, c.Shared.ID)
		}
		c.Shared.Box = box
	}
	return nil
}

// pruneConfigDocuments deletes at most batch shared documents that no
// configuration row names. Only the transaction that stores a document
// names it, so none that this finds unnamed is named again.
func pruneConfigDocuments(g *gorm.DB, batch int) error {
	return g.Exec(pruneConfigDocumentsSQL, batch).Error
}

// pruneConfigDocumentsSQL: whether a row names a document is one probe of
// node_configs_document (the rows that name one).
const pruneConfigDocumentsSQL = `DELETE FROM config_documents WHERE id IN (
		SELECT d.id FROM config_documents d
		WHERE NOT EXISTS (SELECT 1 FROM node_configs c WHERE c.document_id = d.id)
		LIMIT ?)`
