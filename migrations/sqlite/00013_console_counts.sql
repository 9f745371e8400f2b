-- +goose Up
-- The console's fleet overview counts from indexes or maintained counters,
-- never a scan of the ledger, the commands or the nodes (a million
-- operations, 50,000 nodes):
-- operations created in the last hour, by state (an index range per state);
-- operations that ended failed in the last day, and commands refused in it
-- (small partial indexes: only failed and refused rows are in them).
CREATE INDEX operations_state_created ON operations(state, created_at);
CREATE INDEX operations_failed_finished ON operations(finished_at) WHERE state = 'failed';
CREATE INDEX commands_refused_settled ON commands(settled_at) WHERE state = 'refused';

-- Nodes by state: a counter kept by triggers as an append-only log of
-- changes (+1 to the new state, -1 to the old); the fleet folds the log
-- into one row per state now and then (FoldNodeCounts), and a read sums
-- what is there. (Postgres has the same table and triggers.)
CREATE TABLE node_state_counts (
    id    INTEGER PRIMARY KEY AUTOINCREMENT,
    state TEXT NOT NULL,
    n     INTEGER NOT NULL
);
INSERT INTO node_state_counts(state, n) SELECT state, COUNT(*) FROM nodes GROUP BY state;

-- +goose StatementBegin
CREATE TRIGGER nodes_count_insert AFTER INSERT ON nodes
BEGIN
    INSERT INTO node_state_counts(state, n) VALUES (NEW.state, 1);
END;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TRIGGER nodes_count_delete AFTER DELETE ON nodes
BEGIN
    INSERT INTO node_state_counts(state, n) VALUES (OLD.state, -1);
END;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TRIGGER nodes_count_update AFTER UPDATE OF state ON nodes WHEN OLD.state IS NOT NEW.state
BEGIN
    INSERT INTO node_state_counts(state, n) VALUES (OLD.state, -1);
    INSERT INTO node_state_counts(state, n) VALUES (NEW.state, 1);
END;
-- +goose StatementEnd

-- +goose Down
DROP TRIGGER nodes_count_update;
DROP TRIGGER nodes_count_delete;
DROP TRIGGER nodes_count_insert;
DROP TABLE node_state_counts;
DROP INDEX commands_refused_settled;
DROP INDEX operations_failed_finished;
DROP INDEX operations_state_created;
