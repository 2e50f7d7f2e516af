-- One table per event type. Every table:
--  * ReplacingMergeTree whose sorting key ends in event_id: a redelivered event that slipped past
--    insert deduplication collapses into one row on merge (queries that must be exact use FINAL);
--  * insert deduplication over the last 10k blocks (non-replicated tables need this set
--    explicitly), keyed by tokens derived from (topic, partition, offset range);
--  * ORDER BY leads with what dashboards filter on (model, route), then time;
--  * monthly partitions so TTL drops whole parts; inserted_at measures emit -> queryable lag.

CREATE TABLE IF NOT EXISTS {db}.token_entropy
(
    event_id UUID,
    emitted_at DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    node_id LowCardinality(String),
    seq UInt64 CODEC(Delta, ZSTD(1)),
    request_id String,
    trace_id String,
    schema_version UInt8,
    model LowCardinality(String),
    route LowCardinality(String),
    adapter LowCardinality(String),
    chunk_index UInt32,
    first_token_index UInt32,
    final Bool,
    approximate Bool,
    entropies Array(Float32) CODEC(ZSTD(3)),
    n_tokens UInt32 MATERIALIZED length(entropies),
    mean_entropy Float32 MATERIALIZED if(empty(entropies), 0, arrayAvg(entropies)),
    max_entropy Float32 MATERIALIZED if(empty(entropies), 0, arrayMax(entropies)),
    min_entropy Float32 MATERIALIZED if(empty(entropies), 0, arrayMin(entropies)),
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(emitted_at)
ORDER BY (model, route, toStartOfHour(emitted_at), event_id)
TTL toDateTime(emitted_at) + INTERVAL 90 DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS {db}.spans
(
    event_id UUID,
    emitted_at DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    node_id LowCardinality(String),
    seq UInt64 CODEC(Delta, ZSTD(1)),
    request_id String,
    trace_id String,
    schema_version UInt8,
    span_id String,
    parent_span_id String,
    name LowCardinality(String),
    start_time DateTime64(6, 'UTC'),
    end_time DateTime64(6, 'UTC'),
    model LowCardinality(String),
    route LowCardinality(String),
    status LowCardinality(String),
    queue_s Nullable(Float32),
    prefill_s Nullable(Float32),
    decode_s Nullable(Float32),
    ttft_s Nullable(Float32),
    tpot_s Nullable(Float32),
    e2e_s Nullable(Float32),
    prompt_tokens Nullable(UInt32),
    output_tokens Nullable(UInt32),
    attributes String CODEC(ZSTD(3)),
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(emitted_at)
ORDER BY (model, route, toStartOfHour(emitted_at), event_id)
TTL toDateTime(emitted_at) + INTERVAL 90 DAY
SETTINGS non_replicated_deduplication_window = 10000;

-- Audit metadata only: prompt and response text live in the WORM Parquet log, readable by
-- audit id or user id alone. This table answers "which prompt version / adapter / tenant".
CREATE TABLE IF NOT EXISTS {db}.audit_index
(
    event_id UUID,
    emitted_at DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    node_id LowCardinality(String),
    seq UInt64 CODEC(Delta, ZSTD(1)),
    request_id String,
    trace_id String,
    schema_version UInt8,
    audit_id String,
    model LowCardinality(String),
    route LowCardinality(String),
    adapter LowCardinality(String),
    tenant LowCardinality(String),
    user_id String,
    prompt_template_version LowCardinality(String),
    tokenizer_digest LowCardinality(String),
    engine_version LowCardinality(String),
    language LowCardinality(String),
    sampling String,
    redactions String,
    prompt_chars UInt32,
    response_chars UInt32,
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(emitted_at)
ORDER BY (model, route, toStartOfHour(emitted_at), event_id)
TTL toDateTime(emitted_at) + INTERVAL 400 DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS {db}.feedback
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
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(emitted_at)
ORDER BY (error_type, toStartOfHour(emitted_at), event_id)
TTL toDateTime(emitted_at) + INTERVAL 400 DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS {db}.fallbacks
(
    event_id UUID,
    emitted_at DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    node_id LowCardinality(String),
    seq UInt64 CODEC(Delta, ZSTD(1)),
    request_id String,
    trace_id String,
    schema_version UInt8,
    model LowCardinality(String),
    route LowCardinality(String),
    reason LowCardinality(String),
    from_tier LowCardinality(String),
    to_tier LowCardinality(String),
    source LowCardinality(String),
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(emitted_at)
ORDER BY (model, route, toStartOfHour(emitted_at), event_id)
TTL toDateTime(emitted_at) + INTERVAL 90 DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS {db}.intent_scores
(
    event_id UUID,
    emitted_at DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    node_id LowCardinality(String),
    seq UInt64 CODEC(Delta, ZSTD(1)),
    request_id String,
    trace_id String,
    schema_version UInt8,
    model LowCardinality(String),
    route LowCardinality(String),
    similarity Float32,
    language LowCardinality(String),
    embedder LowCardinality(String),
    threshold Float32,
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(emitted_at)
ORDER BY (model, route, toStartOfHour(emitted_at), event_id)
TTL toDateTime(emitted_at) + INTERVAL 90 DAY
SETTINGS non_replicated_deduplication_window = 10000;

-- Bad cases keep their (already PII-redacted) text: they are the regression suite and the
-- training data of the retraining loop.
CREATE TABLE IF NOT EXISTS {db}.bad_cases
(
    event_id UUID,
    emitted_at DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    node_id LowCardinality(String),
    seq UInt64 CODEC(Delta, ZSTD(1)),
    request_id String,
    trace_id String,
    schema_version UInt8,
    model LowCardinality(String),
    route LowCardinality(String),
    adapter LowCardinality(String),
    audit_id String,
    prompt String CODEC(ZSTD(3)),
    response String CODEC(ZSTD(3)),
    correction String CODEC(ZSTD(3)),
    labels Array(LowCardinality(String)),
    diff String CODEC(ZSTD(3)),
    minimal_span Array(UInt32),
    confidence Float32,
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(emitted_at)
ORDER BY (model, toStartOfHour(emitted_at), event_id)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS {db}.alerts
(
    event_id UUID,
    emitted_at DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    node_id LowCardinality(String),
    seq UInt64 CODEC(Delta, ZSTD(1)),
    request_id String,
    trace_id String,
    schema_version UInt8,
    alert_key String,
    rule LowCardinality(String),
    severity LowCardinality(String),
    model LowCardinality(String),
    route LowCardinality(String),
    subject_node LowCardinality(String),
    token_start Int32,
    token_end Int32,
    value Float32,
    threshold Float32,
    baseline String,
    detail String,
    source_event_id String,
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(emitted_at)
ORDER BY (rule, model, toStartOfHour(emitted_at), event_id)
TTL toDateTime(emitted_at) + INTERVAL 400 DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS {db}.actions
(
    event_id UUID,
    emitted_at DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    node_id LowCardinality(String),
    seq UInt64 CODEC(Delta, ZSTD(1)),
    request_id String,
    trace_id String,
    schema_version UInt8,
    action_id String,
    action LowCardinality(String),
    alert_key String,
    runbook LowCardinality(String),
    runbook_version LowCardinality(String),
    dry_run Bool,
    outcome LowCardinality(String),
    detail String,
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(emitted_at)
ORDER BY (action, toStartOfHour(emitted_at), event_id)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS {db}.retrain_requests
(
    event_id UUID,
    emitted_at DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    node_id LowCardinality(String),
    seq UInt64 CODEC(Delta, ZSTD(1)),
    request_id String,
    trace_id String,
    schema_version UInt8,
    trigger_key String,
    model LowCardinality(String),
    category LowCardinality(String),
    reason String,
    adapter LowCardinality(String),
    window_start DateTime64(3, 'UTC'),
    window_end DateTime64(3, 'UTC'),
    bad_case_count UInt32,
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(emitted_at)
ORDER BY (model, category, event_id)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS {db}.health
(
    event_id UUID,
    emitted_at DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    node_id LowCardinality(String),
    seq UInt64 CODEC(Delta, ZSTD(1)),
    request_id String,
    trace_id String,
    schema_version UInt8,
    component LowCardinality(String),
    metric LowCardinality(String),
    value Float64,
    labels String,
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMMDD(emitted_at)
ORDER BY (component, metric, emitted_at, event_id)
TTL toDateTime(emitted_at) + INTERVAL 14 DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS {db}.dead_letters
(
    event_id UUID,
    emitted_at DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    node_id LowCardinality(String),
    seq UInt64 CODEC(Delta, ZSTD(1)),
    request_id String,
    trace_id String,
    schema_version UInt8,
    source_topic LowCardinality(String),
    source_partition UInt16,
    source_offset UInt64,
    reason String,
    error_type LowCardinality(String),
    payload String CODEC(ZSTD(3)),
    payload_size UInt64,
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(emitted_at)
ORDER BY (source_topic, error_type, event_id)
TTL toDateTime(emitted_at) + INTERVAL 90 DAY
SETTINGS non_replicated_deduplication_window = 10000;
