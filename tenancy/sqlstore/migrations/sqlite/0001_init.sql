-- Keys: the public id and SHA-256 of the secret, never the secret.
-- Times are UTC text with microseconds (2006-01-02T15:04:05.000000Z), fixed
-- width, so they sort as they compare.
CREATE TABLE api_keys (
    id              TEXT PRIMARY KEY,
    name            TEXT NOT NULL,
    secret_hash     BLOB NOT NULL CHECK (length(secret_hash) = 32),
    priority        INTEGER NOT NULL DEFAULT 0,
    rpm             INTEGER NOT NULL DEFAULT 0,
    tpm             INTEGER NOT NULL DEFAULT 0,
    max_concurrency INTEGER NOT NULL DEFAULT 0,
    models          TEXT NOT NULL DEFAULT '[]', -- a JSON array of strings
    expires_at      TEXT,
    disabled        INTEGER NOT NULL DEFAULT 0,
    created_at      TEXT NOT NULL,
    updated_at      TEXT NOT NULL,
    revoked_at      TEXT
) STRICT;

CREATE INDEX api_keys_created ON api_keys (created_at, id);

-- Usage per key x model x hour: sums, never a prompt.
CREATE TABLE usage_hourly (
    key_id           TEXT NOT NULL,
    model            TEXT NOT NULL,
    hour             TEXT NOT NULL,
    requests         INTEGER NOT NULL DEFAULT 0,
    prompt_tokens    INTEGER NOT NULL DEFAULT 0,
    cached_tokens    INTEGER NOT NULL DEFAULT 0,
    output_tokens    INTEGER NOT NULL DEFAULT 0,
    errors           INTEGER NOT NULL DEFAULT 0,
    queue_seconds    REAL NOT NULL DEFAULT 0,
    ttft_seconds     REAL NOT NULL DEFAULT 0,
    duration_seconds REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, model, hour)
) STRICT, WITHOUT ROWID;

CREATE INDEX usage_hourly_hour ON usage_hourly (hour);
