package semcache

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgvector store defaults.
const (
	DefaultTable = "inferrail_semantic_cache"
	// DefaultCandidates is how many nearest rows a lookup reads before
	// checking the threshold.
	DefaultCandidates = 4
	// maxPGDim is pgvector's limit for an HNSW index on vector.
	maxPGDim = 2000
	// maxPGAnswer bounds one answer (bytea holds up to 1 GB).
	maxPGAnswer = 64 << 20
	// sweepBatch bounds the expired rows one sweep deletes.
	sweepBatch = 1000
)

// PGOptions configure a PGStore.
type PGOptions struct {
	// Table is the table's name, [a-z_][a-z0-9_]* up to 63 bytes. ""
	// means DefaultTable.
	Table string
	// Dim is the embeddings' dimension: the column is vector(Dim), 1 to
	// 2000 (pgvector's HNSW limit). Required.
	Dim int
	// MaxEntries bounds each scope's rows. 0 means DefaultMaxEntries.
	MaxEntries int
	// Candidates is how many nearest rows a lookup reads (LIMIT). 0 means
	// DefaultCandidates.
	Candidates int
	// Now is the clock expires_at and used_at are written and compared
	// with (nil: time.Now). It is the gateway's clock, not the server's:
	// gateways whose clocks differ by a second disagree on expiry by as
	// much.
	Now func() time.Time
}

// PGStore keeps entries in Postgres with pgvector, for several gateways
// to share: one table (tenant, model, part, embedding vector(Dim), answer
// bytea, stored_at, used_at, expires_at) with an HNSW index on the
// embedding (vector_cosine_ops) and a btree on the scope. A lookup filters
// by the whole scope and live rows and orders by embedding <=> $query with
// a LIMIT; the threshold is then checked here. With pgvector 0.8 or newer
// each connection sets hnsw.iterative_scan = relaxed_order (PGAfterConnect)
// so that a filtered index scan goes on until it finds the scope's rows
// instead of returning the ef_search nearest of every tenant and nothing
// of this one.
type PGStore struct {
	pool       *pgxpool.Pool
	own        bool
	table      string
	dim        int
	maxEntries int
	limit      int
	now        func() time.Time

	q struct{ nearest, same, update, insert, evict, touch, sweep string }

	mu        sync.Mutex
	nextSweep time.Time
}

var _ Store = (*PGStore)(nil)

var tableName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// OpenPG connects to dsn with a pool of at most maxConns connections
// (each set up by PGAfterConnect), creates the schema if it is missing and
// returns a store that closes the pool on Close.
func OpenPG(ctx context.Context, dsn string, maxConns int32, o PGOptions) (*PGStore, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("semcache: postgres dsn: %w", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	cfg.AfterConnect = PGAfterConnect
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("semcache: postgres: %w", err)
	}
	s, err := NewPGStore(ctx, pool, o)
	if err != nil {
		pool.Close()
		return nil, err
	}
	s.own = true
	return s, nil
}

// PGAfterConnect prepares a connection for lookups: it sets
// hnsw.iterative_scan = relaxed_order unless the database's pgvector is
// older than 0.8 (which has no such setting). Before the extension exists
// the setting is a placeholder Postgres applies once pgvector loads.
// Install it as the pool's AfterConnect when passing a pool of your own to
// NewPGStore.
func PGAfterConnect(ctx context.Context, c *pgx.Conn) error {
	var v string
	err := c.QueryRow(ctx, `SELECT extversion FROM pg_extension WHERE extname = 'vector'`).Scan(&v)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return fmt.Errorf("semcache: read the vector extension's version: %w", err)
	case !versionAtLeast(v, 0, 8):
		return nil
	}
	if _, err := c.Exec(ctx, `SET hnsw.iterative_scan = relaxed_order`); err != nil {
		return fmt.Errorf("semcache: set hnsw.iterative_scan: %w", err)
	}
	return nil
}

// versionAtLeast reports whether the version v ("0.8.1") is at least
// major.minor.
func versionAtLeast(v string, major, minor int) bool {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}

