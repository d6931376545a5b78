package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"modernc.org/sqlite" // the "sqlite" database/sql driver, pure Go

	"github.com/inferrail/inferrail/tenancy"
)

// SQLite connection settings: WAL so readers never wait for the writer,
// synchronous=NORMAL (durable across process crashes; a power cut may
// lose the last transactions, which for usage sums is acceptable),
// busy_timeout so another process holding the write lock is waited for,
// not failed on. Writes begin IMMEDIATE (they take the write lock at
// BEGIN, so a read-then-write transaction cannot fail on the upgrade) on
// one connection: SQLite has one writer anyway.
const (
	sqliteBusyTimeout = 5 * time.Second
	sqliteReaders     = 4
	sqliteTimeLayout  = "2006-01-02T15:04:05.000000Z07:00"
)

type sqliteStore struct {
	path string
	w    *sql.DB // the one writer
	r    *sql.DB // readers

	closeOnce sync.Once
	closeErr  error
}

func sqliteConnString(path string, writer bool) string {
	q := fmt.Sprintf("_pragma=busy_timeout(%d)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)", sqliteBusyTimeout.Milliseconds())
	if writer {
		q += "&_txlock=immediate"
	} else {
		q += "&_pragma=query_only(1)"
	}
	return path + "?" + q
}

func openSQLite(ctx context.Context, d tenancy.DSN) (*sqliteStore, error) {
	fail := func(err error) error {
		return fmt.Errorf("sqlstore: open sqlite database %s: %w", d.Path, err)
	}
	dir := filepath.Dir(d.Path)
	if fi, err := os.Stat(dir); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fail(fmt.Errorf("directory %s does not exist: %w", dir, err))
		}
		return nil, fail(err)
	} else if !fi.IsDir() {
		return nil, fail(fmt.Errorf("%s is not a directory", dir))
	}
	if fi, err := os.Stat(d.Path); err == nil && fi.IsDir() {
		return nil, fail(errors.New("it is a directory, want a file"))
	}
	w, err := sql.Open("sqlite", sqliteConnString(d.Path, true))
	if err != nil {
		return nil, fail(err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	s := &sqliteStore{path: d.Path, w: w}
	if err := s.walMode(ctx); err != nil {
		w.Close()
		return nil, fail(err)
	}
	if err := s.migrate(ctx); err != nil {
		w.Close()
		return nil, fail(err)
	}
	r, err := sql.Open("sqlite", sqliteConnString(d.Path, false))
	if err != nil {
		w.Close()
		return nil, fail(err)
	}
	r.SetMaxOpenConns(sqliteReaders)
	r.SetMaxIdleConns(sqliteReaders)
	if err := r.PingContext(ctx); err != nil {
		w.Close()
		r.Close()
		return nil, fail(err)
	}
	s.r = r
	return s, nil
}

// walMode switches the file to WAL (persistent: done once per file, a
// no-op after). A process converting a new file while another does gets
// SQLITE_BUSY at once, without the busy handler, so it is retried here
// for up to the busy timeout.
func (s *sqliteStore) walMode(ctx context.Context) error {
	deadline := time.Now().Add(sqliteBusyTimeout)
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		var mode string
		err := s.w.QueryRowContext(ctx, `PRAGMA journal_mode = WAL`).Scan(&mode)
		switch {
		case err == nil && strings.EqualFold(mode, "wal"):
			return nil
		case err == nil:
			return fmt.Errorf("journal_mode is %q after asking for wal", mode)
		case !isBusy(err) || time.Now().After(deadline):
			return fmt.Errorf("set journal_mode wal: %w", err)
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return fmt.Errorf("set journal_mode wal: %w", ctx.Err())
		}
	}
}

// isBusy reports whether err is SQLITE_BUSY (any extended code).
func isBusy(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == 5
}

