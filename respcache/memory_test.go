package respcache

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"
)

func TestMemoryConformance(t *testing.T) {
	runConformance(t, func(t *testing.T, f func(*testing.T, Store, func(time.Duration))) {
		synctest.Test(t, func(t *testing.T) {
			s, err := NewMemoryStore(64<<20, nil)
			if err != nil {
				t.Fatal(err)
			}
			f(t, s, time.Sleep)
		})
	})
}

// sized is an entry of exactly n bytes of Size.
func sized(n int) *Entry {
	return &Entry{Kind: KindJSON, Body: make([]byte, n-entryOverhead)}
}

func TestMemoryLRU(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		evicted := map[string]int{}
		s, _ := NewMemoryStore(3000, func(r string, n int) { evicted[r] += n })
		a, b, c, d := testKey("a"), testKey("b"), testKey("c"), testKey("d")
		mustSet(t, s, a, sized(1000), time.Hour)
		mustSet(t, s, b, sized(1000), time.Hour)
		mustSet(t, s, c, sized(1000), time.Hour)
		if s.Bytes() != 3000 || s.Len() != 3 {
			t.Fatalf("bytes %d len %d", s.Bytes(), s.Len())
		}
		mustGet(t, s, a) // a is now the most recent: b is the least
		mustSet(t, s, d, sized(1000), time.Hour)
		if mustGet(t, s, b) != nil {
			t.Error("the least recently used entry was kept")
		}
		for _, k := range []Key{a, c, d} {
			if mustGet(t, s, k) == nil {
				t.Errorf("%v was evicted", k)
			}
		}
		if evicted[EvictLRU] != 1 || s.Bytes() != 3000 {
			t.Errorf("evicted %v, bytes %d", evicted, s.Bytes())
		}
		// One entry that needs the room of two evicts two.
		mustSet(t, s, b, sized(2000), time.Hour)
		if evicted[EvictLRU] != 3 || s.Len() != 2 || s.Bytes() != 3000 {
			t.Errorf("evicted %v, len %d, bytes %d", evicted, s.Len(), s.Bytes())
		}
		// A replacement frees the old size first.
		mustSet(t, s, b, sized(1000), time.Hour)
		if s.Bytes() != 2000 || evicted[EvictLRU] != 3 {
			t.Errorf("after a smaller replacement: bytes %d, evicted %v", s.Bytes(), evicted)
		}
		if err := s.Set(context.Background(), testKey("huge"), sized(3001), time.Hour); !errors.Is(err, ErrEntryTooLarge) {
			t.Errorf("an entry bigger than the store: %v", err)
		}
	})
}

func TestMemoryTTLEviction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		evicted := map[string]int{}
		s, _ := NewMemoryStore(10000, func(r string, n int) { evicted[r] += n })
		old1, old2, fresh := testKey("old1"), testKey("old2"), testKey("fresh")
		mustSet(t, s, old1, sized(1000), time.Minute)
		mustSet(t, s, old2, sized(1000), time.Minute)
		time.Sleep(time.Minute)
		// Set drops the expired entries at the cold end on its way.
		mustSet(t, s, fresh, sized(1000), time.Minute)
		if s.Len() != 1 || s.Bytes() != 1000 || evicted[EvictTTL] != 2 {
			t.Errorf("len %d, bytes %d, evicted %v", s.Len(), s.Bytes(), evicted)
		}
		// Get drops an expired entry it finds.
		time.Sleep(time.Minute)
		if mustGet(t, s, fresh) != nil || s.Len() != 0 || evicted[EvictTTL] != 3 {
			t.Errorf("len %d, evicted %v", s.Len(), evicted)
		}
		if evicted[EvictLRU] != 0 {
			t.Errorf("evicted %v", evicted)
		}
	})
}

// TestMemoryModel: random Sets and Gets against a reference LRU (a list in
// recency order): the same entries are kept, the bytes never pass the
// bound and always equal the kept entries' sizes.
func TestMemoryModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		limit := int64(rapid.IntRange(1000, 8000).Draw(t, "max"))
		s, _ := NewMemoryStore(limit, nil)
		type item struct {
			key  string
			size int64
		}
		var lru []item // most recent first
		find := func(k string) int { return slices.IndexFunc(lru, func(it item) bool { return it.key == k }) }
		for range rapid.IntRange(1, 100).Draw(t, "ops") {
			name := strconv.Itoa(rapid.IntRange(0, 9).Draw(t, "key"))
			k := testKey(name)
			if rapid.Bool().Draw(t, "set") {
				size := int64(rapid.IntRange(entryOverhead, 2500).Draw(t, "size"))
				err := s.Set(context.Background(), k, sized(int(size)), time.Hour)
				if size > limit {
					if !errors.Is(err, ErrEntryTooLarge) {
						t.Fatalf("too large: %v", err)
					}
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if i := find(name); i >= 0 {
					lru = slices.Delete(lru, i, i+1)
				}
				lru = slices.Insert(lru, 0, item{name, size})
				var used int64
				for i, it := range lru {
					if used+it.size > limit {
						lru = lru[:i]
						break
					}
					used += it.size
				}
			} else {
				e := mustGetR(t, s, k)
				i := find(name)
				if (e != nil) != (i >= 0) {
					t.Fatalf("get %s: store has it %v, model %v", name, e != nil, i >= 0)
				}
				if i >= 0 {
					it := lru[i]
					lru = slices.Insert(slices.Delete(lru, i, i+1), 0, it)
				}
			}
			var used int64
			for _, it := range lru {
				used += it.size
			}
			if s.Bytes() != used || s.Bytes() > limit || s.Len() != len(lru) {
				t.Fatalf("store bytes %d len %d, model %d %d (max %d)", s.Bytes(), s.Len(), used, len(lru), limit)
			}
		}
	})
}

func mustGetR(t *rapid.T, s Store, k Key) *Entry {
	e, err := s.Get(context.Background(), k)
	if err != nil {
		t.Fatal(err)
	}
	return e
}
