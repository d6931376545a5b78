package semcache

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// clock is a settable clock for the stores' Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// storeOpts are what a conformance test asks of a new store.
type storeOpts struct {
	dim        int
	maxEntries int
	now        func() time.Time
}

// newStoreFunc makes an empty store for one test.
type newStoreFunc func(t *testing.T, o storeOpts) Store

const testDim = 8

// basis returns the unit vector along axis i.
func basis(i int) []float32 {
	v := make([]float32, testDim)
	v[i] = 1
	return v
}

// at returns a unit vector whose cosine similarity with basis(0) is cos
// (it leans towards axis j).
func at(cos float64, j int) []float32 {
	v := make([]float32, testDim)
	v[0] = float32(cos)
	v[j] = float32(math.Sqrt(1 - cos*cos))
	return v
}

var (
	scopeA = Scope{Tenant: "tenant-a", Model: "m", Partition: "p"}
	scopeB = Scope{Tenant: "tenant-b", Model: "m", Partition: "p"}
)

// testConformance is the behaviour every Store has; the memory and the
// pgvector store both run it.
func testConformance(t *testing.T, newStore newStoreFunc) {
	ctx := context.Background()
	mk := func(t *testing.T, maxEntries int) (Store, *clock) {
		c := newClock()
		return newStore(t, storeOpts{dim: testDim, maxEntries: maxEntries, now: c.Now}), c
	}
	put := func(t *testing.T, s Store, sc Scope, v []float32, answer string, ttl time.Duration) {
		t.Helper()
		if err := s.Put(ctx, sc, v, []byte(answer), ttl); err != nil {
			t.Fatalf("put %q: %v", answer, err)
		}
	}
	// get returns the answer found, "" for a miss.
	get := func(t *testing.T, s Store, sc Scope, v []float32, threshold float64) (string, float64) {
		t.Helper()
		h, ok, err := s.Nearest(ctx, sc, v, threshold)
		if err != nil {
			t.Fatalf("nearest: %v", err)
		}
		if !ok {
			return "", 0
		}
		return string(h.Answer), h.Similarity
	}

	t.Run("HitAndMiss", func(t *testing.T) {
		s, c := mk(t, 0)
		if got, _ := get(t, s, scopeA, basis(0), 0.9); got != "" {
			t.Fatalf("empty store: hit %q", got)
		}
		put(t, s, scopeA, basis(0), "zero", time.Hour)
		c.Advance(time.Second)
		got, sim := get(t, s, scopeA, basis(0), 0.99)
		if got != "zero" || math.Abs(sim-1) > 1e-5 {
			t.Fatalf("same vector: %q at %v, want zero at 1", got, sim)
		}
		// Length does not matter, direction does.
		scaled := basis(0)
		scaled[0] = 7
		if got, _ := get(t, s, scopeA, scaled, 0.99); got != "zero" {
			t.Fatalf("scaled vector: %q", got)
		}
		if got, _ := get(t, s, scopeA, basis(1), 0.5); got != "" {
			t.Fatalf("orthogonal vector: hit %q", got)
		}
	})

	t.Run("Threshold", func(t *testing.T) {
		s, _ := mk(t, 0)
		put(t, s, scopeA, basis(0), "zero", time.Hour)
		q := at(0.9, 1)
		if got, sim := get(t, s, scopeA, q, 0.85); got != "zero" || math.Abs(sim-0.9) > 1e-4 {
			t.Fatalf("at 0.85: %q at %v, want zero at 0.9", got, sim)
		}
		if got, _ := get(t, s, scopeA, q, 0.95); got != "" {
			t.Fatalf("at 0.95: hit %q at similarity 0.9", got)
		}
	})

	t.Run("Best", func(t *testing.T) {
		s, c := mk(t, 0)
		for i, cos := range []float64{0.96, 0.99, 0.97} {
			put(t, s, scopeA, at(cos, i+1), fmt.Sprint(cos), time.Hour)
			c.Advance(time.Second)
		}
		if got, sim := get(t, s, scopeA, basis(0), 0.9); got != "0.99" || math.Abs(sim-0.99) > 1e-4 {
			t.Fatalf("best: %q at %v, want 0.99", got, sim)
		}
	})

	t.Run("Scopes", func(t *testing.T) {
		s, _ := mk(t, 0)
		scopes := []Scope{
			scopeA, scopeB,
			{Tenant: "tenant-a", Model: "m2", Partition: "p"},
			{Tenant: "tenant-a", Model: "m", Partition: "p2"},
			{Tenant: "tenant-a", Model: "m", Partition: ""},
			{Tenant: "Tenant-a", Model: "m", Partition: "p"},
		}
		for i, sc := range scopes[:len(scopes)-1] {
			put(t, s, sc, basis(0), fmt.Sprint("answer-", i), time.Hour)
		}
		for i, sc := range scopes[:len(scopes)-1] {
			if got, _ := get(t, s, sc, basis(0), 0.99); got != fmt.Sprint("answer-", i) {
				t.Fatalf("scope %+v: %q, want answer-%d", sc, got, i)
			}
		}
		// The same vector in five other scopes: still a miss here.
		if got, _ := get(t, s, scopes[len(scopes)-1], basis(0), 0.5); got != "" {
			t.Fatalf("scope %+v: hit %q from another scope", scopes[len(scopes)-1], got)
		}
	})

	t.Run("TTL", func(t *testing.T) {
		s, c := mk(t, 0)
		put(t, s, scopeA, basis(0), "zero", 10*time.Second)
		c.Advance(9 * time.Second)
		if got, _ := get(t, s, scopeA, basis(0), 0.99); got != "zero" {
			t.Fatalf("before expiry: %q", got)
		}
		c.Advance(time.Second)
		if got, _ := get(t, s, scopeA, basis(0), 0.99); got != "" {
			t.Fatalf("at expiry: hit %q", got)
		}
		// An expired entry is not replaced but superseded.
		put(t, s, scopeA, basis(0), "again", time.Hour)
		if got, _ := get(t, s, scopeA, basis(0), 0.99); got != "again" {
			t.Fatalf("after a new put: %q", got)
		}
	})

	t.Run("Replace", func(t *testing.T) {
		s, c := mk(t, 2)
		put(t, s, scopeA, basis(0), "first", time.Hour)
		c.Advance(time.Second)
		put(t, s, scopeA, basis(0), "second", time.Hour)
		c.Advance(time.Second)
		put(t, s, scopeA, basis(1), "other", time.Hour)
		// Two entries, not three: both still there.
		if got, _ := get(t, s, scopeA, basis(0), 0.99); got != "second" {
			t.Fatalf("replaced: %q, want second", got)
		}
		if got, _ := get(t, s, scopeA, basis(1), 0.99); got != "other" {
			t.Fatalf("other: %q", got)
		}
	})

	t.Run("LRU", func(t *testing.T) {
		s, c := mk(t, 3)
		for i := range 3 {
			put(t, s, scopeA, basis(i), fmt.Sprint(i), time.Hour)
			c.Advance(time.Second)
		}
		put(t, s, scopeB, basis(5), "b", time.Hour) // another scope's bound is its own
		c.Advance(time.Second)
		if got, _ := get(t, s, scopeA, basis(0), 0.99); got != "0" { // 0 is now the most recently used
			t.Fatalf("0: %q", got)
		}
		c.Advance(time.Second)
		put(t, s, scopeA, basis(3), "3", time.Hour)
		want := map[int]string{0: "0", 1: "", 2: "2", 3: "3"}
		for i, w := range want {
			if got, _ := get(t, s, scopeA, basis(i), 0.99); got != w {
				t.Fatalf("after eviction, entry %d: %q, want %q", i, got, w)
			}
		}
		if got, _ := get(t, s, scopeB, basis(5), 0.99); got != "b" {
			t.Fatalf("the other scope lost its entry: %q", got)
		}
	})

	t.Run("ExpiredEvictedFirst", func(t *testing.T) {
		s, c := mk(t, 2)
		put(t, s, scopeA, basis(0), "old-live", time.Hour)
		c.Advance(time.Second)
		put(t, s, scopeA, basis(1), "new-expiring", 5*time.Second)
		c.Advance(10 * time.Second)
		put(t, s, scopeA, basis(2), "newest", time.Hour)
		if got, _ := get(t, s, scopeA, basis(0), 0.99); got != "old-live" {
			t.Fatalf("the live entry was evicted before the expired one: %q", got)
		}
		if got, _ := get(t, s, scopeA, basis(2), 0.99); got != "newest" {
			t.Fatalf("newest: %q", got)
		}
	})

	t.Run("Copies", func(t *testing.T) {
		s, _ := mk(t, 0)
		ans := []byte("answer")
		v := basis(0)
		if err := s.Put(ctx, scopeA, v, ans, time.Hour); err != nil {
			t.Fatal(err)
		}
		ans[0], v[0], v[1] = 'X', 0, 1
		h, ok, err := s.Nearest(ctx, scopeA, basis(0), 0.99)
		if err != nil || !ok || string(h.Answer) != "answer" {
			t.Fatalf("after changing Put's arguments: %q %v %v", h.Answer, ok, err)
		}
		h.Answer[0] = 'Y'
		if got, _ := get(t, s, scopeA, basis(0), 0.99); got != "answer" {
			t.Fatalf("after changing a hit's answer: %q", got)
		}
	})

	t.Run("BadInput", func(t *testing.T) {
		s, _ := mk(t, 0)
		put(t, s, scopeA, basis(0), "zero", time.Hour)
		nan := basis(0)
		nan[3] = float32(math.NaN())
		inf := basis(0)
		inf[2] = float32(math.Inf(1))
		for _, tc := range []struct {
			name  string
			scope Scope
			vec   []float32
			want  error
		}{
			{"no tenant", Scope{Model: "m"}, basis(0), ErrScope},
			{"no model", Scope{Tenant: "a"}, basis(0), ErrScope},
			{"NUL in tenant", Scope{Tenant: "a\x00b", Model: "m"}, basis(0), ErrScope},
			{"invalid UTF-8", Scope{Tenant: "a\xff", Model: "m"}, basis(0), ErrScope},
			{"long partition", Scope{Tenant: "a", Model: "m", Partition: strings.Repeat("x", 2000)}, basis(0), ErrScope},
			{"zero vector", scopeA, make([]float32, testDim), ErrVector},
			{"NaN", scopeA, nan, ErrVector},
			{"Inf", scopeA, inf, ErrVector},
			{"other dimension", scopeA, []float32{1, 0, 0}, ErrVector},
			{"empty vector", scopeA, nil, ErrVector},
		} {
			if err := s.Put(ctx, tc.scope, tc.vec, []byte("x"), time.Hour); !errors.Is(err, tc.want) {
				t.Errorf("put, %s: %v, want %v", tc.name, err, tc.want)
			}
			if _, _, err := s.Nearest(ctx, tc.scope, tc.vec, 0.9); !errors.Is(err, tc.want) {
				t.Errorf("nearest, %s: %v, want %v", tc.name, err, tc.want)
			}
		}
		for _, th := range []float64{0, -0.5, 1.01, math.NaN()} {
			if _, _, err := s.Nearest(ctx, scopeA, basis(0), th); err == nil {
				t.Errorf("threshold %v accepted", th)
			}
		}
		for _, ttl := range []time.Duration{0, -time.Second} {
			if err := s.Put(ctx, scopeA, basis(0), []byte("x"), ttl); err == nil {
				t.Errorf("ttl %v accepted", ttl)
			}
		}
	})

	t.Run("NoCrossScopeHit", func(t *testing.T) {
		s, _ := mk(t, 0)
		run := 0
		rapid.Check(t, func(rt *rapid.T) { checkScopes(rt, s, &run) })
	})
}

