package semcache

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

func newMemory(t *testing.T, o storeOpts) Store {
	s, err := NewMemoryStore(MemoryOptions{MaxEntries: o.maxEntries, Now: o.now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestMemoryConformance(t *testing.T) { testConformance(t, newMemory) }

// TestMemoryBytes: past MaxBytes the least recently used entries of any
// scope go; an answer bigger than the whole store is refused.
func TestMemoryBytes(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	entry := int64(1000 + 4*testDim + entryOverhead)
	s, err := NewMemoryStore(MemoryOptions{MaxBytes: 3 * entry, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	ans := make([]byte, 1000)
	for i, sc := range []Scope{scopeA, scopeB, scopeA} {
		if err := s.Put(ctx, sc, basis(i), ans, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok, _ := s.Nearest(ctx, scopeA, basis(0), 0.99); !ok { // scopeA's first is now recent
		t.Fatal("entry 0 missing")
	}
	if err := s.Put(ctx, scopeB, basis(3), ans, time.Hour); err != nil {
		t.Fatal(err)
	}
	if s.Len() != 3 || s.Bytes() != 3*entry {
		t.Fatalf("%d entries, %d bytes; want 3 and %d", s.Len(), s.Bytes(), 3*entry)
	}
	if _, ok, _ := s.Nearest(ctx, scopeB, basis(1), 0.99); ok {
		t.Fatal("the least recently used entry (scope B's first) survived the byte bound")
	}
	if err := s.Put(ctx, scopeA, basis(4), make([]byte, 3*entry), time.Hour); err == nil {
		t.Fatal("an answer bigger than the store was taken")
	}
}

// TestMemorySweep: Sweep drops expired entries and empty scopes.
func TestMemorySweep(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	s, _ := NewMemoryStore(MemoryOptions{Now: c.Now})
	for i := range 5 {
		s.Put(ctx, Scope{Tenant: fmt.Sprint(i), Model: "m"}, basis(i), []byte("x"), time.Duration(i+1)*time.Second)
	}
	c.Advance(3 * time.Second)
	if n := s.Sweep(); n != 3 || s.Len() != 2 {
		t.Fatalf("swept %d, %d left; want 3 and 2", n, s.Len())
	}
	if len(s.scopes) != 2 {
		t.Fatalf("%d scopes listed, want 2", len(s.scopes))
	}
}

// TestMemoryConcurrent: parallel puts and lookups across scopes (run with
// -race) never return another scope's answer and keep the bounds.
func TestMemoryConcurrent(t *testing.T) {
	ctx := context.Background()
	s, _ := NewMemoryStore(MemoryOptions{MaxEntries: 50})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for i := range 2000 {
				sc := Scope{Tenant: fmt.Sprint("t", r.IntN(4)), Model: "m"}
				v := make([]float32, testDim)
				for j := range v {
					v[j] = float32(r.IntN(3) - 1)
				}
				v[r.IntN(testDim)] = 2
				if r.IntN(2) == 0 {
					if err := s.Put(ctx, sc, v, []byte(sc.Tenant), time.Hour); err != nil {
						errs <- err
						return
					}
					continue
				}
				h, ok, err := s.Nearest(ctx, sc, v, 0.9)
				if err != nil {
					errs <- err
					return
				}
				if ok && string(h.Answer) != sc.Tenant {
					errs <- fmt.Errorf("op %d: scope %s got %s's answer", i, sc.Tenant, h.Answer)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := s.Len(); n > 4*50 {
		t.Fatalf("%d entries, bound 200", n)
	}
}

func BenchmarkMemoryNearest(b *testing.B) {
	ctx := context.Background()
	const dim = 256
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			s, _ := NewMemoryStore(MemoryOptions{MaxEntries: n, MaxBytes: 1 << 30})
			r := rand.New(rand.NewPCG(1, 2))
			vec := func() []float32 {
				v := make([]float32, dim)
				for i := range v {
					v[i] = float32(r.NormFloat64())
				}
				return v
			}
			answer := make([]byte, 512)
			for range n {
				if err := s.Put(ctx, scopeA, vec(), answer, time.Hour); err != nil {
					b.Fatal(err)
				}
			}
			q := vec()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, _, err := s.Nearest(ctx, scopeA, q, 0.95); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
