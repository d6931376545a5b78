package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inferrail/inferrail/tenancy"
)

// pgConnectTimeout bounds a connection attempt when the DSN sets no
// connect_timeout, so an unreachable server fails Open instead of hanging.
const pgConnectTimeout = 10 * time.Second

// pgMigrationLock is the advisory lock that serializes migrations of
// gateways starting at once against one database ("inferrai" in ASCII).
const pgMigrationLock int64 = 0x696e66657272_6169

type pgStore struct {
	pool      *pgxpool.Pool
	closeOnce sync.Once
}

func openPostgres(ctx context.Context, d tenancy.DSN) (*pgStore, error) {
	cfg, err := pgxpool.ParseConfig(d.URL)
	if err != nil {
		return nil, fmt.Errorf("sqlstore: postgres dsn %s: %w", d, err)
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = pgConnectTimeout
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("sqlstore: postgres at %s (%s): %w", d.Host, d, err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("sqlstore: cannot connect to postgres at %s (%s): %w", d.Host, d, err)
	}
	s := &pgStore{pool: pool}
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("sqlstore: postgres at %s (%s): %w", d.Host, d, err)
	}
	return s, nil
}

func (s *pgStore) migrate(ctx context.Context) error {
	known, err := migrations("postgres")
	if err != nil {
		return err
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer tx.Rollback(ctx)
	// Gateways starting together take turns; the lock ends with the
	// transaction.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, pgMigrationLock); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER PRIMARY KEY,
		name       TEXT NOT NULL,
		applied_at TIMESTAMPTZ NOT NULL
	)`); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	rows, err := tx.Query(ctx, `SELECT version FROM schema_migrations ORDER BY version`)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	todo, err := pending(known, applied)
	if err != nil {
		return err
	}
	if len(todo) == 0 {
		return nil
	}
	now := tenancy.NormalizeTime(time.Now())
	for _, m := range todo {
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return fmt.Errorf("migration %d (%s): %w", m.Version, m.Name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)`, m.Version, m.Name, now); err != nil {
			return fmt.Errorf("migration %d (%s): %w", m.Version, m.Name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

const pgKeyColumns = `id, name, secret_hash, priority, rpm, tpm, max_concurrency, models, expires_at, disabled, created_at, updated_at`

func scanPGKey(row pgx.Row) (tenancy.Key, error) {
	var (
		k       tenancy.Key
		expires *time.Time
		maxConc int64
	)
	if err := row.Scan(&k.ID, &k.Name, &k.SecretHash, &k.Priority, &k.RPM, &k.TPM, &maxConc, &k.Models, &expires,
		&k.Disabled, &k.CreatedAt, &k.UpdatedAt); err != nil {
		return tenancy.Key{}, err
	}
	k.MaxConcurrency = int(maxConc)
	if expires != nil {
		k.ExpiresAt = *expires
	}
	// pgx gives times in the local zone; the stores speak UTC.
	return k.Normalized(), nil
}

func pgModels(m []string) []string {
	if m == nil {
		return []string{}
	}
	return m
}

func pgNullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func (s *pgStore) CreateKey(ctx context.Context, k tenancy.Key) (tenancy.Key, error) {
	k, err := prepareCreate(k, time.Now())
	if err != nil {
		return tenancy.Key{}, fmt.Errorf("postgres store: create key: %w", err)
	}
	tag, err := s.pool.Exec(ctx, `INSERT INTO api_keys (`+pgKeyColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) ON CONFLICT (id) DO NOTHING`,
		k.ID, k.Name, k.SecretHash, k.Priority, k.RPM, k.TPM, int64(k.MaxConcurrency), pgModels(k.Models),
		pgNullTime(k.ExpiresAt), k.Disabled, k.CreatedAt, k.UpdatedAt)
	if err != nil {
		return tenancy.Key{}, fmt.Errorf("postgres store: create key %s: %w", k.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return tenancy.Key{}, fmt.Errorf("postgres store: create key %s: %w", k.ID, tenancy.ErrExists)
	}
	return k, nil
}

func (s *pgStore) GetKey(ctx context.Context, id string) (tenancy.Key, error) {
	k, err := scanPGKey(s.pool.QueryRow(ctx, `SELECT `+pgKeyColumns+` FROM api_keys WHERE id = $1 AND revoked_at IS NULL`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return tenancy.Key{}, fmt.Errorf("postgres store: key %s: %w", id, tenancy.ErrNotFound)
	}
	if err != nil {
		return tenancy.Key{}, fmt.Errorf("postgres store: get key %s: %w", id, err)
	}
	return k, nil
}

func (s *pgStore) ListKeys(ctx context.Context) ([]tenancy.Key, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+pgKeyColumns+` FROM api_keys WHERE revoked_at IS NULL ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("postgres store: list keys: %w", err)
	}
	defer rows.Close()
	var out []tenancy.Key
	for rows.Next() {
		k, err := scanPGKey(rows)
		if err != nil {
			return nil, fmt.Errorf("postgres store: list keys: %w", err)
		}
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("postgres store: list keys: %w", err)
	}
	return out, nil
}

func (s *pgStore) UpdateKey(ctx context.Context, id string, p tenancy.KeyPatch) (tenancy.Key, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return tenancy.Key{}, fmt.Errorf("postgres store: update key %s: %w", id, err)
	}
	defer tx.Rollback(ctx)
	old, err := scanPGKey(tx.QueryRow(ctx, `SELECT `+pgKeyColumns+` FROM api_keys WHERE id = $1 AND revoked_at IS NULL FOR UPDATE`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return tenancy.Key{}, fmt.Errorf("postgres store: update key %s: %w", id, tenancy.ErrNotFound)
	}
	if err != nil {
		return tenancy.Key{}, fmt.Errorf("postgres store: update key %s: %w", id, err)
	}
	if p.Empty() {
		return old, nil
	}
	k, err := preparePatch(old, p, time.Now())
	if err != nil {
		return tenancy.Key{}, fmt.Errorf("postgres store: update key %s: %w", id, err)
	}
	if _, err := tx.Exec(ctx, `UPDATE api_keys SET name = $1, priority = $2, rpm = $3, tpm = $4, max_concurrency = $5,
		models = $6, expires_at = $7, disabled = $8, updated_at = $9 WHERE id = $10`,
		k.Name, k.Priority, k.RPM, k.TPM, int64(k.MaxConcurrency), pgModels(k.Models), pgNullTime(k.ExpiresAt), k.Disabled,
		k.UpdatedAt, id); err != nil {
		return tenancy.Key{}, fmt.Errorf("postgres store: update key %s: %w", id, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return tenancy.Key{}, fmt.Errorf("postgres store: update key %s: %w", id, err)
	}
	return k, nil
}

func (s *pgStore) DeleteKey(ctx context.Context, id string) error {
	now := tenancy.NormalizeTime(time.Now())
	tag, err := s.pool.Exec(ctx, `UPDATE api_keys SET revoked_at = $1, disabled = TRUE, updated_at = GREATEST(updated_at, $1)
		WHERE id = $2 AND revoked_at IS NULL`, now, id)
	if err != nil {
		return fmt.Errorf("postgres store: delete key %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("postgres store: delete key %s: %w", id, tenancy.ErrNotFound)
	}
	return nil
}

const pgUpsertUsage = `INSERT INTO usage_hourly (key_id, model, hour, requests, prompt_tokens, cached_tokens,
	output_tokens, errors, queue_seconds, ttft_seconds, duration_seconds)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT (key_id, model, hour) DO UPDATE SET
	requests = usage_hourly.requests + excluded.requests,
	prompt_tokens = usage_hourly.prompt_tokens + excluded.prompt_tokens,
	cached_tokens = usage_hourly.cached_tokens + excluded.cached_tokens,
	output_tokens = usage_hourly.output_tokens + excluded.output_tokens,
	errors = usage_hourly.errors + excluded.errors,
	queue_seconds = usage_hourly.queue_seconds + excluded.queue_seconds,
	ttft_seconds = usage_hourly.ttft_seconds + excluded.ttft_seconds,
	duration_seconds = usage_hourly.duration_seconds + excluded.duration_seconds`

// AddUsage sends the merged rows in one batch inside one transaction.
// Rows go in one fixed order (MergeUsage's), so two gateways adding to
// the same rows at once wait for each other instead of deadlocking.
func (s *pgStore) AddUsage(ctx context.Context, rows []tenancy.Usage) error {
	merged, err := prepareUsage(rows)
	if err != nil {
		return fmt.Errorf("postgres store: add usage: %w", err)
	}
	if len(merged) == 0 {
		return nil
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		for _, u := range merged {
			b.Queue(pgUpsertUsage, u.KeyID, u.Model, u.Hour, u.Requests, u.PromptTokens, u.CachedTokens,
				u.OutputTokens, u.Errors, u.QueueSeconds, u.TTFTSeconds, u.DurationSeconds)
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return fmt.Errorf("postgres store: add usage: %w", err)
	}
	return nil
}

func (s *pgStore) Usage(ctx context.Context, q tenancy.UsageQuery) ([]tenancy.Usage, error) {
	var where []string
	var args []any
	arg := func(cond string, v any) {
		args = append(args, v)
		where = append(where, cond+" $"+strconv.Itoa(len(args)))
	}
	if !q.Since.IsZero() {
		arg("hour >=", q.SinceHour())
	}
	if !q.Until.IsZero() {
		arg("hour <", q.Until)
	}
	if q.KeyID != "" {
		arg("key_id =", q.KeyID)
	}
	if q.Model != "" {
		arg("model =", q.Model)
	}
	query := `SELECT key_id, model, hour, requests, prompt_tokens, cached_tokens, output_tokens, errors,
		queue_seconds, ttft_seconds, duration_seconds FROM usage_hourly`
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	query += " ORDER BY hour, key_id, model"
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("postgres store: usage: %w", err)
	}
	defer rows.Close()
	var out []tenancy.Usage
	for rows.Next() {
		var u tenancy.Usage
		if err := rows.Scan(&u.KeyID, &u.Model, &u.Hour, &u.Requests, &u.PromptTokens, &u.CachedTokens, &u.OutputTokens,
			&u.Errors, &u.QueueSeconds, &u.TTFTSeconds, &u.DurationSeconds); err != nil {
			return nil, fmt.Errorf("postgres store: usage: %w", err)
		}
		u.Hour = u.Hour.UTC()
		out = append(out, u)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("postgres store: usage: %w", err)
	}
	return out, nil
}

func (s *pgStore) Close() error {
	s.closeOnce.Do(s.pool.Close)
	return nil
}
