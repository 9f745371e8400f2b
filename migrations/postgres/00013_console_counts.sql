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
-- changes (+1 to the new state, -1 to the old), so a state change never
-- waits on another's counter row (no hot row, no lock order to deadlock
-- on); the fleet folds the log into one row per state now and then
-- (FoldNodeCounts), and a read sums what is there.
CREATE TABLE node_state_counts (
    id    BIGSERIAL PRIMARY KEY,
    state TEXT NOT NULL,
    n     BIGINT NOT NULL
);
INSERT INTO node_state_counts(state, n) SELECT state, COUNT(*) FROM nodes GROUP BY state;

-- +goose StatementBegin
CREATE FUNCTION nodes_count_state() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' OR TG_OP = 'DELETE' THEN
        INSERT INTO node_state_counts(state, n) VALUES (OLD.state, -1);
    END IF;
    IF TG_OP = 'UPDATE' OR TG_OP = 'INSERT' THEN
        INSERT INTO node_state_counts(state, n) VALUES (NEW.state, 1);
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER nodes_count_insert_delete AFTER INSERT OR DELETE ON nodes
    FOR EACH ROW EXECUTE FUNCTION nodes_count_state();
CREATE TRIGGER nodes_count_update AFTER UPDATE OF state ON nodes
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION nodes_count_state();

-- +goose Down
DROP TRIGGER nodes_count_update ON nodes;
DROP TRIGGER nodes_count_insert_delete ON nodes;
DROP FUNCTION nodes_count_state();
DROP TABLE node_state_counts;
DROP INDEX commands_refused_settled;
DROP INDEX operations_failed_finished;
DROP INDEX operations_state_created;