// NewPGStore creates the schema in pool's database if it is missing
// (idempotent, safe with several gateways starting at once) and returns a
// store on it. The pool stays the caller's: Close does not close it.
func NewPGStore(ctx context.Context, pool *pgxpool.Pool, o PGOptions) (*PGStore, error) {
	s := &PGStore{pool: pool, table: o.Table, dim: o.Dim, maxEntries: o.MaxEntries, limit: o.Candidates, now: o.Now}
	if s.table == "" {
		s.table = DefaultTable
	}
	if !tableName.MatchString(s.table) {
		return nil, fmt.Errorf("semcache: table %q: want [a-z_][a-z0-9_]*, at most 63 bytes", s.table)
	}
	if s.dim < 1 || s.dim > maxPGDim {
		return nil, fmt.Errorf("semcache: %d dimensions: pgvector's HNSW index takes 1 to %d", s.dim, maxPGDim)
	}
	if s.maxEntries < 0 || s.limit < 0 {
		return nil, fmt.Errorf("semcache: max entries %d and candidates %d must not be negative", s.maxEntries, s.limit)
	}
	if s.maxEntries == 0 {
		s.maxEntries = DefaultMaxEntries
	}
	if s.limit == 0 {
		s.limit = DefaultCandidates
	}
	if s.now == nil {
		s.now = time.Now
	}
	if err := s.migrate(ctx); err != nil {
		return nil, err
	}
	t := s.table
	const scope = `tenant = $1 AND model = $2 AND part = $3`
	s.q.nearest = `SELECT id, answer, stored_at, embedding <=> $4::vector FROM ` + t +
		` WHERE ` + scope + ` AND expires_at > $5 ORDER BY embedding <=> $4::vector LIMIT $6`
	s.q.same = `SELECT id, embedding <=> $4::vector FROM ` + t +
		` WHERE ` + scope + ` AND expires_at > $5 ORDER BY embedding <=> $4::vector LIMIT 1`
	s.q.update = `UPDATE ` + t + ` SET answer = $2, stored_at = $3, used_at = $3, expires_at = $4 WHERE id = $1`
	s.q.insert = `INSERT INTO ` + t + ` (tenant, model, part, embedding, answer, stored_at, used_at, expires_at)
		VALUES ($1, $2, $3, $4::vector, $5, $6, $6, $7)`
	// Keep the scope's maxEntries best rows: live before expired, then
	// the most recently used.
	s.q.evict = `DELETE FROM ` + t + ` WHERE id IN (SELECT id FROM ` + t + ` WHERE ` + scope +
		` ORDER BY (expires_at > $4) DESC, used_at DESC, id DESC OFFSET $5)`
	s.q.touch = `UPDATE ` + t + ` SET used_at = $2 WHERE id = $1`
	s.q.sweep = `DELETE FROM ` + t + ` WHERE id IN (SELECT id FROM ` + t + ` WHERE expires_at <= $1 LIMIT ` + strconv.Itoa(sweepBatch) + `)`
	return s, nil
}

// migrate creates the extension, table and indexes if missing, under an
// advisory lock (CREATE ... IF NOT EXISTS races with itself), and checks
// that an existing table's embedding column has this store's dimension.
func (s *PGStore) migrate(ctx context.Context) error {
	h := fnv.New64a()
	h.Write([]byte("inferrail/semcache/" + s.table))
	lock := int64(h.Sum64())
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("semcache: schema: %w", err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lock); err != nil {
		return fmt.Errorf("semcache: schema lock: %w", err)
	}
	var have bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'vector')`).Scan(&have); err != nil {
		return fmt.Errorf("semcache: schema: %w", err)
	}
	if !have {
		if _, err := tx.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS vector`); err != nil {
			return fmt.Errorf("semcache: the vector extension (pgvector) is not installed in this database and creating it failed (a superuser can run CREATE EXTENSION vector): %w", err)
		}
	}
	t := s.table
	for _, q := range []string{
		`CREATE TABLE IF NOT EXISTS ` + t + ` (
			id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			tenant text NOT NULL,
			model text NOT NULL,
			part text NOT NULL,
			embedding vector(` + strconv.Itoa(s.dim) + `) NOT NULL,
			answer bytea NOT NULL,
			stored_at timestamptz NOT NULL,
			used_at timestamptz NOT NULL,
			expires_at timestamptz NOT NULL)`,
		`CREATE INDEX IF NOT EXISTS ` + t + `_embedding ON ` + t + ` USING hnsw (embedding vector_cosine_ops)`,
		`CREATE INDEX IF NOT EXISTS ` + t + `_scope ON ` + t + ` (tenant, model, part, used_at)`,
		`CREATE INDEX IF NOT EXISTS ` + t + `_expires ON ` + t + ` (expires_at)`,
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			return fmt.Errorf("semcache: schema: %w", err)
		}
	}
	var typ string
	err = tx.QueryRow(ctx, `SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
		WHERE a.attrelid = $1::regclass AND a.attname = 'embedding' AND NOT a.attisdropped`, t).Scan(&typ)
	if err != nil {
		return fmt.Errorf("semcache: schema: read %s.embedding's type: %w", t, err)
	}
	if want := "vector(" + strconv.Itoa(s.dim) + ")"; typ != want {
		return fmt.Errorf("semcache: table %s holds embeddings of type %s, this store's are %s: name another table (postgres.table) or drop that one", t, typ, want)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("semcache: schema: %w", err)
	}
	return nil
}

