-- The adapter registry's index (training/registry.py). The adapter files and the manifest live in
-- the write-once object store; these tables only index them, so nothing here is the source of truth
-- for bytes, and nothing is updated in place:
--  * adapters: one row per registered adapter (ReplacingMergeTree by adapter_id, so a retried
--    registration collapses into the same row; the row's content is identical by construction);
--  * adapter_status: append-only history of each adapter's state (candidate, loaded, canary,
--    promoted, rolled_back, unloaded); the current state is argMax(status, at).

CREATE TABLE IF NOT EXISTS {db}.adapters
(
    adapter_id String,
    registered_at DateTime64(3, 'UTC'),
    model LowCardinality(String),
    trigger_key String,
    parent_adapter String,
    base_model_digest String,
    dataset_digest String,
    manifest_key String,
    manifest_sha256 String,
    files UInt32,
    total_bytes UInt64,
    metrics String CODEC(ZSTD(3)),
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
ORDER BY adapter_id;

CREATE TABLE IF NOT EXISTS {db}.adapter_status
(
    adapter_id String,
    at DateTime64(6, 'UTC'),
    status LowCardinality(String),
    share Float32,
    action_id String,
    detail String CODEC(ZSTD(3))
)
ENGINE = MergeTree
ORDER BY (adapter_id, at);
