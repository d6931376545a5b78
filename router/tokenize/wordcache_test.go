package tokenize

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/zeebo/xxh3"
	"pgregory.net/rapid"
)

// TestWordCacheModel checks the cache against a plain map under random
// puts, lookups and resets, with hashes drawn from a small set so that
// words collide (same hash, or same probe start) as often as not: a lookup
// returns nothing or exactly the ids last put for that word, a word just put
// is found, nothing is lost while there is room, and a shard holds at most
// its bound.
func TestWordCacheModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		entries := rapid.SampledFrom([]int{1, 32, 64, 200, 4096}).Draw(t, "entries")
		c := newWordCache(entries)
		model := map[string][]uint32{}
		hashes := map[string]uint64{}
		// Few words, so that each is put and looked up again and again:
		// short ones, some at the inline limit, longer ones.
		word := rapid.SampledFrom([]string{"a", "b", " ab", "é🙂", "abba", " é é",
			strings.Repeat("x", inlineWordBytes), strings.Repeat("y", inlineWordBytes),
			strings.Repeat("z", inlineWordBytes+1), strings.Repeat("🙂", 10)})
		hashOf := func(t *rapid.T, w string) uint64 {
			if h, ok := hashes[w]; ok {
				return h
			}
			// Few distinct values: equal hashes for different words, and
			// equal low and high bits (shard and slot) across them.
			h := rapid.SampledFrom([]uint64{0, 1, 32, 1 << 32, 1<<32 | 7, xxh3.HashString(w)}).Draw(t, "hash")
			hashes[w] = h
			return h
		}
		for range rapid.IntRange(50, 400).Draw(t, "ops") {
			switch rapid.IntRange(0, 9).Draw(t, "op") {
			case 0:
				c.reset()
				clear(model)
			case 1, 2, 3, 4:
				w := word.Draw(t, "w")
				// Up to a slot's ids, and over them.
				n := rapid.SampledFrom([]int{0, 1, 3, inlineIDs, inlineIDs + 1, 12}).Draw(t, "n")
				ids := rapid.SliceOfN(rapid.Uint32(), n, n).Draw(t, "ids")
				h := hashOf(t, w)
				c.put(h, w, ids)
				model[w] = slices.Clone(ids)
				got, ok := c.appendIDs([]uint32{7}, h, w)
				if !ok || !slices.Equal(got[1:], ids) || got[0] != 7 {
					t.Fatalf("after put(%q, %v): got %v, %v", w, ids, got, ok)
				}
			case 5:
				// A batch: each word found is the model's; the batch stops
				// at the first word not found.
				words := rapid.SliceOfN(word, 0, 6).Draw(t, "words")
				hs := make([]uint64, len(words))
				for i, w := range words {
					hs[i] = hashOf(t, w)
				}
				got, done := c.appendBatch([]uint32{7}, words, hs, &scratch{})
				var want []uint32
				for _, w := range words[:done] {
					ids, known := model[w]
					if !known {
						t.Fatalf("batch %q: found %q, never put", words, w)
					}
					want = append(want, ids...)
				}
				if got[0] != 7 || !slices.Equal(got[1:], want) {
					t.Fatalf("batch %q (done %d): got %v, want [7] then %v", words, done, got, want)
				}
				if done < len(words) {
					if _, ok := c.appendIDs(nil, hs[done], words[done]); ok {
						t.Fatalf("batch %q stopped at %q, which is cached", words, words[done])
					}
				}
			default:
				w := word.Draw(t, "w")
				got, ok := c.appendIDs(nil, hashOf(t, w), w)
				want, known := model[w]
				if !ok {
					// With room for every word, nothing is ever dropped.
					if known && entries == 4096 {
						t.Fatalf("lookup %q: lost (want %v)", w, want)
					}
					continue
				}
				if !known || !slices.Equal(got, want) {
					t.Fatalf("lookup %q: got %v, want %v (known %v)", w, got, want, known)
				}
			}
			for i := range c.shards {
				s := &c.shards[i]
				if s.n+len(s.long) > c.perShard {
					t.Fatalf("shard %d holds %d entries, bound %d", i, s.n+len(s.long), c.perShard)
				}
			}
		}
	})
}

// TestWordCacheInlineLimits: words at and past the inline limits (length
// and ids) are cached and found, in the table or the map.
func TestWordCacheInlineLimits(t *testing.T) {
	c := newWordCache(1 << 10)
	cases := map[string][]uint32{
		strings.Repeat("a", inlineWordBytes):         {1, 2, 3, 4, 5, 6, 7, 8},
		strings.Repeat("b", inlineWordBytes+1):       {9},
		strings.Repeat("c", inlineWordBytes):         {1, 2, 3, 4, 5, 6, 7, 8, 9},
		"d":                                          {},
		strings.Repeat("e", maxCachedWord-1):         {10, 11},
		"\u00e9\U0001F642" + strings.Repeat("f", 10): {12},
	}
	for w, ids := range cases {
		c.put(xxh3.HashString(w), w, ids)
	}
	for w, ids := range cases {
		got, ok := c.appendIDs(nil, xxh3.HashString(w), w)
		if !ok || !slices.Equal(got, ids) {
			t.Errorf("%.30q: got %v, %v, want %v", w, got, ok, ids)
		}
	}
	if got, ok := c.appendIDs(nil, xxh3.HashString("zz"), "zz"); ok {
		t.Errorf("a word never put was found: %v", got)
	}
}

// TestParityTinyWordCache re-encodes the corpus through a word cache of 64
// words (two a shard, emptied all the time) with the span cache off: ids
// stay identical to the reference's.
func TestParityTinyWordCache(t *testing.T) {
	corpus := loadCorpus(t)
	for _, name := range testNames(tokenizerNames) {
		t.Run(name, func(t *testing.T) {
			tk, err := LoadFileOptions(filepath.Join(sharedDir(t), "tokenizers", name, "tokenizer.json"), Options{WordCacheEntries: 64, SpanCacheTokens: -1})
			if err != nil {
				t.Fatal(err)
			}
			o := loadOracle(t, name)
			for pass := range 2 {
				for i, s := range corpus {
					if got := tk.Encode(s, false); !slices.Equal(got, o.NoSpecial[i]) {
						t.Fatalf("pass %d string %d %q: got %v, want %v", pass, i, trunc(s), trunc32(got), trunc32(o.NoSpecial[i]))
					}
				}
			}
		})
	}
}