// Put implements Store.
func (s *PGStore) Put(ctx context.Context, scope Scope, vec []float32, answer []byte, ttl time.Duration) error {
	if err := scope.validate(); err != nil {
		return err
	}
	if err := checkTTL(ttl); err != nil {
		return err
	}
	if len(answer) > maxPGAnswer {
		return fmt.Errorf("%w: %d bytes, the pgvector store takes at most %d", ErrTooLarge, len(answer), maxPGAnswer)
	}
	lit, err := s.literal(vec)
	if err != nil {
		return err
	}
	now := s.now().UTC()
	expires := now.Add(ttl)
	if answer == nil {
		answer = []byte{} // bytea NOT NULL
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var id int64
		var dist float64
		err := tx.QueryRow(ctx, s.q.same, scope.Tenant, scope.Model, scope.Partition, lit, now).Scan(&id, &dist)
		switch {
		case err == nil && 1-dist >= sameVector:
			if _, err := tx.Exec(ctx, s.q.update, id, answer, now, expires); err != nil {
				return fmt.Errorf("replace: %w", err)
			}
		case err == nil || errors.Is(err, pgx.ErrNoRows):
			if _, err := tx.Exec(ctx, s.q.insert, scope.Tenant, scope.Model, scope.Partition, lit, answer, now, expires); err != nil {
				return fmt.Errorf("insert: %w", err)
			}
			if _, err := tx.Exec(ctx, s.q.evict, scope.Tenant, scope.Model, scope.Partition, now, s.maxEntries); err != nil {
				return fmt.Errorf("evict: %w", err)
			}
		default:
			return fmt.Errorf("look up: %w", err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("semcache: put: %w", err)
	}
	if s.sweepDue(now) {
		if _, err := s.Sweep(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (s *PGStore) sweepDue(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Before(s.nextSweep) {
		return false
	}
	s.nextSweep = now.Add(sweepInterval)
	return true
}

// Sweep deletes expired rows of every scope, at most 1000 at a time until
// none is left, and returns how many. Put calls it once a minute.
func (s *PGStore) Sweep(ctx context.Context) (int64, error) {
	now := s.now().UTC()
	var n int64
	for {
		tag, err := s.pool.Exec(ctx, s.q.sweep, now)
		if err != nil {
			return n, fmt.Errorf("semcache: sweep: %w", err)
		}
		n += tag.RowsAffected()
		if tag.RowsAffected() < sweepBatch {
			return n, nil
		}
	}
}

// Nearest implements Store.
func (s *PGStore) Nearest(ctx context.Context, scope Scope, vec []float32, threshold float64) (Match, bool, error) {
	if err := scope.validate(); err != nil {
		return Match{}, false, err
	}
	if err := checkThreshold(threshold); err != nil {
		return Match{}, false, err
	}
	lit, err := s.literal(vec)
	if err != nil {
		return Match{}, false, err
	}
	now := s.now().UTC()
	rows, err := s.pool.Query(ctx, s.q.nearest, scope.Tenant, scope.Model, scope.Partition, lit, now, s.limit)
	if err != nil {
		return Match{}, false, fmt.Errorf("semcache: nearest: %w", err)
	}
	var best Match
	var bestID int64
	found := false
	for rows.Next() {
		var id int64
		var answer []byte
		var stored time.Time
		var dist float64
		if err := rows.Scan(&id, &answer, &stored, &dist); err != nil {
			rows.Close()
			return Match{}, false, fmt.Errorf("semcache: nearest: %w", err)
		}
		// relaxed_order may return rows slightly out of order: keep the
		// most similar.
		if sim := 1 - dist; !found || sim > best.Similarity {
			best, bestID, found = Match{Answer: answer, Similarity: sim, StoredAt: stored}, id, true
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return Match{}, false, fmt.Errorf("semcache: nearest: %w", err)
	}
	if !found || best.Similarity < threshold {
		return Match{}, false, nil
	}
	if _, err := s.pool.Exec(ctx, s.q.touch, bestID, now); err != nil {
		return Match{}, false, fmt.Errorf("semcache: nearest: mark used: %w", err)
	}
	return best, true, nil
}

// Close implements Store: it closes the pool when OpenPG made it.
func (s *PGStore) Close() error {
	if s.own {
		s.pool.Close()
	}
	return nil
}

// literal is vec, normalised, as pgvector's text form "[x,y,...]".
func (s *PGStore) literal(vec []float32) (string, error) {
	if len(vec) != s.dim {
		return "", fmt.Errorf("%w: %d dimensions, the table's are %d", ErrVector, len(vec), s.dim)
	}
	u, err := unit(vec)
	if err != nil {
		return "", err
	}
	b := make([]byte, 0, 12*len(u)+2)
	b = append(b, '[')
	for i, x := range u {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendFloat(b, float64(x), 'g', -1, 32)
	}
	return string(append(b, ']')), nil
}
