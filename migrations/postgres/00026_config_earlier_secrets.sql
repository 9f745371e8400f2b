-- +goose Up
-- The sealed values of the configuration revisions this one replaced (the
-- last 16 that had any), sealed as one JSON list under
-- earlier_secrets_key_id: a node may still report on a replaced revision
-- (its hook was running when the next configure came), and its message
-- must be scrubbed of that revision's values too (DECISIONS.md §32), not
-- only of the current one's. NULL: none.
ALTER TABLE node_configs ADD COLUMN earlier_secrets_key_id TEXT NOT NULL DEFAULT '';
ALTER TABLE node_configs ADD COLUMN earlier_secrets TEXT;

-- +goose Down
ALTER TABLE node_configs DROP COLUMN earlier_secrets;
ALTER TABLE node_configs DROP COLUMN earlier_secrets_key_id;
