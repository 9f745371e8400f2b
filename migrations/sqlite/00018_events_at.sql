-- +goose Up
-- Retention prunes expired events from the head of the table by seq
-- (models.pruneEventsSQL): events are appended as they happen, so the
-- oldest by seq are the oldest by time. The index on at served only that
-- and cost an index entry per event, three per settled command.
DROP INDEX operation_events_at;

-- +goose Down
CREATE INDEX operation_events_at ON operation_events(at);
