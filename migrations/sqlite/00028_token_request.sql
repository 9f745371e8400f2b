-- +goose Up
-- The console's create-token form carries a request id, so a form sent
-- twice (a double click, a reload) mints one token, not two: the second
-- submission finds the first's row. NULL for tokens made elsewhere.
ALTER TABLE api_tokens ADD COLUMN request_id TEXT;
CREATE UNIQUE INDEX api_tokens_request ON api_tokens(user_id, request_id) WHERE request_id IS NOT NULL;

-- +goose Down
DROP INDEX api_tokens_request;
ALTER TABLE api_tokens DROP COLUMN request_id;
