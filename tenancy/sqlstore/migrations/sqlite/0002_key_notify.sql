-- Postgres announces key changes to the gateways sharing it (NOTIFY); a
-- SQLite store has one gateway, whose admin API invalidates its own cache.
-- Nothing to change: the version keeps both dialects in step.
SELECT 1;
