-- +goose Up
CREATE TABLE nodes (
    id                       TEXT PRIMARY KEY,
    rental_id                TEXT NOT NULL,
    generation               BIGINT NOT NULL,
    state                    TEXT NOT NULL,
    fencing_token            BIGINT NOT NULL DEFAULT 0,
    created_at               TIMESTAMPTZ NOT NULL,
    updated_at               TIMESTAMPTZ NOT NULL,
    enrolled_at              TIMESTAMPTZ,
    lease_expires_at         TIMESTAMPTZ,
    last_heartbeat_at        TIMESTAMPTZ,
    retired_at               TIMESTAMPTZ,
    agent_version            TEXT NOT NULL DEFAULT '',
    facts                    TEXT,
    facts_observed_at        TIMESTAMPTZ,
    facts_received_at        TIMESTAMPTZ,
    disk_state               TEXT NOT NULL DEFAULT 'never_reported',
    disk_free_bytes          BIGINT,
    disk_observed_at         TIMESTAMPTZ,
    price_micros             BIGINT,
    billing_interval_seconds BIGINT,
    eligible_classes         TEXT NOT NULL DEFAULT '[]',
    available_until          TIMESTAMPTZ,
    UNIQUE (rental_id, generation)
);
CREATE INDEX nodes_state ON nodes(state, lease_expires_at);
CREATE INDEX nodes_listing ON nodes(created_at, id);

CREATE TABLE invitations (
    id           TEXT PRIMARY KEY,
    node_id      TEXT NOT NULL REFERENCES nodes(id),
    generation   BIGINT NOT NULL,
    token_digest TEXT NOT NULL UNIQUE,
    issued_at    TIMESTAMPTZ NOT NULL,
    expires_at   TIMESTAMPTZ NOT NULL,
    state        TEXT NOT NULL,
    redeemed_at  TIMESTAMPTZ
);
CREATE INDEX invitations_node ON invitations(node_id, state);

CREATE TABLE node_events (
    node_id     TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    received_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (node_id, event_id)
);

CREATE TABLE workloads (
    node_id     TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    attempt_id  TEXT NOT NULL,
    state       TEXT NOT NULL,
    exit_code   INTEGER,
    observed_at TIMESTAMPTZ NOT NULL,
    received_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (node_id, run_id, attempt_id)
);

-- Every change to a node, kept as the seam the operations ledger folds in.
CREATE TABLE node_audit (
    id      BIGSERIAL PRIMARY KEY,
    at      TIMESTAMPTZ NOT NULL,
    actor   TEXT NOT NULL,
    action  TEXT NOT NULL,
    node_id TEXT NOT NULL,
    detail  TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX node_audit_node ON node_audit(node_id, id);

-- +goose Down
DROP TABLE node_audit;
DROP TABLE workloads;
DROP TABLE node_events;
DROP TABLE invitations;
DROP TABLE nodes;
