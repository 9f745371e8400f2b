-- +goose Up
-- The digest of the agent-chosen nonce its latest enrollment carried, so
-- the same agent retrying an enrollment whose answer it lost is answered
-- again at the same fencing token instead of enrollment_spent. Empty when
-- the enrollment carried none.
ALTER TABLE nodes ADD COLUMN enroll_nonce_digest TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE nodes DROP COLUMN enroll_nonce_digest;
