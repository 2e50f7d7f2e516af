-- Per-minute rollups: AggregatingMergeTree tables fed by materialized views, so dashboards read a
-- few pre-aggregated rows per minute instead of scanning events.
--
--  * Distributions are t-digest sketches stored as AggregateFunction(quantileTDigest, Float32):
--    the state does not depend on the quantile level, so a query picks any levels it wants,
--    e.g. quantilesTDigestMerge(0.5, 0.9, 0.99)(entropy_q).
--  * Counts and sums are SimpleAggregateFunction(sum|max|min): plain numbers, merged by sum.
--  * Every rollup table sets non_replicated_deduplication_window: a redelivered batch carries the
--    same insert_deduplication_token, the raw table drops it, and ClickHouse drops the blocks the
--    views derive from it too (the view's block token is derived from the source token), so
--    rollups are not double counted.
--  * Each view is followed by a backfill of the rows already stored (upgrade from 0001). Apply
--    this migration with sinks stopped (sinks apply migrations themselves when they start), or
--    rows inserted while it runs may be counted twice.
--  * Times are in UTC; latencies in seconds; entropies in nats.

-- Token entropy, one row per (minute, model, route, adapter, node).
CREATE TABLE IF NOT EXISTS {db}.entropy_1m
(
    minute DateTime('UTC'),
    model LowCardinality(String),
    route LowCardinality(String),
    adapter LowCardinality(String),
    node_id LowCardinality(String),
    chunks SimpleAggregateFunction(sum, UInt64),
    requests SimpleAggregateFunction(sum, UInt64),
    tokens SimpleAggregateFunction(sum, UInt64),
    entropy_sum SimpleAggregateFunction(sum, Float64),
    max_entropy SimpleAggregateFunction(max, Float32),
    mean_entropy_q AggregateFunction(quantileTDigest, Float32)
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (model, route, adapter, node_id, minute)
TTL minute + INTERVAL 400 DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.entropy_1m_mv TO {db}.entropy_1m AS
SELECT
    toStartOfMinute(emitted_at) AS minute, model, route, adapter, node_id,
    toUInt64(count()) AS chunks,
    toUInt64(countIf(final)) AS requests,
    toUInt64(sum(length(entropies))) AS tokens,
    sum(toFloat64(arraySum(entropies))) AS entropy_sum,
    max(if(empty(entropies), 0, arrayMax(entropies))) AS max_entropy,
    quantileTDigestState(toFloat32(if(empty(entropies), 0, arrayAvg(entropies)))) AS mean_entropy_q
FROM {db}.token_entropy
GROUP BY minute, model, route, adapter, node_id;

INSERT INTO {db}.entropy_1m
SELECT
    toStartOfMinute(emitted_at) AS minute, model, route, adapter, node_id,
    toUInt64(count()), toUInt64(countIf(final)), toUInt64(sum(length(entropies))),
    sum(toFloat64(arraySum(entropies))),
    max(if(empty(entropies), 0, arrayMax(entropies))),
    quantileTDigestState(toFloat32(if(empty(entropies), 0, arrayAvg(entropies))))
FROM {db}.token_entropy FINAL
GROUP BY minute, model, route, adapter, node_id;

-- Request latency from spans that carry it (the root `llm_request` span), per span name/status.
CREATE TABLE IF NOT EXISTS {db}.latency_1m
(
    minute DateTime('UTC'),
    model LowCardinality(String),
    route LowCardinality(String),
    node_id LowCardinality(String),
    name LowCardinality(String),
    spans SimpleAggregateFunction(sum, UInt64),
    errors SimpleAggregateFunction(sum, UInt64),
    output_tokens SimpleAggregateFunction(sum, UInt64),
    ttft_q AggregateFunction(quantileTDigest, Float32),
    tpot_q AggregateFunction(quantileTDigest, Float32),
    e2e_q AggregateFunction(quantileTDigest, Float32),
    e2e_max SimpleAggregateFunction(max, Float32)
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (model, route, name, node_id, minute)
TTL minute + INTERVAL 400 DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.latency_1m_mv TO {db}.latency_1m AS
SELECT
    toStartOfMinute(emitted_at) AS minute, model, route, node_id, name,
    toUInt64(count()) AS spans,
    toUInt64(countIf(status != 'ok')) AS errors,
    toUInt64(sum(ifNull(output_tokens, 0))) AS output_tokens,
    quantileTDigestStateIf(assumeNotNull(ttft_s), ttft_s IS NOT NULL) AS ttft_q,
    quantileTDigestStateIf(assumeNotNull(tpot_s), tpot_s IS NOT NULL) AS tpot_q,
    quantileTDigestStateIf(assumeNotNull(e2e_s), e2e_s IS NOT NULL) AS e2e_q,
    max(ifNull(e2e_s, 0)) AS e2e_max
FROM {db}.spans
GROUP BY minute, model, route, node_id, name;

INSERT INTO {db}.latency_1m
SELECT
    toStartOfMinute(emitted_at) AS minute, model, route, node_id, name,
    toUInt64(count()), toUInt64(countIf(status != 'ok')), toUInt64(sum(ifNull(output_tokens, 0))),
    quantileTDigestStateIf(assumeNotNull(ttft_s), ttft_s IS NOT NULL),
    quantileTDigestStateIf(assumeNotNull(tpot_s), tpot_s IS NOT NULL),
    quantileTDigestStateIf(assumeNotNull(e2e_s), e2e_s IS NOT NULL),
    max(ifNull(e2e_s, 0))
FROM {db}.spans FINAL
GROUP BY minute, model, route, node_id, name;

-- Intent similarity (prompt vs response embedding), per language.
CREATE TABLE IF NOT EXISTS {db}.similarity_1m
(
    minute DateTime('UTC'),
    model LowCardinality(String),
    route LowCardinality(String),
    language LowCardinality(String),
    scores SimpleAggregateFunction(sum, UInt64),
    below_threshold SimpleAggregateFunction(sum, UInt64),
    similarity_sum SimpleAggregateFunction(sum, Float64),
    similarity_q AggregateFunction(quantileTDigest, Float32)
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (model, route, language, minute)
TTL minute + INTERVAL 400 DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.similarity_1m_mv TO {db}.similarity_1m AS
SELECT
    toStartOfMinute(emitted_at) AS minute, model, route, language,
    toUInt64(count()) AS scores,
    toUInt64(countIf(similarity < threshold)) AS below_threshold,
    sum(toFloat64(similarity)) AS similarity_sum,
    quantileTDigestState(similarity) AS similarity_q
FROM {db}.intent_scores
GROUP BY minute, model, route, language;

INSERT INTO {db}.similarity_1m
SELECT
    toStartOfMinute(emitted_at) AS minute, model, route, language,
    toUInt64(count()), toUInt64(countIf(similarity < threshold)), sum(toFloat64(similarity)),
    quantileTDigestState(similarity)
FROM {db}.intent_scores FINAL
GROUP BY minute, model, route, language;

-- Anomalies: every alert, by rule and severity (entropy loops/gibberish, fallback rate, SLO...).
CREATE TABLE IF NOT EXISTS {db}.anomalies_1m
(
    minute DateTime('UTC'),
    rule LowCardinality(String),
    severity LowCardinality(String),
    model LowCardinality(String),
    route LowCardinality(String),
    subject_node LowCardinality(String),
    alerts SimpleAggregateFunction(sum, UInt64),
    max_value SimpleAggregateFunction(max, Float32)
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (rule, model, route, severity, subject_node, minute)
TTL minute + INTERVAL 400 DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.anomalies_1m_mv TO {db}.anomalies_1m AS
SELECT
    toStartOfMinute(emitted_at) AS minute, rule, severity, model, route, subject_node,
    toUInt64(count()) AS alerts, max(value) AS max_value
FROM {db}.alerts
GROUP BY minute, rule, severity, model, route, subject_node;

INSERT INTO {db}.anomalies_1m
SELECT
    toStartOfMinute(emitted_at) AS minute, rule, severity, model, route, subject_node,
    toUInt64(count()), max(value)
FROM {db}.alerts FINAL
GROUP BY minute, rule, severity, model, route, subject_node;

-- Fallbacks, by reason and tier change.
CREATE TABLE IF NOT EXISTS {db}.fallbacks_1m
(
    minute DateTime('UTC'),
    model LowCardinality(String),
    route LowCardinality(String),
    reason LowCardinality(String),
    from_tier LowCardinality(String),
    to_tier LowCardinality(String),
    fallbacks SimpleAggregateFunction(sum, UInt64)
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (model, route, reason, from_tier, to_tier, minute)
TTL minute + INTERVAL 400 DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.fallbacks_1m_mv TO {db}.fallbacks_1m AS
SELECT
    toStartOfMinute(emitted_at) AS minute, model, route, reason, from_tier, to_tier,
    toUInt64(count()) AS fallbacks
FROM {db}.fallbacks
GROUP BY minute, model, route, reason, from_tier, to_tier;

INSERT INTO {db}.fallbacks_1m
SELECT
    toStartOfMinute(emitted_at) AS minute, model, route, reason, from_tier, to_tier, toUInt64(count())
FROM {db}.fallbacks FINAL
GROUP BY minute, model, route, reason, from_tier, to_tier;

-- Bad cases, by adapter (the retraining loop's input rate).
CREATE TABLE IF NOT EXISTS {db}.bad_cases_1m
(
    minute DateTime('UTC'),
    model LowCardinality(String),
    route LowCardinality(String),
    adapter LowCardinality(String),
    bad_cases SimpleAggregateFunction(sum, UInt64),
    confidence_sum SimpleAggregateFunction(sum, Float64)
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (model, route, adapter, minute)
TTL minute + INTERVAL 400 DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.bad_cases_1m_mv TO {db}.bad_cases_1m AS
SELECT
    toStartOfMinute(emitted_at) AS minute, model, route, adapter,
    toUInt64(count()) AS bad_cases, sum(toFloat64(confidence)) AS confidence_sum
FROM {db}.bad_cases
GROUP BY minute, model, route, adapter;

INSERT INTO {db}.bad_cases_1m
SELECT
    toStartOfMinute(emitted_at) AS minute, model, route, adapter,
    toUInt64(count()), sum(toFloat64(confidence))
FROM {db}.bad_cases FINAL
GROUP BY minute, model, route, adapter;

-- Requests (one audit record each): the denominator of every rate, by prompt version and tenant.
CREATE TABLE IF NOT EXISTS {db}.requests_1m
(
    minute DateTime('UTC'),
    model LowCardinality(String),
    route LowCardinality(String),
    adapter LowCardinality(String),
    prompt_template_version LowCardinality(String),
    tenant LowCardinality(String),
    requests SimpleAggregateFunction(sum, UInt64),
    prompt_chars SimpleAggregateFunction(sum, UInt64),
    response_chars SimpleAggregateFunction(sum, UInt64)
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (model, route, prompt_template_version, adapter, tenant, minute)
TTL minute + INTERVAL 400 DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.requests_1m_mv TO {db}.requests_1m AS
SELECT
    toStartOfMinute(emitted_at) AS minute, model, route, adapter, prompt_template_version, tenant,
    toUInt64(count()) AS requests,
    toUInt64(sum(prompt_chars)) AS prompt_chars,
    toUInt64(sum(response_chars)) AS response_chars
FROM {db}.audit_index
GROUP BY minute, model, route, adapter, prompt_template_version, tenant;

INSERT INTO {db}.requests_1m
SELECT
    toStartOfMinute(emitted_at) AS minute, model, route, adapter, prompt_template_version, tenant,
    toUInt64(count()), toUInt64(sum(prompt_chars)), toUInt64(sum(response_chars))
FROM {db}.audit_index FINAL
GROUP BY minute, model, route, adapter, prompt_template_version, tenant;

-- Feedback, by error type and rating value (feedback carries no model: join audit_index on
-- request_id for that). Keeping the rating as a key lets a query pick its own "negative" threshold.
CREATE TABLE IF NOT EXISTS {db}.feedback_1m
(
    minute DateTime('UTC'),
    error_type LowCardinality(String),
    rating Int8,
    feedback SimpleAggregateFunction(sum, UInt64),
    corrections SimpleAggregateFunction(sum, UInt64)
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (error_type, rating, minute)
TTL minute + INTERVAL 400 DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.feedback_1m_mv TO {db}.feedback_1m AS
SELECT
    toStartOfMinute(emitted_at) AS minute, error_type, rating,
    toUInt64(count()) AS feedback,
    toUInt64(countIf(has_correction)) AS corrections
FROM {db}.feedback
GROUP BY minute, error_type, rating;

INSERT INTO {db}.feedback_1m
SELECT
    toStartOfMinute(emitted_at) AS minute, error_type, rating, toUInt64(count()), toUInt64(countIf(has_correction))
FROM {db}.feedback FINAL
GROUP BY minute, error_type, rating
