-- Signed checkpoints of the write-once audit log (entroloop/infra/worm/checkpoints.py): one row per
-- checkpoint, kept here as an anchor outside the log's own folder or bucket. `document` is the signed
-- JSON verbatim (payload + Ed25519 signature); the other columns only index it, and verify trusts
-- nothing but what the signature covers. ReplacingMergeTree: a retried insert of the same checkpoint
-- (same log, writer, number) collapses into one row; rows are never updated.
CREATE TABLE IF NOT EXISTS {db}.audit_checkpoints
(
    log String,
    created_at DateTime64(6, 'UTC'),
    writer String,
    number UInt64,
    batches UInt64,
    key_fingerprint LowCardinality(String),
    document String CODEC(ZSTD(3)),
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
ORDER BY (log, writer, number);
