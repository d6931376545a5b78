package tokenize

import (
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"unicode/utf8"
)

// The parity fixtures come from scripts/tokenize-fixtures/run.sh: the
// reference library's ids and decodes for every corpus string.

var tokenizerNames = []string{"qwen2_5", "qwen3", "mistral_nemo", "mistral_7b", "gpt2"}

// testNames is tokenizerNames, or the two quickest to load in -short mode
// (make test runs -short under the race detector).
func testNames(all []string) []string {
	if testing.Short() {
		return []string{"mistral_7b", "gpt2"}
	}
	return all
}

// sharedDir walks up from the package directory to the shared folder.
func sharedDir(t testing.TB) string {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for {
		p := filepath.Join(dir, "shared", "tokenizers")
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			return filepath.Join(dir, "shared")
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Skip("shared/tokenizers not found above the package directory: the parity tests need the real tokenizer.json files (see ../shared/tokenizers/SOURCES.md)")
		}
		dir = parent
	}
}

var loaded sync.Map // name -> *Tokenizer

// loadShared loads (once per test binary) a shared tokenizer directory.
func loadShared(t testing.TB, name string) *Tokenizer {
	t.Helper()
	if tk, ok := loaded.Load(name); ok {
		return tk.(*Tokenizer)
	}
	tk, err := LoadDir(filepath.Join(sharedDir(t), "tokenizers", name))
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	loaded.Store(name, tk)
	return tk
}

func readGzipJSON(t testing.TB, path string, v any) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.NewDecoder(zr).Decode(v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

type oracleFixture struct {
	Oracle      string     `json:"oracle"`
	WithPrefix  []uint32   `json:"with_prefix"`
	WithSuffix  []uint32   `json:"with_suffix"`
	NoSpecial   [][]uint32 `json:"no_special"`
	WithSpecial [][]uint32 `json:"with_special"`
	Decoded     []string   `json:"decoded"`
	DecodedSkip []string   `json:"decoded_skip"`
}

func loadCorpus(t testing.TB) []string {
	var c []string
	readGzipJSON(t, filepath.Join("testdata", "corpus.json.gz"), &c)
	return c
}

func loadOracle(t testing.TB, name string) oracleFixture {
	var o oracleFixture
	readGzipJSON(t, filepath.Join("testdata", name+".oracle.json.gz"), &o)
	return o
}

// TestParity requires ids identical to the reference library's on every
// corpus string, with and without special tokens, and identical decodes.
func TestParity(t *testing.T) {
	corpus := loadCorpus(t)
	if len(corpus) < 3000 {
		t.Fatalf("corpus has %d strings, want at least 3000", len(corpus))
	}
	for _, name := range testNames(tokenizerNames) {
		t.Run(name, func(t *testing.T) {
			tk := loadShared(t, name)
			o := loadOracle(t, name)
			if len(o.NoSpecial) != len(corpus) {
				t.Fatalf("fixture has %d entries for %d corpus strings: regenerate with scripts/tokenize-fixtures/run.sh", len(o.NoSpecial), len(corpus))
			}
			bad := 0
			for i, s := range corpus {
				want := o.NoSpecial[i]
				wantWith := o.WithSpecial[i]
				if wantWith == nil {
					wantWith = slices.Concat(o.WithPrefix, want, o.WithSuffix)
				}
				got := tk.Encode(s, false)
				gotWith := tk.Encode(s, true)
				if !slices.Equal(got, want) || !slices.Equal(gotWith, wantWith) {
					bad++
					if bad <= 5 {
						t.Errorf("string %d %q:\n got %v\nwant %v\n with special got %v\n                want %v", i, trunc(s), trunc32(got), trunc32(want), trunc32(gotWith), trunc32(wantWith))
					}
					continue
				}
				if d := tk.Decode(want, false); d != o.Decoded[i] {
					bad++
					if bad <= 5 {
						t.Errorf("decode %d %q: got %q, want %q", i, trunc(s), trunc(d), trunc(o.Decoded[i]))
					}
				}
				if d := tk.Decode(wantWith, true); d != o.DecodedSkip[i] {
					bad++
					if bad <= 5 {
						t.Errorf("decode (skip special) %d %q: got %q, want %q", i, trunc(s), trunc(d), trunc(o.DecodedSkip[i]))
					}
				}
			}
			t.Logf("%s: %d/%d strings identical to %s", name, len(corpus)-bad, len(corpus), o.Oracle)
		})
	}
}

// TestParityCachedSpans re-encodes the corpus with warm caches: the span
// and word caches must not change any id.
func TestParityCachedSpans(t *testing.T) {
	corpus := loadCorpus(t)
	for _, name := range testNames(tokenizerNames) {
		t.Run(name, func(t *testing.T) {
			tk, err := LoadFileOptions(filepath.Join(sharedDir(t), "tokenizers", name, "tokenizer.json"), Options{MinSpanBytes: 1})
			if err != nil {
				t.Fatal(err)
			}
			o := loadOracle(t, name)
			for pass := 0; pass < 2; pass++ {
				for i, s := range corpus {
					if got := tk.Encode(s, false); !slices.Equal(got, o.NoSpecial[i]) {
						t.Fatalf("pass %d string %d %q: got %v, want %v", pass, i, trunc(s), trunc32(got), trunc32(o.NoSpecial[i]))
					}
				}
			}
			if n, _ := tk.spans.len(); n == 0 {
				t.Fatal("span cache stayed empty with MinSpanBytes 1")
			}
		})
	}
}

// TestDecodeRoundTrip: for the byte-level tokenizers, decoding the ids of
// valid UTF-8 text without special tokens gives the text back, whenever
// the reference's own decode does.
func TestDecodeRoundTrip(t *testing.T) {
	corpus := loadCorpus(t)
	for _, name := range testNames([]string{"qwen2_5", "qwen3", "mistral_nemo", "gpt2"}) {
		if name == "mistral_7b" {
			continue
		}
		tk := loadShared(t, name)
		o := loadOracle(t, name)
		for i, s := range corpus {
			if !utf8.ValidString(s) || o.Decoded[i] != s {
				continue
			}
			if got := tk.Decode(tk.Encode(s, false), false); got != s {
				t.Errorf("%s: round trip of %q gave %q", name, trunc(s), trunc(got))
			}
		}
	}
}

func trunc(s string) string {
	if len(s) > 120 {
		return s[:120] + "…"
	}
	return s
}

func trunc32(v []uint32) []uint32 {
	if len(v) > 40 {
		return v[:40]
	}
	return v
}
