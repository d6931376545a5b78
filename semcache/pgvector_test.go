package semcache

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inferrail/inferrail/internal/testpglite"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pglitePool starts one PGlite server and one pool on it (one connection:
// PGlite is single-user) for a whole test; each store it makes gets a
// table of its own.
func pglitePool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	srv := testpglite.Start(t)
	cfg := srv.PoolConfig(t)
	cfg.AfterConnect = PGAfterConnect
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("ping: %v\n%s", err, srv.Stderr())
	}
	t.Cleanup(pool.Close)
	return pool
}

func pgStoreFunc(pool *pgxpool.Pool) newStoreFunc {
	var n atomic.Int64
	return func(t *testing.T, o storeOpts) Store {
		s, err := NewPGStore(context.Background(), pool, PGOptions{
			Table: fmt.Sprintf("semcache_t%d", n.Add(1)), Dim: o.dim, MaxEntries: o.maxEntries, Now: o.now,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
}

// TestPGStore runs the conformance suite against real pgvector (PGlite),
// then what only the pgvector store has: the schema, and a filtered HNSW
// scan that must still find a scope's rows among many closer rows of other
// tenants.
func TestPGStore(t *testing.T) {
	pool := pglitePool(t)
	newStore := pgStoreFunc(pool)
	t.Run("Conformance", func(t *testing.T) { testConformance(t, newStore) })
	t.Run("Pairs", func(t *testing.T) { testPairs(t, newStore(t, storeOpts{dim: 256, now: time.Now})) })

	ctx := context.Background()
	t.Run("Schema", func(t *testing.T) {
		for range 2 { // idempotent
			if _, err := NewPGStore(ctx, pool, PGOptions{Table: "semcache_schema", Dim: 16}); err != nil {
				t.Fatal(err)
			}
		}
		_, err := NewPGStore(ctx, pool, PGOptions{Table: "semcache_schema", Dim: 32})
		if err == nil || !strings.Contains(err.Error(), "vector(16)") || !strings.Contains(err.Error(), "semcache_schema") {
			t.Fatalf("another dimension on an existing table: %v", err)
		}
		for _, o := range []PGOptions{{Table: "Bad-Name", Dim: 8}, {Table: "x; DROP TABLE y", Dim: 8}, {Dim: 0}, {Dim: 2001}} {
			if _, err := NewPGStore(ctx, pool, o); err == nil {
				t.Errorf("%+v accepted", o)
			}
		}
		var idx string
		err = pool.QueryRow(ctx, `SELECT indexdef FROM pg_indexes WHERE tablename = 'semcache_schema' AND indexdef LIKE '%hnsw%'`).Scan(&idx)
		if err != nil || !strings.Contains(idx, "vector_cosine_ops") {
			t.Fatalf("hnsw index: %q %v", idx, err)
		}
	})

	t.Run("Sweep", func(t *testing.T) {
		c := newClock()
		s, err := NewPGStore(ctx, pool, PGOptions{Table: "semcache_sweep", Dim: testDim, Now: c.Now})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 5 {
			if err := s.Put(ctx, Scope{Tenant: fmt.Sprint(i), Model: "m"}, basis(i), []byte("x"), time.Duration(i+1)*time.Second); err != nil {
				t.Fatal(err)
			}
		}
		c.Advance(3 * time.Second)
		n, err := s.Sweep(ctx)
		var left int
		pool.QueryRow(ctx, `SELECT count(*) FROM semcache_sweep`).Scan(&left)
		if err != nil || n != 3 || left != 2 {
			t.Fatalf("swept %d (%v), %d rows left; want 3 and 2", n, err, left)
		}
	})

	// With the index forced, HNSW's first ef_search (40) candidates are
	// all tenant B's: without the iterative scan tenant A's row, further
	// away but above the threshold, would be a miss.
	t.Run("FilteredIndexScan", func(t *testing.T) {
		const dim = 16
		s, err := NewPGStore(ctx, pool, PGOptions{Table: "semcache_filtered", Dim: dim, MaxEntries: 1000})
		if err != nil {
			t.Fatal(err)
		}
		near := func(cos float64, j int) []float32 {
			v := make([]float32, dim)
			v[0] = float32(cos)
			v[1+j%(dim-1)] = float32(math.Sqrt(1 - cos*cos))
			return v
		}
		for i := range 300 {
			if err := s.Put(ctx, scopeB, near(0.999-float64(i)*1e-5, i), []byte("b"), time.Hour); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Put(ctx, scopeA, near(0.96, 3), []byte("a"), time.Hour); err != nil {
			t.Fatal(err)
		}
		// No seq scan, no sort: the planner must read the HNSW index.
		for _, q := range []string{`SET enable_seqscan = off`, `SET enable_sort = off`} {
			if _, err := pool.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		defer func() {
			pool.Exec(ctx, `RESET enable_seqscan`)
			pool.Exec(ctx, `RESET enable_sort`)
		}()
		var plan strings.Builder
		rows, err := pool.Query(ctx, `EXPLAIN `+s.q.nearest, scopeA.Tenant, scopeA.Model, scopeA.Partition, mustLiteral(t, s, near(1, 0)), time.Now(), 4)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var line string
			rows.Scan(&line)
			plan.WriteString(line + "\n")
		}
		rows.Close()
		if !strings.Contains(plan.String(), "semcache_filtered_embedding") {
			t.Fatalf("the lookup does not use the HNSW index:\n%s", plan.String())
		}
		h, ok, err := s.Nearest(ctx, scopeA, near(1, 0), 0.95)
		if err != nil || !ok || string(h.Answer) != "a" {
			t.Fatalf("tenant A's row among 300 closer rows of tenant B: %q %v %v\n%s", h.Answer, ok, err, plan.String())
		}
		// What the iterative scan buys: without it, a miss.
		if _, err := pool.Exec(ctx, `SET hnsw.iterative_scan = off`); err != nil {
			t.Fatal(err)
		}
		defer pool.Exec(ctx, `SET hnsw.iterative_scan = relaxed_order`)
		if _, ok, err := s.Nearest(ctx, scopeA, near(1, 0), 0.95); err != nil || ok {
			t.Fatalf("without hnsw.iterative_scan: hit %v, %v; want a miss, or this test no longer shows what the setting does", ok, err)
		}
	})
}

func mustLiteral(t *testing.T, s *PGStore, v []float32) string {
	lit, err := s.literal(v)
	if err != nil {
		t.Fatal(err)
	}
	return lit
}
