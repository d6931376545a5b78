-- Keys: the public id and SHA-256 of the secret, never the secret.
-- Text columns that are sorted on use COLLATE "C" (bytewise), the order
-- the SQLite store and Go use.
CREATE TABLE api_keys (
    id              TEXT COLLATE "C" PRIMARY KEY,
    name            TEXT NOT NULL,
    secret_hash     BYTEA NOT NULL CHECK (length(secret_hash) = 32),
    priority        INTEGER NOT NULL DEFAULT 0,
    rpm             BIGINT NOT NULL DEFAULT 0,
    tpm             BIGINT NOT NULL DEFAULT 0,
    max_concurrency BIGINT NOT NULL DEFAULT 0,
    models          TEXT[] NOT NULL DEFAULT '{}',
    expires_at      TIMESTAMPTZ,
    disabled        BOOLEAN NOT NULL DEFAULT FALSE,
    created_at      TIMESTAMPTZ NOT NULL,
    updated_at      TIMESTAMPTZ NOT NULL,
    revoked_at      TIMESTAMPTZ
);

CREATE INDEX api_keys_created ON api_keys (created_at, id);

-- Usage per key x model x hour: sums, never a prompt.
CREATE TABLE usage_hourly (
    key_id           TEXT COLLATE "C" NOT NULL,
    model            TEXT COLLATE "C" NOT NULL,
    hour             TIMESTAMPTZ NOT NULL,
    requests         BIGINT NOT NULL DEFAULT 0,
    prompt_tokens    BIGINT NOT NULL DEFAULT 0,
    cached_tokens    BIGINT NOT NULL DEFAULT 0,
    output_tokens    BIGINT NOT NULL DEFAULT 0,
    errors           BIGINT NOT NULL DEFAULT 0,
    queue_seconds    DOUBLE PRECISION NOT NULL DEFAULT 0,
    ttft_seconds     DOUBLE PRECISION NOT NULL DEFAULT 0,
    duration_seconds DOUBLE PRECISION NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, model, hour)
);

CREATE INDEX usage_hourly_hour ON usage_hourly (hour);
