-- +goose Up
-- Postgres only (a page fill factor for HOT claims of commands); SQLite has
-- no such setting. Kept so both dialects number their migrations alike.
SELECT 1;

-- +goose Down
SELECT 1;
