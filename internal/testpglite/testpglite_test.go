package testpglite

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestServer: pgvector works over pgx's default (extended) protocol and
// over simple protocol, the HNSW index is built, a second connection waits
// while one is open and gets through when it closes, pools in a row are
// never turned away, and Stop ends the process.
func TestServer(t *testing.T) {
	s := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		cfg := s.PoolConfig(t)
		cfg.ConnConfig.DefaultQueryExecMode = mode
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		var v string
		if err := pool.QueryRow(ctx, `SELECT extversion FROM pg_extension WHERE extname = 'vector'`).Scan(&v); err != nil {
			t.Fatalf("%v: %v", mode, err)
		}
		t.Logf("%v: pgvector %s", mode, v)
		var d float64
		if err := pool.QueryRow(ctx, `SELECT $1::vector <=> $2::vector`, "[1,0,0]", "[1,1,0]").Scan(&d); err != nil {
			t.Fatalf("%v: %v", mode, err)
		}
		if d < 0.2928 || d > 0.2930 {
			t.Fatalf("%v: cosine distance %v, want 1 - 1/sqrt(2)", mode, d)
		}
		pool.Close()
	}

	cfg := s.PoolConfig(t)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, q := range []string{
		`CREATE TABLE t (id int, embedding vector(3))`,
		`CREATE INDEX ON t USING hnsw (embedding vector_cosine_ops)`,
		`INSERT INTO t VALUES (1, '[1,0,0]'), (2, '[0,1,0]')`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var id int
	if err := pool.QueryRow(ctx, `SELECT id FROM t ORDER BY embedding <=> $1 LIMIT 1`, "[0.1,0.9,0]").Scan(&id); err != nil || id != 2 {
		t.Fatalf("nearest: %d, %v", id, err)
	}
	// The pool holds the one connection: another waits for it.
	held, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	go func() {
		c, err := pgx.Connect(ctx, s.DSN())
		if err == nil {
			err = c.Ping(ctx)
			c.Close(ctx)
		}
		second <- err
	}()
	select {
	case err := <-second:
		t.Fatalf("a second connection got through while the first was open: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	held.Release()
	pool.Close()
	select {
	case err := <-second:
		if err != nil {
			t.Fatalf("the waiting connection: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the waiting connection did not get through within 15s of the first closing")
	}
	// One pool after another, at once: none is turned away.
	for i := range 20 {
		p, err := pgxpool.NewWithConfig(ctx, s.PoolConfig(t))
		if err != nil {
			t.Fatal(err)
		}
		var n int
		var workMem string
		err = p.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n)
		if err == nil {
			// The last connection's setting is not this one's.
			err = p.QueryRow(ctx, `SHOW work_mem`).Scan(&workMem)
		}
		if err == nil {
			_, err = p.Exec(ctx, `SET work_mem = '7MB'`)
		}
		p.Close()
		if err != nil || n != 2 || workMem == "7MB" {
			t.Fatalf("pool %d: %d rows, work_mem %s, %v", i, n, workMem, err)
		}
	}

	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := pgx.Connect(ctx, s.DSN()); err == nil || !strings.Contains(err.Error(), "connect") && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("after Stop: %v", err)
	}
}
