-- +goose Up
-- Nothing on SQLite: it has no plan cache to steer (Postgres: see its
-- 00029).
SELECT 1;

-- +goose Down
SELECT 1;
