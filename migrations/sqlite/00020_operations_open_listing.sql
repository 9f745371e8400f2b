-- +goose Up
-- operations_open serves the listing's open-state filter (and the counts of
-- open operations by state). Its predicate now also names end_state IS
-- NULL — the same rows (end_state is NULL exactly while terminal is FALSE,
-- migration 00017) — which only the statements meant for it state, so no
-- other statement over open operations (the per-node quota count) can take
-- it (Postgres's generic plans did; SQLite keeps the same indexes so both
-- dialects plan alike).
DROP INDEX operations_open;
CREATE INDEX operations_open ON operations(seq) WHERE terminal = FALSE AND end_state IS NULL;

-- +goose Down
DROP INDEX operations_open;
CREATE INDEX operations_open ON operations(seq) WHERE terminal = FALSE;
