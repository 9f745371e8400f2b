-- +goose Up
-- Desired configuration (ARCHITECTURE.md §2, DECISIONS.md §32): one row per
-- node that was ever configured or reported a configuration. revision 0
-- means no desired configuration (a report arrived first). The document
-- is kept AES-GCM sealed (key_id, box: base64 of nonce and ciphertext)
-- with the real values of its sealed fields; sealed_pointers names them
-- (JSON pointers into the document) so admin reads can mask them. box is
-- NULL when the document is JSON null (the configuration was cleared).
-- settled: the last report names the desired revision and hash and is
-- applied, or failed and not forced since; delivery stops while settled
-- for the fencing token that reported (reported_fencing), so a
-- re-enrollment makes it due again. lagging is maintained on every write
-- (reported at least once and applied_revision < revision) so the lagging
-- listing and count read a partial index instead of every node.
CREATE TABLE node_configs (
    node_id            TEXT PRIMARY KEY,
    revision           BIGINT NOT NULL DEFAULT 0,
    hash               TEXT NOT NULL DEFAULT '',
    format             TEXT NOT NULL DEFAULT '',
    key_id             TEXT NOT NULL DEFAULT '',
    box                TEXT,
    sealed_pointers    TEXT NOT NULL DEFAULT '[]',
    size_bytes         BIGINT NOT NULL DEFAULT 0,
    updated_at         DATETIME NOT NULL,
    operation_id       TEXT NOT NULL DEFAULT '',
    settled            BOOLEAN NOT NULL DEFAULT FALSE,
    reported_revision  BIGINT,
    reported_hash      TEXT,
    reported_state     TEXT,
    reported_message   TEXT,
    reported_at        DATETIME,
    reported_fencing   BIGINT,
    applied_revision   BIGINT NOT NULL DEFAULT 0,
    lagging            BOOLEAN NOT NULL DEFAULT FALSE,
    delivered_fencing  BIGINT,
    delivered_revision BIGINT,
    delivered_at       DATETIME
);
CREATE INDEX node_configs_lagging ON node_configs(node_id) WHERE lagging;
CREATE INDEX node_configs_never_reported ON node_configs(node_id) WHERE revision > 0 AND reported_at IS NULL;

-- +goose Down
DROP TABLE node_configs;
