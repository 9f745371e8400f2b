-- +goose Up
-- A configure operation is running once its revision was delivered to the
-- node (ARCHITECTURE.md §3: accepted by its channel) and still ends
-- timed_out at its deadline: the deadline sweep finds those through this
-- small partial index beside operations_undelivered.
CREATE INDEX operations_configure_running ON operations(deadline) WHERE state = 'running' AND kind = 'node.configure';

-- +goose Down
DROP INDEX operations_configure_running;
