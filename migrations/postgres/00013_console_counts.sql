-- +goose Up
-- The console's fleet overview counts from indexes, never a scan of the
-- ledger or the commands (a million operations, 50,000 nodes):
-- operations created in the last hour, by state (an index range per state);
-- operations that ended failed in the last day, and commands refused in it
-- (small partial indexes: only failed and refused rows are in them).
CREATE INDEX operations_state_created ON operations(state, created_at);
CREATE INDEX operations_failed_finished ON operations(finished_at) WHERE state = 'failed';
CREATE INDEX commands_refused_settled ON commands(settled_at) WHERE state = 'refused';

-- +goose Down
DROP INDEX commands_refused_settled;
DROP INDEX operations_failed_finished;
DROP INDEX operations_state_created;