// checkScopes drives random puts and lookups over random tenants, models
// and vectors, against a reference: every hit must come from the query's
// own scope, be the reference's best entry of that scope, and happen
// exactly when the reference's best similarity reaches the threshold.
func checkScopes(t *rapid.T, s Store, run *int) {
	ctx := context.Background()
	*run++
	// Each run has scopes of its own, so that one store serves every run.
	prefix := fmt.Sprintf("run%d/", *run)
	tenants := []string{"a", "b", "A", "a ", "ab", "é", "tenant-with-a-long-name"}
	models := []string{"m", "m2"}
	type ref struct {
		scope  Scope
		vec    []float32
		answer string
	}
	var entries []ref
	genVec := func(label string) []float32 {
		v := make([]float32, testDim)
		for {
			for i := range v {
				v[i] = float32(rapid.IntRange(-2, 2).Draw(t, label))
			}
			if u, err := unit(v); err == nil {
				return u
			}
		}
	}
	scopeOf := func() Scope {
		return Scope{
			Tenant:    prefix + rapid.SampledFrom(tenants).Draw(t, "tenant"),
			Model:     rapid.SampledFrom(models).Draw(t, "model"),
			Partition: rapid.SampledFrom([]string{"", "p"}).Draw(t, "partition"),
		}
	}
	ops := rapid.IntRange(1, 40).Draw(t, "ops")
	for i := range ops {
		sc := scopeOf()
		if rapid.Bool().Draw(t, "put") {
			v := genVec("v")
			answer := fmt.Sprintf("%s|%s|%s|%d", sc.Tenant, sc.Model, sc.Partition, i)
			if err := s.Put(ctx, sc, v, []byte(answer), time.Hour); err != nil {
				t.Fatalf("put: %v", err)
			}
			replaced := false
			for j := range entries {
				if entries[j].scope == sc && float64(dot(entries[j].vec, v)) >= sameVector {
					entries[j].answer, replaced = answer, true
				}
			}
			if !replaced {
				entries = append(entries, ref{sc, v, answer})
			}
			continue
		}
		q := genVec("q")
		th := rapid.SampledFrom([]float64{0.5, 0.8, 0.9, 0.95, 1}).Draw(t, "threshold")
		h, ok, err := s.Nearest(ctx, sc, q, th)
		if err != nil {
			t.Fatalf("nearest: %v", err)
		}
		best, bestSim := "", -2.0
		for _, e := range entries {
			if e.scope == sc {
				if d := float64(dot(e.vec, q)); d > bestSim {
					best, bestSim = e.answer, d
				}
			}
		}
		if ok {
			parts := strings.SplitN(string(h.Answer), "|", 4)
			if len(parts) != 4 || parts[0] != sc.Tenant || parts[1] != sc.Model || parts[2] != sc.Partition {
				t.Fatalf("CROSS-SCOPE HIT: scope %+v got %q", sc, h.Answer)
			}
			if math.Abs(h.Similarity-bestSim) > 1e-4 {
				t.Fatalf("scope %+v: similarity %v, reference best %v (%q, got %q)", sc, h.Similarity, bestSim, best, h.Answer)
			}
		}
		if math.Abs(bestSim-th) < 1e-4 {
			continue // too close to the threshold to call
		}
		if want := bestSim >= th; ok != want {
			t.Fatalf("scope %+v threshold %v: hit %v, reference best %v (%q)", sc, th, ok, bestSim, best)
		}
	}
}
