-- +goose Up
-- The per-node quota count inside nodeward_open_for_node (run by every
-- command's submit) was planned anew on every call in some runs: PL/pgSQL
-- keeps a statement's plan per connection, but the plan cache replans
-- each call while it judges the generic plan costlier than a custom one,
-- which statistics of a young, fast-growing operations table can make it
-- do for good (a load run: 7,645 calls, 1,343 ms of planning against
-- 130 ms of execution). The generic plan is the one wanted (a key lookup
-- by target, never the index of every open operation:
-- TestPostgresOpenOperationsGenericPlans), so the function always uses it.
ALTER FUNCTION nodeward_open_for_node(text, text, text[]) SET plan_cache_mode = force_generic_plan;

-- +goose Down
ALTER FUNCTION nodeward_open_for_node(text, text, text[]) RESET plan_cache_mode;
