"""The write-once store (local folder or S3 Object Lock), the audit file format and its reader."""
