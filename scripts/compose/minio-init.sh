#!/bin/sh
# docker-compose one-shot service `minio-init` (minio/mc image): the audit bucket and the limited
# users the entroloop services use instead of MinIO's root credentials. Idempotent: every run
# re-applies the same state.
#
#   1. the bucket, created with Object Lock (only bucket creation can enable it);
#   2. a default retention in COMPLIANCE mode: an object written without its own lock is locked too,
#      and nobody, root included, can delete it or shorten its retention before it ends;
#   3. policy entroloop-audit-writer (sink-audit): s3:PutObject; s3:PutObjectRetention, which MinIO
#      and S3 require for a put that carries x-amz-object-lock-mode / retain-until-date (every audit
#      object does), only for COMPLIANCE locks: MinIO lets s3:PutObjectRetention alone shorten a
#      GOVERNANCE retention, so the writer may neither write GOVERNANCE objects nor shorten one;
#      s3:GetObject and s3:ListBucket (the writer re-reads its chain heads);
#      s3:GetBucketObjectLockConfiguration (it checks that the bucket is locked). No DeleteObject,
#      no BypassGovernanceRetention, no bucket administration
#      (tests/integration/test_minio_least_privilege.py tries each against a real MinIO);
#   4. policy entroloop-audit-reader (trainer, audit tools): s3:GetObject and s3:ListBucket only;
#   5. a user per policy with the credentials from .env.
#
# Environment: MINIO_ENDPOINT (default http://minio:9000), MINIO_ROOT_USER, MINIO_ROOT_PASSWORD,
# AUDIT_BUCKET, AUDIT_RETENTION_DAYS, MINIO_AUDIT_WRITER_USER / _PASSWORD,
# MINIO_AUDIT_READER_USER / _PASSWORD. Secrets are never printed.
set -eu

ENDPOINT="${MINIO_ENDPOINT:-http://minio:9000}"
BUCKET="${AUDIT_BUCKET:?set AUDIT_BUCKET}"
DAYS="${AUDIT_RETENTION_DAYS:-30}"
WRITER="${MINIO_AUDIT_WRITER_USER:?set MINIO_AUDIT_WRITER_USER}"
READER="${MINIO_AUDIT_READER_USER:?set MINIO_AUDIT_READER_USER}"
: "${MINIO_ROOT_USER:?set MINIO_ROOT_USER}" "${MINIO_ROOT_PASSWORD:?set MINIO_ROOT_PASSWORD}"
: "${MINIO_AUDIT_WRITER_PASSWORD:?set MINIO_AUDIT_WRITER_PASSWORD}" "${MINIO_AUDIT_READER_PASSWORD:?set MINIO_AUDIT_READER_PASSWORD}"
# policy files are written with shell builtins only: the minio/mc image has no cat or mkdir to rely on
WORK="${TMPDIR:-/tmp}"

mc alias set root "$ENDPOINT" "$MINIO_ROOT_USER" "$MINIO_ROOT_PASSWORD" >/dev/null
mc mb --ignore-existing --with-lock "root/$BUCKET"
# fails on a bucket that exists without Object Lock: that bucket cannot hold the audit log
mc retention set --default compliance "${DAYS}d" "root/$BUCKET"
mc retention info --default "root/$BUCKET"

printf '%s\n' "{
  \"Version\": \"2012-10-17\",
  \"Statement\": [
    {
      \"Effect\": \"Allow\",
      \"Action\": [\"s3:ListBucket\", \"s3:GetBucketObjectLockConfiguration\"],
      \"Resource\": [\"arn:aws:s3:::$BUCKET\"]
    },
    {
      \"Effect\": \"Allow\",
      \"Action\": [\"s3:PutObject\", \"s3:GetObject\"],
      \"Resource\": [\"arn:aws:s3:::$BUCKET/*\"]
    },
    {
      \"Effect\": \"Allow\",
      \"Action\": [\"s3:PutObjectRetention\"],
      \"Resource\": [\"arn:aws:s3:::$BUCKET/*\"],
      \"Condition\": {\"StringEquals\": {\"s3:object-lock-mode\": [\"COMPLIANCE\"]}}
    }
  ]
}" >"$WORK/entroloop-audit-writer.json"

printf '%s\n' "{
  \"Version\": \"2012-10-17\",
  \"Statement\": [
    {
      \"Effect\": \"Allow\",
      \"Action\": [\"s3:ListBucket\"],
      \"Resource\": [\"arn:aws:s3:::$BUCKET\"]
    },
    {
      \"Effect\": \"Allow\",
      \"Action\": [\"s3:GetObject\"],
      \"Resource\": [\"arn:aws:s3:::$BUCKET/*\"]
    }
  ]
}" >"$WORK/entroloop-audit-reader.json"

mc admin policy create root entroloop-audit-writer "$WORK/entroloop-audit-writer.json"
mc admin policy create root entroloop-audit-reader "$WORK/entroloop-audit-reader.json"
mc admin user add root "$WRITER" "$MINIO_AUDIT_WRITER_PASSWORD" >/dev/null
mc admin user add root "$READER" "$MINIO_AUDIT_READER_PASSWORD" >/dev/null
# attaching an already attached policy is a no-op for mc (XMinioAdminPolicyChangeAlreadyApplied)
mc admin policy attach root entroloop-audit-writer --user "$WRITER"
mc admin policy attach root entroloop-audit-reader --user "$READER"
printf 'minio-init: bucket %s (Object Lock, default COMPLIANCE %sd), users %s (write) and %s (read)\n' \
    "$BUCKET" "$DAYS" "$WRITER" "$READER"
