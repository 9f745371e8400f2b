-- +goose Up
CREATE TABLE commands (
    operation_id       TEXT PRIMARY KEY,
    node_id            TEXT NOT NULL REFERENCES nodes(id),
    kind               TEXT NOT NULL,
    payload            TEXT NOT NULL,
    payload_digest     TEXT NOT NULL,
    fencing_token      BIGINT NOT NULL,
    issued_at          DATETIME NOT NULL,
    state              TEXT NOT NULL,
    failure_code       TEXT,
    failure_message    TEXT,
    delivered_fencing  BIGINT,
    first_delivered_at DATETIME,
    last_delivered_at  DATETIME,
    delivery_count     INTEGER NOT NULL DEFAULT 0,
    settled_at         DATETIME
);
CREATE INDEX commands_node ON commands(node_id, issued_at, operation_id);
CREATE INDEX commands_pending ON commands(node_id, issued_at, operation_id) WHERE state = 'pending';

-- Each replica publishes the long-polls it holds, so any replica can list
-- every connected node.
CREATE TABLE replicas (
    id           TEXT PRIMARY KEY,
    started_at   DATETIME NOT NULL,
    heartbeat_at DATETIME NOT NULL,
    sessions     TEXT NOT NULL DEFAULT '[]'
);

-- +goose Down
DROP TABLE replicas;
DROP TABLE commands;
