-- +goose Up
-- A node command's operation is written three times: inserted pending,
-- running at first delivery, ended at settlement (issue 13). Postgres 15
-- writes an update as HOT — a new row version on the same page and no
-- index entry at all — only when no indexed column's value changes (a
-- column in an index's key or in a partial index's predicate counts,
-- whether or not the row is in that index). The first delivery changes
-- state, accepted_at and updated_at; state was in 9 of the 21 indexes, so
-- every first delivery inserted an entry into 13 of them.
--
-- SQLite has no HOT; it keeps the same indexes so both dialects plan alike.
--
-- From here no index reads state. What the indexes need of it they read
-- from columns that keep their value at the first delivery:
--   terminal  (open or ended: changes only at the end),
--   end_state (generated: the state once ended, NULL while open; a
--             generated column is compared by value like any other, so
--             pending -> running leaves it NULL and the update HOT).
-- Indexes keyed on open operations no longer tell pending from running
-- (none can without making the first delivery non-HOT); the statements
-- filter state on the few open rows those indexes hold.
ALTER TABLE operations ADD COLUMN end_state TEXT GENERATED ALWAYS AS (CASE WHEN terminal THEN state END) VIRTUAL;

-- The listing's state filter: ended states by end_state, newest first;
-- open states (pending, running) through the open operations only.
DROP INDEX operations_state;
CREATE INDEX operations_ended ON operations(end_state, seq) WHERE end_state IS NOT NULL;
CREATE INDEX operations_open ON operations(seq) WHERE terminal = FALSE;
-- The console's counts of operations created in the last hour by state:
-- ended states by a range here, open states through operations_open.
DROP INDEX operations_state_created;
CREATE INDEX operations_ended_created ON operations(end_state, created_at) WHERE end_state IS NOT NULL;
DROP INDEX operations_failed_finished;
-- (finished_at IS NOT NULL in the predicate: the count of failed
-- operations created in the last hour, which names no finished_at, cannot
-- take this index instead of operations_ended_created — a generic plan
-- did, and read every failed operation.)
CREATE INDEX operations_failed_finished ON operations(finished_at) WHERE end_state = 'failed' AND finished_at IS NOT NULL;
-- Queues and sweeps over open operations, keyed as before.
DROP INDEX operations_fanning_out;
CREATE INDEX operations_fanning_out ON operations(seq) WHERE terminal = FALSE AND counts IS NOT NULL;
DROP INDEX operations_claimable;
CREATE INDEX operations_claimable ON operations(seq) WHERE terminal = FALSE AND channel = 'local' AND held = FALSE;
DROP INDEX operations_owned;
CREATE INDEX operations_owned ON operations(owner) WHERE terminal = FALSE AND channel = 'local';
-- The deadline sweep: undelivered node operations and delivered configure
-- operations, both open on channel long_poll (one index for the two).
DROP INDEX operations_undelivered;
DROP INDEX operations_configure_running;
CREATE INDEX operations_waiting ON operations(deadline) WHERE terminal = FALSE AND channel = 'long_poll';
-- The request_id listing filter reads the idempotency key's unique index
-- with request_id first (its matches are a handful of rows, sorted), so
-- the index that served it alone goes.
DROP INDEX operations_request_id;
DROP INDEX operations_request;
CREATE UNIQUE INDEX operations_request ON operations(request_id, principal_kind, principal_id);

-- +goose Down
DROP INDEX operations_request;
CREATE UNIQUE INDEX operations_request ON operations(principal_kind, principal_id, request_id);
CREATE INDEX operations_request_id ON operations(request_id, seq);
DROP INDEX operations_waiting;
CREATE INDEX operations_configure_running ON operations(deadline) WHERE state = 'running' AND kind = 'node.configure';
CREATE INDEX operations_undelivered ON operations(deadline) WHERE state = 'pending' AND channel = 'long_poll';
DROP INDEX operations_owned;
CREATE INDEX operations_owned ON operations(owner) WHERE state = 'running' AND channel = 'local';
DROP INDEX operations_claimable;
CREATE INDEX operations_claimable ON operations(seq) WHERE state = 'pending' AND channel = 'local' AND held = FALSE;
DROP INDEX operations_fanning_out;
CREATE INDEX operations_fanning_out ON operations(seq) WHERE state = 'running' AND counts IS NOT NULL;
DROP INDEX operations_failed_finished;
CREATE INDEX operations_failed_finished ON operations(finished_at) WHERE state = 'failed';
DROP INDEX operations_ended_created;
CREATE INDEX operations_state_created ON operations(state, created_at);
DROP INDEX operations_open;
DROP INDEX operations_ended;
CREATE INDEX operations_state ON operations(state, seq);
ALTER TABLE operations DROP COLUMN end_state;
