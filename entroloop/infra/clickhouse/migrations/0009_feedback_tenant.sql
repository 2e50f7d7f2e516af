-- Feedback: which tenant posted the verdict.
--
-- The gateway's feedback API takes the tenant from the API key and puts it in the record
-- (`Feedback.tenant`); the bad-case join takes a correction only from the tenant the answer was
-- served to (another tenant's becomes a dead letter, error_type 'tenant_mismatch'). The column
-- lets an analyst see the same thing: join `audit_index` on request_id and compare tenants. No
-- DEFAULT expression, so the sink supplies it (rows stored before this migration read '').

ALTER TABLE {db}.feedback ADD COLUMN IF NOT EXISTS tenant LowCardinality(String) AFTER has_correction;
