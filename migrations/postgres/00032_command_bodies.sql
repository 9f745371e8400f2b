-- +goose Up
-- A fleet.command's children carry one payload, and each node's command
-- held its own copy: 10,000 nodes of a 200 KB payload wrote 2 GB, in
-- transactions of five children each, and read it back per delivery
-- (BENCHMARKS.md, forty-fourth sitting). A command whose payload_body is
-- set has an empty payload and names the payload's text in
-- operation_bodies (migration 00030) by its digest; retention keeps a body
-- while a command names it.
ALTER TABLE commands ADD COLUMN payload_body TEXT;
-- Retention's check that no command names a body.
CREATE INDEX commands_payload_body ON commands(payload_body) WHERE payload_body IS NOT NULL;

-- +goose Down
UPDATE commands c SET payload = b.body, payload_body = NULL FROM operation_bodies b WHERE c.payload_body = b.digest;
DROP INDEX commands_payload_body;
ALTER TABLE commands DROP COLUMN payload_body;
