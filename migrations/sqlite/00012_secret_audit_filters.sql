-- +goose Up
-- The secret audit's filters (GET /api/v1/secret-audit, the console's
-- secret audit page): each is served by an index ending in seq, so a page
-- of a rare value (a denial, one operation's uses) is read newest first
-- without scanning the log.
CREATE INDEX secret_audit_principal ON secret_audit(principal_id, seq);
CREATE INDEX secret_audit_operation ON secret_audit(operation_id, seq);
CREATE INDEX secret_audit_target ON secret_audit(target_id, seq);
CREATE INDEX secret_audit_action ON secret_audit(action, seq);
CREATE INDEX secret_audit_outcome ON secret_audit(outcome, seq);

-- +goose Down
DROP INDEX secret_audit_outcome;
DROP INDEX secret_audit_action;
DROP INDEX secret_audit_target;
DROP INDEX secret_audit_operation;
DROP INDEX secret_audit_principal;
