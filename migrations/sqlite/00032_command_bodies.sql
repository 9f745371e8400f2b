-- +goose Up
-- A fleet.command's children name one stored copy of their payload
-- (Postgres's 00032 says why).
ALTER TABLE commands ADD COLUMN payload_body TEXT;
CREATE INDEX commands_payload_body ON commands(payload_body) WHERE payload_body IS NOT NULL;

-- +goose Down
UPDATE commands SET payload = (SELECT b.body FROM operation_bodies b WHERE b.digest = commands.payload_body), payload_body = NULL
    WHERE payload_body IS NOT NULL;
DROP INDEX commands_payload_body;
ALTER TABLE commands DROP COLUMN payload_body;
