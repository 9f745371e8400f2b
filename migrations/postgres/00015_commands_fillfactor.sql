-- +goose Up
-- A claim rewrites a command's delivery columns (fencing, delivered times,
-- count), none of them indexed: with room left on its page the new row
-- version stays there as a HOT update, which writes no index entry (the
-- table has four indexes). Commands are inserted in order and claimed soon
-- after, on a page that a fill of 100 % leaves full; 85 % keeps room for a
-- claim's new version. Settlement changes the state (in two partial
-- indexes' predicates) and is never HOT. Applies to pages written from now.
ALTER TABLE commands SET (fillfactor = 85);

-- +goose Down
ALTER TABLE commands RESET (fillfactor);
