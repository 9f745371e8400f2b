-- +goose Up
-- A held poll renews its node's lease about once a minute; with
-- lease_expires_at in nodes_state each renewal also moved the node's
-- entry in that index. The lease sweeper reads the ready nodes through
-- nodes_state_listing instead (Postgres: see its 00023, where this also
-- lets a renewal be a heap-only update).
DROP INDEX nodes_state;

-- +goose Down
CREATE INDEX nodes_state ON nodes(state, lease_expires_at);
