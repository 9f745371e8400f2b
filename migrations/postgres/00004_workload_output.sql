-- +goose Up
-- What each exited workload attempt wrote last (DECISIONS §43): the tail of
-- stdout and of stderr, at most 64 KiB each, as text. The first report of an
-- attempt is kept; the agent's retries change nothing.
CREATE TABLE workload_outputs (
    node_id     TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    attempt_id  TEXT NOT NULL,
    stdout_tail TEXT NOT NULL,
    stderr_tail TEXT NOT NULL,
    truncated   BOOLEAN NOT NULL,
    received_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (node_id, run_id, attempt_id)
);

-- +goose Down
DROP TABLE workload_outputs;
