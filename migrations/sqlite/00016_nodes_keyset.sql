-- +goose Up
-- The nodes listing is keyset-paged newest first on (created_at, id)
-- (nodes_listing); filtered by state it reads this index instead, so a
-- page of a rare state (enrolling, lost) reads its 50 rows rather than
-- walking the whole listing to find them (the console benchmark,
-- cmd/consolebench, at 50,000 nodes).
CREATE INDEX nodes_state_listing ON nodes(state, created_at, id);

-- +goose Down
DROP INDEX nodes_state_listing;
