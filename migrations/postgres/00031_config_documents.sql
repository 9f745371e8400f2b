-- +goose Up
-- A fleet.configure's nodes share one sealed copy of the document: each
-- node's row held its own (340 KB of base64 at 256 KiB, incompressible),
-- so a wave over 10,000 nodes wrote and read gigabytes (BENCHMARKS.md,
-- forty-second sitting). config_documents holds a document sealed once
-- under a data key of its own; a row whose document_id is set holds in
-- box that key, sealed for the node and revision (fleet.SharedDocument).
-- Retention deletes a document once no row names it.
CREATE TABLE config_documents (
    id  TEXT PRIMARY KEY,
    box TEXT NOT NULL
);
ALTER TABLE node_configs ADD COLUMN document_id TEXT;
-- Retention's check that no row names a document.
CREATE INDEX node_configs_document ON node_configs(document_id) WHERE document_id IS NOT NULL;

-- +goose Down
-- A shared document opens only through a key sealed under the master key,
-- which SQL cannot reach: going back is refused while a node's desired
-- configuration names one (configure those nodes again, one by one with
-- node.configure, on this release first).
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM node_configs WHERE document_id IS NOT NULL) THEN
        RAISE EXCEPTION 'node_configs name shared documents (config_documents); configure those nodes again with node.configure before migrating down';
    END IF;
END
$$;
-- +goose StatementEnd
DROP INDEX node_configs_document;
ALTER TABLE node_configs DROP COLUMN document_id;
DROP TABLE config_documents;
