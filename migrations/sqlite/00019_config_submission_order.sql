-- +goose Up
-- The submission order (the ledger cursor of the submitted request; a
-- fan-out child carries its parent's) of the configure that set the
-- desired revision. A configure submitted earlier but recorded later — a
-- fleet.configure child held for a slot, or re-run after a restart — must
-- not replace a configuration submitted after it (fleet.ConfigureTx).
-- 0: set before this column existed, older than anything submitted now.
ALTER TABLE node_configs ADD COLUMN submitted_cursor BIGINT NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE node_configs DROP COLUMN submitted_cursor;
