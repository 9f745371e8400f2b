-- +goose Up
-- Nothing on SQLite: its submit counts a node's open operations with a
-- statement of its own, which runs in-process (Postgres: see its 00024).
SELECT 1;

-- +goose Down
SELECT 1;
