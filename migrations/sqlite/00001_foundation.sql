-- +goose Up
CREATE TABLE admin_users (
    id            TEXT PRIMARY KEY,
    username      TEXT NOT NULL UNIQUE,
    password_hash TEXT NOT NULL,
    created_at    DATETIME NOT NULL
);

CREATE TABLE api_tokens (
    id           TEXT PRIMARY KEY,
    name         TEXT NOT NULL,
    user_id      TEXT NOT NULL REFERENCES admin_users(id),
    token_hash   TEXT NOT NULL UNIQUE,
    created_at   DATETIME NOT NULL,
    last_used_at DATETIME,
    revoked_at   DATETIME
);
CREATE INDEX api_tokens_user ON api_tokens(user_id);

CREATE TABLE console_sessions (
    id          TEXT PRIMARY KEY,
    user_id     TEXT NOT NULL REFERENCES admin_users(id),
    created_at  DATETIME NOT NULL,
    expires_at  DATETIME NOT NULL,
    revoked_at  DATETIME,
    remote_addr TEXT NOT NULL DEFAULT ''
);
CREATE INDEX console_sessions_user ON console_sessions(user_id);

CREATE TABLE admin_audit (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    at          DATETIME NOT NULL,
    actor       TEXT NOT NULL,
    action      TEXT NOT NULL,
    target      TEXT NOT NULL DEFAULT '',
    outcome     TEXT NOT NULL,
    remote_addr TEXT NOT NULL DEFAULT '',
    detail      TEXT NOT NULL DEFAULT ''
);
CREATE INDEX admin_audit_at ON admin_audit(at);

-- +goose Down
DROP TABLE admin_audit;
DROP TABLE console_sessions;
DROP TABLE api_tokens;
DROP TABLE admin_users;
