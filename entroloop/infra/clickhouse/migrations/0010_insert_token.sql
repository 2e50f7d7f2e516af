-- Which insert stored each row, and an index to find the rows stored lately.
--
-- `insert_token` is the insert's deduplication token (`topic/partition/first-last` offsets, or a
-- piece of it after a poison bisection), filled by ClickHouse from the insert's own setting: the
-- sink supplies nothing, and no client can write another value. A starting sink reads the ids and
-- tokens stored in the last minutes (`ClickHouseSink`, `SEED_WINDOW_S`): an event that arrives
-- again under another batch's token is a copy (a publisher's spool replay) and is not stored twice
-- (the raw table would collapse it on merge, but the per-minute rollups, filled by materialized
-- views on insert, would count it twice); one that arrives again in its own batch (a redelivery
-- after a crash) still goes to ClickHouse, whose token check decides, so an insert torn between the
-- raw table and its rollups is still completed. Rows stored before this migration read '' (unknown:
-- never taken for a copy).
--
-- The tables are sorted by (model, route, hour of emitted_at, event_id) and partitioned by month
-- of emitted_at, so without the min/max index on inserted_at that start-up query would read the
-- column of every part; MATERIALIZE builds it for rows stored before (a background mutation on a
-- server).

ALTER TABLE {db}.token_entropy ADD COLUMN IF NOT EXISTS insert_token String MATERIALIZED getSetting('insert_deduplication_token') CODEC(ZSTD(1));
ALTER TABLE {db}.token_entropy ADD INDEX IF NOT EXISTS inserted_at_minmax inserted_at TYPE minmax GRANULARITY 1;
ALTER TABLE {db}.token_entropy MATERIALIZE INDEX inserted_at_minmax;

ALTER TABLE {db}.spans ADD COLUMN IF NOT EXISTS insert_token String MATERIALIZED getSetting('insert_deduplication_token') CODEC(ZSTD(1));
ALTER TABLE {db}.spans ADD INDEX IF NOT EXISTS inserted_at_minmax inserted_at TYPE minmax GRANULARITY 1;
ALTER TABLE {db}.spans MATERIALIZE INDEX inserted_at_minmax;

ALTER TABLE {db}.audit_index ADD COLUMN IF NOT EXISTS insert_token String MATERIALIZED getSetting('insert_deduplication_token') CODEC(ZSTD(1));
ALTER TABLE {db}.audit_index ADD INDEX IF NOT EXISTS inserted_at_minmax inserted_at TYPE minmax GRANULARITY 1;
ALTER TABLE {db}.audit_index MATERIALIZE INDEX inserted_at_minmax;

ALTER TABLE {db}.feedback ADD COLUMN IF NOT EXISTS insert_token String MATERIALIZED getSetting('insert_deduplication_token') CODEC(ZSTD(1));
ALTER TABLE {db}.feedback ADD INDEX IF NOT EXISTS inserted_at_minmax inserted_at TYPE minmax GRANULARITY 1;
ALTER TABLE {db}.feedback MATERIALIZE INDEX inserted_at_minmax;

ALTER TABLE {db}.fallbacks ADD COLUMN IF NOT EXISTS insert_token String MATERIALIZED getSetting('insert_deduplication_token') CODEC(ZSTD(1));
ALTER TABLE {db}.fallbacks ADD INDEX IF NOT EXISTS inserted_at_minmax inserted_at TYPE minmax GRANULARITY 1;
ALTER TABLE {db}.fallbacks MATERIALIZE INDEX inserted_at_minmax;

ALTER TABLE {db}.intent_scores ADD COLUMN IF NOT EXISTS insert_token String MATERIALIZED getSetting('insert_deduplication_token') CODEC(ZSTD(1));
ALTER TABLE {db}.intent_scores ADD INDEX IF NOT EXISTS inserted_at_minmax inserted_at TYPE minmax GRANULARITY 1;
ALTER TABLE {db}.intent_scores MATERIALIZE INDEX inserted_at_minmax;

ALTER TABLE {db}.bad_cases ADD COLUMN IF NOT EXISTS insert_token String MATERIALIZED getSetting('insert_deduplication_token') CODEC(ZSTD(1));
ALTER TABLE {db}.bad_cases ADD INDEX IF NOT EXISTS inserted_at_minmax inserted_at TYPE minmax GRANULARITY 1;
ALTER TABLE {db}.bad_cases MATERIALIZE INDEX inserted_at_minmax;

ALTER TABLE {db}.alerts ADD COLUMN IF NOT EXISTS insert_token String MATERIALIZED getSetting('insert_deduplication_token') CODEC(ZSTD(1));
ALTER TABLE {db}.alerts ADD INDEX IF NOT EXISTS inserted_at_minmax inserted_at TYPE minmax GRANULARITY 1;
ALTER TABLE {db}.alerts MATERIALIZE INDEX inserted_at_minmax;

ALTER TABLE {db}.actions ADD COLUMN IF NOT EXISTS insert_token String MATERIALIZED getSetting('insert_deduplication_token') CODEC(ZSTD(1));
ALTER TABLE {db}.actions ADD INDEX IF NOT EXISTS inserted_at_minmax inserted_at TYPE minmax GRANULARITY 1;
ALTER TABLE {db}.actions MATERIALIZE INDEX inserted_at_minmax;

ALTER TABLE {db}.retrain_requests ADD COLUMN IF NOT EXISTS insert_token String MATERIALIZED getSetting('insert_deduplication_token') CODEC(ZSTD(1));
ALTER TABLE {db}.retrain_requests ADD INDEX IF NOT EXISTS inserted_at_minmax inserted_at TYPE minmax GRANULARITY 1;
ALTER TABLE {db}.retrain_requests MATERIALIZE INDEX inserted_at_minmax;

ALTER TABLE {db}.health ADD COLUMN IF NOT EXISTS insert_token String MATERIALIZED getSetting('insert_deduplication_token') CODEC(ZSTD(1));
ALTER TABLE {db}.health ADD INDEX IF NOT EXISTS inserted_at_minmax inserted_at TYPE minmax GRANULARITY 1;
ALTER TABLE {db}.health MATERIALIZE INDEX inserted_at_minmax;

ALTER TABLE {db}.dead_letters ADD COLUMN IF NOT EXISTS insert_token String MATERIALIZED getSetting('insert_deduplication_token') CODEC(ZSTD(1));
ALTER TABLE {db}.dead_letters ADD INDEX IF NOT EXISTS inserted_at_minmax inserted_at TYPE minmax GRANULARITY 1;
ALTER TABLE {db}.dead_letters MATERIALIZE INDEX inserted_at_minmax;
