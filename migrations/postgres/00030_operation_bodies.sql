-- +goose Up
-- A fan-out's children carry one operation (a fleet.configure's document,
-- a fleet.command's payload): each child's row named it by digest instead
-- of holding its own copy — 10,000 children of a 250 KB document were
-- 2.5 GB written in the fan-out's first transaction, and kept for the
-- ledger's 90 days (BENCHMARKS.md, forty-first sitting). operation_bodies
-- holds each such operation once, by the lowercase hex SHA-256 of its
-- text; a row whose body_digest is set has an empty operation. used_at is
-- stamped by every insert that names the body, so retention deletes only
-- bodies no row names and no transaction named in the last hour.
CREATE TABLE operation_bodies (
    digest  TEXT PRIMARY KEY,
    body    TEXT NOT NULL,
    used_at TIMESTAMPTZ NOT NULL
);
ALTER TABLE operations ADD COLUMN body_digest TEXT;
-- Retention's check that no operation names a body.
CREATE INDEX operations_body ON operations(body_digest) WHERE body_digest IS NOT NULL;

-- +goose Down
UPDATE operations o SET operation = b.body, body_digest = NULL FROM operation_bodies b WHERE o.body_digest = b.digest;
DROP INDEX operations_body;
ALTER TABLE operations DROP COLUMN body_digest;
DROP TABLE operation_bodies;
