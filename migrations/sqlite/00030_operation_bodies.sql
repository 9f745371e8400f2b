-- +goose Up
-- A fan-out's children name their shared operation by digest (Postgres's
-- 00030 says why).
CREATE TABLE operation_bodies (
    digest  TEXT PRIMARY KEY,
    body    TEXT NOT NULL,
    used_at DATETIME NOT NULL
);
ALTER TABLE operations ADD COLUMN body_digest TEXT;
CREATE INDEX operations_body ON operations(body_digest) WHERE body_digest IS NOT NULL;

-- +goose Down
UPDATE operations SET operation = (SELECT b.body FROM operation_bodies b WHERE b.digest = operations.body_digest),
    body_digest = NULL
  WHERE body_digest IS NOT NULL;
DROP INDEX operations_body;
ALTER TABLE operations DROP COLUMN body_digest;
DROP TABLE operation_bodies;
