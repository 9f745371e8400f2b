-- +goose Up
-- Package hosts (ARCHITECTURE.md §5, DECISIONS.md §39): a token works only
-- while the generation it was minted at is its host's current generation,
-- so bumping the generation (revocation, or a new token) stops every older
-- token at once. Tokens are kept as SHA-256 only. seq is the listing's
-- keyset cursor; id the host's public identity.
CREATE TABLE package_hosts (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id         TEXT NOT NULL UNIQUE,
    name       TEXT NOT NULL UNIQUE,
    families   TEXT NOT NULL,
    generation BIGINT NOT NULL,
    created_at DATETIME NOT NULL,
    updated_at DATETIME NOT NULL,
    revoked_at DATETIME
);

CREATE TABLE package_host_tokens (
    token_hash   TEXT PRIMARY KEY,
    host_id      TEXT NOT NULL REFERENCES package_hosts(id),
    generation   BIGINT NOT NULL,
    operation_id TEXT NOT NULL,
    created_at   DATETIME NOT NULL
);
CREATE INDEX package_host_tokens_host ON package_host_tokens(host_id, generation);

-- +goose Down
DROP TABLE package_host_tokens;
DROP TABLE package_hosts;
