-- Audits in parts, and how an answer ended.
--
-- The gateway publishes an audit too large for one record as `part_count` records sharing one
-- audit_id (each with the next slice of prompt and response, `part_index` 0..part_count-1), and
-- `outcome` says why an answer is incomplete ("upstream_error", "client_disconnected"; "ok").
-- The columns have no DEFAULT expression so the sink supplies them (rows written before this
-- migration read outcome '' and part_count 0: whole audits).
--
-- requests_1m is the denominator of every rate: it counts a request once, at its first part,
-- while prompt and response characters add up over every part. The view is re-created (ClickHouse
-- cannot alter a view's query); migrations run before the sinks start, so no insert is missed.

ALTER TABLE {db}.audit_index ADD COLUMN IF NOT EXISTS outcome LowCardinality(String) AFTER response_chars;
ALTER TABLE {db}.audit_index ADD COLUMN IF NOT EXISTS part_index UInt16 AFTER outcome;
ALTER TABLE {db}.audit_index ADD COLUMN IF NOT EXISTS part_count UInt16 AFTER part_index;

DROP VIEW IF EXISTS {db}.requests_1m_mv;

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.requests_1m_mv TO {db}.requests_1m AS
SELECT
    toStartOfMinute(emitted_at) AS minute, model, route, adapter, prompt_template_version, tenant,
    toUInt64(countIf(part_index = 0)) AS requests,
    toUInt64(sum(prompt_chars)) AS prompt_chars,
    toUInt64(sum(response_chars)) AS response_chars
FROM {db}.audit_index
GROUP BY minute, model, route, adapter, prompt_template_version, tenant;
