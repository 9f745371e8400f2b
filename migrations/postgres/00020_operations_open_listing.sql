-- +goose Up
-- operations_open serves the listing's open-state filter (and the counts of
-- open operations by state). Its predicate was terminal = FALSE, which
-- every statement over open operations implies, so a generic plan could
-- take it for the per-node quota count (target_id = $1 AND terminal =
-- FALSE ...): on a table analyzed while few operations were open it did,
-- and walked every open operation (filtering target_id) instead of the
-- node's few in operations_open_target, on every command submitted. Its
-- predicate now also names end_state IS NULL — the same rows (end_state
-- is NULL exactly while terminal is FALSE, migration 00017) — which only
-- the statements meant for it state, so no other can take it.
DROP INDEX operations_open;
CREATE INDEX operations_open ON operations(seq) WHERE terminal = FALSE AND end_state IS NULL;

-- +goose Down
DROP INDEX operations_open;
CREATE INDEX operations_open ON operations(seq) WHERE terminal = FALSE;
