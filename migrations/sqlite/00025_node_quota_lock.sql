-- +goose Up
-- Nothing on SQLite: one writer at a time, no row locks (Postgres: see its
-- 00025).
SELECT 1;

-- +goose Down
SELECT 1;
