-- +goose Up
-- Reveal handles (DECISIONS.md §16, §37): one per secret an operation
-- generates, redeemable once by its submitter within its TTL. The handle
-- is named by its SHA-256 and kept AES-GCM sealed (key_id, box: base64 of
-- nonce and ciphertext) so a replay of the submit answers it again; the
-- secret itself is never stored (it is produced again when redeemed).
CREATE TABLE reveal_handles (
    digest         TEXT PRIMARY KEY,
    principal_kind TEXT NOT NULL,
    principal_id   TEXT NOT NULL,
    request_id     TEXT NOT NULL,
    operation_id   TEXT NOT NULL,
    field          TEXT NOT NULL,
    key_id         TEXT NOT NULL,
    box            TEXT NOT NULL,
    state          TEXT NOT NULL,
    created_at     DATETIME NOT NULL,
    expires_at     DATETIME NOT NULL,
    spent_at       DATETIME
);
CREATE INDEX reveal_handles_operation ON reveal_handles(operation_id);
CREATE INDEX reveal_handles_expiry ON reveal_handles(state, expires_at);

-- +goose Down
DROP TABLE reveal_handles;