func (s *sqliteStore) migrate(ctx context.Context) error {
	known, err := migrations("sqlite")
	if err != nil {
		return err
	}
	tx, err := s.w.BeginTx(ctx, nil) // IMMEDIATE: one process migrates at a time
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER PRIMARY KEY,
		name       TEXT NOT NULL,
		applied_at TEXT NOT NULL
	) STRICT`); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	rows, err := tx.QueryContext(ctx, `SELECT version FROM schema_migrations ORDER BY version`)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	var applied []int
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			rows.Close()
			return fmt.Errorf("migrate: %w", err)
		}
		applied = append(applied, v)
	}
	if err := rows.Close(); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	todo, err := pending(known, applied)
	if err != nil {
		return err
	}
	if len(todo) == 0 {
		return nil
	}
	now := sqliteTime(time.Now())
	for _, m := range todo {
		if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
			return fmt.Errorf("migration %d (%s): %w", m.Version, m.Name, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)`, m.Version, m.Name, now); err != nil {
			return fmt.Errorf("migration %d (%s): %w", m.Version, m.Name, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

func sqliteTime(t time.Time) string { return tenancy.NormalizeTime(t).Format(sqliteTimeLayout) }

func parseSQLiteTime(s string) (time.Time, error) {
	t, err := time.Parse(sqliteTimeLayout, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("bad time %q in the database: %w", s, err)
	}
	return t.UTC(), nil
}

func nullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return sqliteTime(t)
}

const sqliteKeyColumns = `id, name, secret_hash, priority, rpm, tpm, max_concurrency, models, expires_at, disabled, created_at, updated_at`

type scanner interface{ Scan(dest ...any) error }

func scanSQLiteKey(sc scanner) (tenancy.Key, error) {
	var (
		k                  tenancy.Key
		models             string
		expires            sql.NullString
		created, updated   string
		disabled           int64
		maxConc            int64
		secretHash         []byte
		priority, rpm, tpm int64
	)
	if err := sc.Scan(&k.ID, &k.Name, &secretHash, &priority, &rpm, &tpm, &maxConc, &models, &expires, &disabled, &created, &updated); err != nil {
		return tenancy.Key{}, err
	}
	k.SecretHash = secretHash
	k.Priority, k.RPM, k.TPM, k.MaxConcurrency = int(priority), rpm, tpm, int(maxConc)
	k.Disabled = disabled != 0
	if err := json.Unmarshal([]byte(models), &k.Models); err != nil {
		return tenancy.Key{}, fmt.Errorf("bad models %q in the database: %w", models, err)
	}
	if len(k.Models) == 0 {
		k.Models = nil
	}
	var err error
	if expires.Valid {
		if k.ExpiresAt, err = parseSQLiteTime(expires.String); err != nil {
			return tenancy.Key{}, err
		}
	}
	if k.CreatedAt, err = parseSQLiteTime(created); err != nil {
		return tenancy.Key{}, err
	}
	if k.UpdatedAt, err = parseSQLiteTime(updated); err != nil {
		return tenancy.Key{}, err
	}
	return k, nil
}

func modelsJSON(models []string) string {
	if models == nil {
		models = []string{}
	}
	b, _ := json.Marshal(models) // []string always marshals
	return string(b)
}

func (s *sqliteStore) CreateKey(ctx context.Context, k tenancy.Key) (tenancy.Key, error) {
	k, err := prepareCreate(k, time.Now())
	if err != nil {
		return tenancy.Key{}, fmt.Errorf("sqlite store: create key: %w", err)
	}
	res, err := s.w.ExecContext(ctx, `INSERT INTO api_keys (`+sqliteKeyColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING`,
		k.ID, k.Name, k.SecretHash, k.Priority, k.RPM, k.TPM, k.MaxConcurrency, modelsJSON(k.Models),
		nullTime(k.ExpiresAt), k.Disabled, sqliteTime(k.CreatedAt), sqliteTime(k.UpdatedAt))
	if err != nil {
		return tenancy.Key{}, fmt.Errorf("sqlite store: create key %s: %w", k.ID, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return tenancy.Key{}, fmt.Errorf("sqlite store: create key %s: %w", k.ID, err)
	} else if n == 0 {
		return tenancy.Key{}, fmt.Errorf("sqlite store: create key %s: %w", k.ID, tenancy.ErrExists)
	}
	return k, nil
}

func (s *sqliteStore) GetKey(ctx context.Context, id string) (tenancy.Key, error) {
	k, err := scanSQLiteKey(s.r.QueryRowContext(ctx, `SELECT `+sqliteKeyColumns+` FROM api_keys WHERE id = ? AND revoked_at IS NULL`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return tenancy.Key{}, fmt.Errorf("sqlite store: key %s: %w", id, tenancy.ErrNotFound)
	}
	if err != nil {
		return tenancy.Key{}, fmt.Errorf("sqlite store: get key %s: %w", id, err)
	}
	return k, nil
}

func (s *sqliteStore) ListKeys(ctx context.Context) ([]tenancy.Key, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+sqliteKeyColumns+` FROM api_keys WHERE revoked_at IS NULL ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("sqlite store: list keys: %w", err)
	}
	defer rows.Close()
	var out []tenancy.Key
	for rows.Next() {
		k, err := scanSQLiteKey(rows)
		if err != nil {
			return nil, fmt.Errorf("sqlite store: list keys: %w", err)
		}
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite store: list keys: %w", err)
	}
	return out, nil
}

func (s *sqliteStore) UpdateKey(ctx context.Context, id string, p tenancy.KeyPatch) (tenancy.Key, error) {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return tenancy.Key{}, fmt.Errorf("sqlite store: update key %s: %w", id, err)
	}
	defer tx.Rollback()
	old, err := scanSQLiteKey(tx.QueryRowContext(ctx, `SELECT `+sqliteKeyColumns+` FROM api_keys WHERE id = ? AND revoked_at IS NULL`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return tenancy.Key{}, fmt.Errorf("sqlite store: update key %s: %w", id, tenancy.ErrNotFound)
	}
	if err != nil {
		return tenancy.Key{}, fmt.Errorf("sqlite store: update key %s: %w", id, err)
	}
	if p.Empty() {
		return old, nil
	}
	k, err := preparePatch(old, p, time.Now())
	if err != nil {
		return tenancy.Key{}, fmt.Errorf("sqlite store: update key %s: %w", id, err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE api_keys SET name = ?, priority = ?, rpm = ?, tpm = ?, max_concurrency = ?,
		models = ?, expires_at = ?, disabled = ?, updated_at = ? WHERE id = ?`,
		k.Name, k.Priority, k.RPM, k.TPM, k.MaxConcurrency, modelsJSON(k.Models), nullTime(k.ExpiresAt), k.Disabled,
		sqliteTime(k.UpdatedAt), id); err != nil {
		return tenancy.Key{}, fmt.Errorf("sqlite store: update key %s: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return tenancy.Key{}, fmt.Errorf("sqlite store: update key %s: %w", id, err)
	}
	return k, nil
}

func (s *sqliteStore) DeleteKey(ctx context.Context, id string) error {
	now := sqliteTime(time.Now())
	res, err := s.w.ExecContext(ctx, `UPDATE api_keys SET revoked_at = ?, disabled = 1, updated_at = ? WHERE id = ? AND revoked_at IS NULL`, now, now, id)
	if err != nil {
		return fmt.Errorf("sqlite store: delete key %s: %w", id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("sqlite store: delete key %s: %w", id, err)
	}
	if n == 0 {
		return fmt.Errorf("sqlite store: delete key %s: %w", id, tenancy.ErrNotFound)
	}
	return nil
}

const sqliteUpsertUsage = `INSERT INTO usage_hourly (key_id, model, hour, requests, prompt_tokens, cached_tokens,
	output_tokens, errors, queue_seconds, ttft_seconds, duration_seconds)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (key_id, model, hour) DO UPDATE SET
	requests = usage_hourly.requests + excluded.requests,
	prompt_tokens = usage_hourly.prompt_tokens + excluded.prompt_tokens,
	cached_tokens = usage_hourly.cached_tokens + excluded.cached_tokens,
	output_tokens = usage_hourly.output_tokens + excluded.output_tokens,
	errors = usage_hourly.errors + excluded.errors,
	queue_seconds = usage_hourly.queue_seconds + excluded.queue_seconds,
	ttft_seconds = usage_hourly.ttft_seconds + excluded.ttft_seconds,
	duration_seconds = usage_hourly.duration_seconds + excluded.duration_seconds`

func (s *sqliteStore) AddUsage(ctx context.Context, rows []tenancy.Usage) error {
	merged, err := prepareUsage(rows)
	if err != nil {
		return fmt.Errorf("sqlite store: add usage: %w", err)
	}
	if len(merged) == 0 {
		return nil
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlite store: add usage: %w", err)
	}
	defer tx.Rollback()
	stmt, err := tx.PrepareContext(ctx, sqliteUpsertUsage)
	if err != nil {
		return fmt.Errorf("sqlite store: add usage: %w", err)
	}
	defer stmt.Close()
	for _, u := range merged {
		if _, err := stmt.ExecContext(ctx, u.KeyID, u.Model, sqliteTime(u.Hour), u.Requests, u.PromptTokens, u.CachedTokens,
			u.OutputTokens, u.Errors, u.QueueSeconds, u.TTFTSeconds, u.DurationSeconds); err != nil {
			return fmt.Errorf("sqlite store: add usage: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlite store: add usage: %w", err)
	}
	return nil
}

func (s *sqliteStore) Usage(ctx context.Context, q tenancy.UsageQuery) ([]tenancy.Usage, error) {
	var where []string
	var args []any
	if !q.Since.IsZero() {
		where, args = append(where, "hour >= ?"), append(args, sqliteTime(q.SinceHour()))
	}
	if !q.Until.IsZero() {
		where, args = append(where, "hour < ?"), append(args, sqliteTime(q.Until))
	}
	if q.KeyID != "" {
		where, args = append(where, "key_id = ?"), append(args, q.KeyID)
	}
	if q.Model != "" {
		where, args = append(where, "model = ?"), append(args, q.Model)
	}
	query := `SELECT key_id, model, hour, requests, prompt_tokens, cached_tokens, output_tokens, errors,
		queue_seconds, ttft_seconds, duration_seconds FROM usage_hourly`
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	query += " ORDER BY hour, key_id, model"
	rows, err := s.r.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("sqlite store: usage: %w", err)
	}
	defer rows.Close()
	var out []tenancy.Usage
	for rows.Next() {
		var u tenancy.Usage
		var hour string
		if err := rows.Scan(&u.KeyID, &u.Model, &hour, &u.Requests, &u.PromptTokens, &u.CachedTokens, &u.OutputTokens,
			&u.Errors, &u.QueueSeconds, &u.TTFTSeconds, &u.DurationSeconds); err != nil {
			return nil, fmt.Errorf("sqlite store: usage: %w", err)
		}
		if u.Hour, err = parseSQLiteTime(hour); err != nil {
			return nil, fmt.Errorf("sqlite store: usage: %w", err)
		}
		out = append(out, u)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite store: usage: %w", err)
	}
	return out, nil
}

func (s *sqliteStore) Close() error {
	s.closeOnce.Do(func() {
		var errs []error
		if s.r != nil {
			errs = append(errs, s.r.Close())
		}
		// Closing the last connection checkpoints the WAL into the file.
		errs = append(errs, s.w.Close())
		if err := errors.Join(errs...); err != nil {
			s.closeErr = fmt.Errorf("sqlite store: close: %w", err)
		}
	})
	return s.closeErr
}
