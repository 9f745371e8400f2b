-- +goose Up
-- A held poll renews its node's lease about once a minute: at 50,000
-- agents, about 1,000 updates of nodes a second. lease_expires_at sat in
-- nodes_state, so no renewal could be a heap-only (HOT) update: each
-- wrote a new entry into every index of nodes (five) and ~560 bytes of
-- WAL (BenchmarkRenewLeasesFleet). Without an index on the lease, and
-- with room left on each page for the new row version, a renewal touches
-- no index. The lease sweeper's question (a ready node whose lease
-- lapsed?) reads the ready nodes through nodes_state_listing instead,
-- once a sweep interval, which costs less than the index did.
DROP INDEX nodes_state;
ALTER TABLE nodes SET (fillfactor = 80);

-- +goose Down
ALTER TABLE nodes RESET (fillfactor);
CREATE INDEX nodes_state ON nodes(state, lease_expires_at);
