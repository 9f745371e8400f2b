-- +goose Up
-- A command's submit takes its node's row FOR KEY SHARE (models:
-- issueSQL), which lease renewals (FOR NO KEY UPDATE) do not wait for:
-- at 50,000 held polls the renewals and the submits queued behind each
-- other on the nodes' rows. What the stronger lock also did was to make
-- the per-node quota exact: two submits for one node counted one after
-- the other. That is now this lock, per node, taken before counting and
-- held to the end of the transaction; its count's snapshot is taken after
-- it (VOLATILE), so it sees a submit that held it before. It is the lock
-- the ledger takes for a node's other operations (LockKey('node:' || id)),
-- so every count of one node's quota waits for the others: a command and
-- a configure for one node too. A hash collision only orders two nodes.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION nodeward_open_for_node(node text, but text, exempt text[]) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
	PERFORM pg_advisory_xact_lock(hashtextextended('node:' || $1, 0));
	-- The text of models.openForNodeFunctionSQL (a test keeps them equal).
	RETURN (SELECT count(*) FROM operations
		WHERE target_id = $1 AND terminal = FALSE AND target_kind = 'node'
			AND id <> $2 AND kind <> ALL ($3::text[]));
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION nodeward_open_for_node(node text, but text, exempt text[]) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
	RETURN (SELECT count(*) FROM operations
		WHERE target_id = node AND terminal = FALSE AND target_kind = 'node'
			AND id <> but AND kind <> ALL (exempt));
END
$$;
-- +goose StatementEnd
