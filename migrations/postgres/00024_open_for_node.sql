-- +goose Up
-- The per-node quota count of a command's submit, taken inside the
-- statement that records the command (models: issueSQL), which saves the
-- submit a statement and a round trip. It must count what a statement of
-- its own would: an operation another replica committed while this
-- submit waited for the node's lock included. A subquery would read the
-- snapshot the statement took before that wait; a VOLATILE function's
-- query takes its own snapshot when it runs, which is after the lock.
-- The operation being recorded is left out by id (whether the
-- statement's own insert is visible to the function depends on the order
-- Postgres runs the statement's parts in); the caller adds it back.
-- +goose StatementBegin
CREATE FUNCTION nodeward_open_for_node(node text, but text, exempt text[]) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
	RETURN (SELECT count(*) FROM operations
		WHERE target_id = node AND terminal = FALSE AND target_kind = 'node'
			AND id <> but AND kind <> ALL (exempt));
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION nodeward_open_for_node(text, text, text[]);
