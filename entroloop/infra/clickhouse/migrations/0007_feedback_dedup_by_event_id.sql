-- Feedback: event_id alone is the deduplication key, and the copy stored first is the one kept.
--
-- 0001 sorted feedback by (error_type, toStartOfHour(emitted_at), event_id). A ReplacingMergeTree
-- collapses rows only when the whole sorting key is equal, so a forged feedback that reused a real
-- event id with another error_type (or another hour) stayed a second row, even under FINAL; and
-- without a version column the copy inserted *last* wins a collapse, so a forger could also
-- replace the real verdict. Feedback is the table end users write to (the gateway's feedback API);
-- the other raw tables are sorted by what serving nodes and processors set (model, route, rule,
-- time), not by what a client chooses, and keep their keys.
--
-- Now: ORDER BY event_id (FINAL also merges across the monthly partitions, since the partition
-- key is not part of the sorting key), and the version `first_stored_rank` falls as inserted_at
-- grows, so of two rows with one event id the one stored first is kept. Feedback is a small table
-- (one row per user verdict); time filters still prune by the monthly partition.
--
-- ClickHouse cannot drop columns from a sorting key in place: the table is re-created, its rows
-- copied (inserted_at kept, so the first-stored rule holds for old rows too), and the per-minute
-- rollup view re-attached. The view is dropped first so the copy does not count feedback twice.

DROP VIEW IF EXISTS {db}.feedback_1m_mv;

CREATE TABLE IF NOT EXISTS {db}.feedback_by_event_id
(
    event_id UUID,
    emitted_at DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    node_id LowCardinality(String),
    seq UInt64 CODEC(Delta, ZSTD(1)),
    request_id String,
    trace_id String,
    schema_version UInt8,
    rating Int8,
    user_id String,
    error_type LowCardinality(String),
    has_correction Bool,
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3),
    first_stored_rank UInt64 MATERIALIZED toUInt64(9999999999999) - toUInt64(toUnixTimestamp64Milli(inserted_at))
)
ENGINE = ReplacingMergeTree(first_stored_rank)
PARTITION BY toYYYYMM(emitted_at)
ORDER BY event_id
TTL toDateTime(emitted_at) + INTERVAL 400 DAY
SETTINGS non_replicated_deduplication_window = 10000;

INSERT INTO {db}.feedback_by_event_id
    (event_id, emitted_at, node_id, seq, request_id, trace_id, schema_version, rating, user_id, error_type,
     has_correction, inserted_at)
SELECT event_id, emitted_at, node_id, seq, request_id, trace_id, schema_version, rating, user_id, error_type,
       has_correction, inserted_at
FROM {db}.feedback;

RENAME TABLE {db}.feedback TO {db}.feedback_before_0006, {db}.feedback_by_event_id TO {db}.feedback;

DROP TABLE {db}.feedback_before_0006;

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.feedback_1m_mv TO {db}.feedback_1m AS
SELECT
    toStartOfMinute(emitted_at) AS minute, error_type, rating,
    toUInt64(count()) AS feedback,
    toUInt64(countIf(has_correction)) AS corrections
FROM {db}.feedback
GROUP BY minute, error_type, rating
