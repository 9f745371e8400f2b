-- +goose Up
-- Every index of operations and commands takes an entry when a node
-- command is inserted and again when it settles (that update is never
-- HOT): index maintenance is what a settled command costs Postgres
-- (issue 13). These went, each served otherwise:
--   family, target_kind: a family is a function of the kind, and a kind
--     declares the target kinds it is indexed under (a fan-out's: node
--     or fleet), so the listing's family, kind and target_kind filters
--     read exact ranges of one (kind, target_kind, seq) index, one per
--     pair they leave possible (ledger.Registry.Narrow, models
--     listQuery), which replaces the (kind, seq) index;
--   ended_created, finished, failed_finished: one index of ended
--     operations by end state and finish time serves the console's
--     counts of operations ended in a window (by state, failed in a day)
--     and retention's oldest ended operations (a range per end state);
--   commands_node: now commands_settled, of the settled commands only
--     (a pending command is commands_pending's), so an insert writes one
--     entry less; a node's commands of any state read both (models
--     nodeCommandsQuery). Nodes are never deleted, so no foreign key
--     check needs an index of every command by node.
DROP INDEX operations_family;
DROP INDEX operations_target_kind;
DROP INDEX operations_kind;
CREATE INDEX operations_kind_target ON operations(kind, target_kind, seq);
-- The planner takes kind and target_kind for independent: a fan-out kind
-- that is common but always over the fleet then looks common over a node
-- too, and its branch of a target_kind=node listing walked the whole
-- table by seq looking for rows that are not there (docs/ledger-plans.md).
-- Their pairs' frequencies tell it the truth.
CREATE STATISTICS operations_kind_target_mcv (mcv) ON kind, target_kind FROM operations;
ANALYZE operations;
DROP INDEX operations_ended_created;
DROP INDEX operations_finished;
DROP INDEX operations_failed_finished;
CREATE INDEX operations_ended_finished ON operations(end_state, finished_at) WHERE end_state IS NOT NULL;
DROP INDEX commands_node;
CREATE INDEX commands_settled ON commands(node_id, issued_at, operation_id) WHERE state <> 'pending';

-- +goose Down
DROP INDEX commands_settled;
CREATE INDEX commands_node ON commands(node_id, issued_at, operation_id);
DROP INDEX operations_ended_finished;
CREATE INDEX operations_failed_finished ON operations(finished_at) WHERE end_state = 'failed' AND finished_at IS NOT NULL;
CREATE INDEX operations_finished ON operations(finished_at) WHERE terminal = TRUE;
CREATE INDEX operations_ended_created ON operations(end_state, created_at) WHERE end_state IS NOT NULL;
CREATE INDEX operations_target_kind ON operations(target_kind, seq);
DROP STATISTICS operations_kind_target_mcv;
DROP INDEX operations_kind_target;
CREATE INDEX operations_kind ON operations(kind, seq);
CREATE INDEX operations_family ON operations(family, seq);
