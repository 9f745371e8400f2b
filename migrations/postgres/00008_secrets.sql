-- +goose Up
-- Sealed secrets (ARCHITECTURE.md §4, DECISIONS.md §37). A handle is kept
-- as its SHA-256 only; the value as AES-GCM under the sealing subkey named
-- by key_id (box is base64 of nonce and ciphertext). A resolved value
-- waits, re-sealed, beside the operation that used it until delivered.
-- The audit never holds a value.
CREATE TABLE sealed_secrets (
    digest         TEXT PRIMARY KEY,
    principal_kind TEXT NOT NULL,
    principal_id   TEXT NOT NULL,
    request_id     TEXT NOT NULL,
    target_kind    TEXT NOT NULL,
    target_id      TEXT NOT NULL,
    field          TEXT NOT NULL,
    key_id         TEXT NOT NULL,
    box            TEXT NOT NULL,
    state          TEXT NOT NULL,
    operation_id   TEXT NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL,
    expires_at     TIMESTAMPTZ NOT NULL,
    used_at        TIMESTAMPTZ
);
CREATE INDEX sealed_secrets_live ON sealed_secrets(principal_kind, principal_id, state, expires_at);
CREATE INDEX sealed_secrets_expiry ON sealed_secrets(expires_at);

CREATE TABLE secret_deliveries (
    operation_id TEXT NOT NULL,
    field        TEXT NOT NULL,
    key_id       TEXT NOT NULL,
    box          TEXT NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (operation_id, field)
);

CREATE TABLE secret_audit (
    seq BIGSERIAL PRIMARY KEY,
    at             TIMESTAMPTZ NOT NULL,
    action         TEXT NOT NULL,
    outcome        TEXT NOT NULL,
    principal_kind TEXT NOT NULL,
    principal_id   TEXT NOT NULL,
    handle_digest  TEXT NOT NULL,
    request_id     TEXT NOT NULL,
    operation_id   TEXT NOT NULL,
    target_kind    TEXT NOT NULL,
    target_id      TEXT NOT NULL,
    field          TEXT NOT NULL
);

-- +goose Down
DROP TABLE secret_audit;
DROP TABLE secret_deliveries;
DROP TABLE sealed_secrets;
