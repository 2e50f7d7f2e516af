-- Dead letters keep a SHA-256 of the bytes that could not become a record, not the bytes: the raw
-- payload (which may hold prompts, answers and corrections in clear) goes to the write-once
-- quarantine (entroloop/infra/quarantine.py), read by dead-letter id only with
-- `entroloop audit quarantine ID`. `payload` stays for compatibility and is written empty.
ALTER TABLE {db}.dead_letters ADD COLUMN IF NOT EXISTS payload_sha256 String AFTER payload_size;
