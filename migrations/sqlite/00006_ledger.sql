-- +goose Up
-- The operations ledger (ARCHITECTURE.md §3). seq is the keyset cursor of
-- every listing (newest first); id is the operation's public identity.
-- held marks a fan-out child waiting for a slot under its parent's
-- max_concurrency (nothing was handed to its node yet); counts is set on a
-- fan-out parent once it recorded its children.
CREATE TABLE operations (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id                      TEXT NOT NULL UNIQUE,
    request_id              TEXT NOT NULL,
    digest                  TEXT NOT NULL,
    principal_kind          TEXT NOT NULL,
    principal_id            TEXT NOT NULL,
    principal_name          TEXT NOT NULL DEFAULT '',
    package_host_generation BIGINT NOT NULL DEFAULT 0,
    family                  TEXT NOT NULL,
    kind                    TEXT NOT NULL,
    state                   TEXT NOT NULL,
    terminal                BOOLEAN NOT NULL DEFAULT FALSE,
    channel                 TEXT NOT NULL,
    attempt                 INTEGER NOT NULL DEFAULT 0,
    targets                 TEXT NOT NULL DEFAULT '[]',
    target_kind             TEXT NOT NULL DEFAULT '',
    target_id               TEXT NOT NULL DEFAULT '',
    parent_id               TEXT,
    held                    BOOLEAN NOT NULL DEFAULT FALSE,
    counts                  TEXT,
    reason                  TEXT NOT NULL DEFAULT '',
    operation               TEXT NOT NULL,
    result                  TEXT,
    error_code              TEXT,
    error_message           TEXT,
    error_retryable         BOOLEAN,
    evidence                TEXT,
    cancel_requested_at     DATETIME,
    cancel_reason           TEXT NOT NULL DEFAULT '',
    owner                   TEXT NOT NULL DEFAULT '',
    created_at              DATETIME NOT NULL,
    accepted_at             DATETIME,
    finished_at             DATETIME,
    deadline                DATETIME NOT NULL,
    updated_at              DATETIME NOT NULL
);
-- The idempotency key (DECISIONS.md §13).
CREATE UNIQUE INDEX operations_request ON operations(principal_kind, principal_id, request_id);
-- One index per listing filter, each ending in seq so a filtered listing
-- walks newest first without sorting.
CREATE INDEX operations_principal ON operations(principal_kind, principal_id, seq);
CREATE INDEX operations_family ON operations(family, seq);
CREATE INDEX operations_kind ON operations(kind, seq);
CREATE INDEX operations_state ON operations(state, seq);
CREATE INDEX operations_parent ON operations(parent_id, seq) WHERE parent_id IS NOT NULL;
CREATE INDEX operations_fanning_out ON operations(seq) WHERE state = 'running' AND counts IS NOT NULL;
-- target_id alone is a filter too (a node's operations, whatever their
-- kind), so it leads an index of its own.
CREATE INDEX operations_target_kind ON operations(target_kind, seq);
CREATE INDEX operations_target_id ON operations(target_id, seq);
CREATE INDEX operations_request_id ON operations(request_id, seq);
-- The dispatcher's queue and the quota counts look at open operations only.
CREATE INDEX operations_claimable ON operations(seq) WHERE state = 'pending' AND channel = 'local' AND held = FALSE;
CREATE INDEX operations_undelivered ON operations(deadline) WHERE state = 'pending' AND channel = 'long_poll';
CREATE INDEX operations_owned ON operations(owner) WHERE state = 'running' AND channel = 'local';
CREATE INDEX operations_open_target ON operations(target_id) WHERE terminal = FALSE;
CREATE INDEX operations_open_principal ON operations(principal_kind, principal_id) WHERE terminal = FALSE AND parent_id IS NULL;
CREATE INDEX operations_finished ON operations(finished_at) WHERE terminal = TRUE;

CREATE TABLE operation_events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    operation_id TEXT NOT NULL,
    type         TEXT NOT NULL,
    at           DATETIME NOT NULL,
    data         TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX operation_events_operation ON operation_events(operation_id, seq);
CREATE INDEX operation_events_at ON operation_events(at);

-- Each replica that runs operations holds a lease here; what a replica
-- whose lease lapsed left running is recovered by another.
CREATE TABLE operation_owners (
    replica    TEXT PRIMARY KEY,
    expires_at DATETIME NOT NULL
);

-- +goose Down
DROP TABLE operation_owners;
DROP TABLE operation_events;
DROP TABLE operations;
