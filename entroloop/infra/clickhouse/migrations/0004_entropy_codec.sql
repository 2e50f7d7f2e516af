-- Token entropies compressed with ZSTD(1) instead of ZSTD(3).
--
-- The entropies column is most of what a sink writes (~200 Float32 values, ~800 bytes a row), and
-- compressing it at level 3 was the largest single cost of an insert: measured on one sink
-- process (CPU time of the whole insert, chDB, 50k-row batches) level 1 inserts about twice as many
-- rows per second for about 10% more bytes on disk (the values are float16 widened to Float32,
-- so ZSTD finds the zero low mantissa bits at either level). Merges recompress old parts with the
-- new codec as they go; nothing is rewritten by this migration itself.
ALTER TABLE {db}.token_entropy MODIFY COLUMN entropies Array(Float32) CODEC(ZSTD(1))
