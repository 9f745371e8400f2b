-- +goose Up
-- A fleet.configure's nodes share one sealed copy of the document
-- (Postgres's 00031 says why).
CREATE TABLE config_documents (
    id  TEXT PRIMARY KEY,
    box TEXT NOT NULL
);
ALTER TABLE node_configs ADD COLUMN document_id TEXT;
CREATE INDEX node_configs_document ON node_configs(document_id) WHERE document_id IS NOT NULL;

-- +goose Down
-- Refused while a node's desired configuration names a shared document
-- (Postgres's 00031 says why): the CHECK fails on a count above zero.
CREATE TEMP TABLE shared_documents_named (n INTEGER CHECK (n = 0));
INSERT INTO shared_documents_named SELECT COUNT(*) FROM node_configs WHERE document_id IS NOT NULL;
DROP TABLE shared_documents_named;
DROP INDEX node_configs_document;
ALTER TABLE node_configs DROP COLUMN document_id;
DROP TABLE config_documents;
