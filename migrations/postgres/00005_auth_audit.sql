-- +goose Up
-- Repeated refusals of one client fold into one row (auth.CoalesceAudit):
-- count says how many, last_at when the latest was.
ALTER TABLE admin_audit ADD COLUMN count BIGINT NOT NULL DEFAULT 1;
ALTER TABLE admin_audit ADD COLUMN last_at TIMESTAMPTZ;
CREATE INDEX admin_audit_client ON admin_audit(remote_addr, action, outcome, id);

-- +goose Down
DROP INDEX admin_audit_client;
ALTER TABLE admin_audit DROP COLUMN last_at;
ALTER TABLE admin_audit DROP COLUMN count;
