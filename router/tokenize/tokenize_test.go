package tokenize

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
	"pgregory.net/rapid"
)

// alphabet covers every class the split patterns distinguish: ASCII and
// non-ASCII letters of each case, marks, digits, spaces and newlines,
// punctuation, apostrophes and the contraction letters.
var alphabet = []rune("aAbZsStTrReEvVmMlLdD'’ \t\n\r\u00a0\u3000\u2009/.,!?-_(){}<>中日é\u0301\u0308ǅʰß1٣²Ⅻ🙂\u200dΣσ\x0b\x85")

func genText() *rapid.Generator[string] {
	return rapid.Custom(func(t *rapid.T) string {
		rs := rapid.SliceOfN(rapid.SampledFrom(alphabet), 0, 40).Draw(t, "runes")
		return string(rs)
	})
}

// TestSplitMatchersMatchRegexp2: the hand-written matchers find exactly the
// matches that the patterns find on regexp2.
func TestSplitMatchersMatchRegexp2(t *testing.T) {
	for _, p := range []string{gpt2Pattern, qwenPattern, llama3Pattern, tekkenPattern} {
		re, err := compileRegex(p)
		if err != nil {
			t.Fatal(err)
		}
		fast := knownMatcher(p)
		slow := regexMatcher{re}
		rapid.Check(t, func(t *rapid.T) {
			s := genText().Draw(t, "s")
			got := fast.appendMatches(nil, s)
			want := slow.appendMatches(nil, s)
			if !slices.Equal(got, want) {
				t.Fatalf("pattern %.30q on %q:\n got %v\nwant %v", p, s, got, want)
			}
		})
	}
}

// TestContractionFoldsLongS: Oniguruma folds ſ (U+017F) to s under (?i),
// which regexp2 does not; the Qwen matcher follows Oniguruma.
func TestContractionFoldsLongS(t *testing.T) {
	got := qwenMatcher{maxDigits: 1}.appendMatches(nil, "it'ſ")
	want := []span{{0, 2}, {2, 5}}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// tinyJSON is a small byte-level tokenizer: bytes, a few merges, one
// special and one non-special added token.
func tinyJSON(t testing.TB, mutate func(m map[string]any)) []byte {
	t.Helper()
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[string(byteChars[b])] = b
	}
	merges := []string{"h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d", "a a", "aa aa"}
	next := 256
	for _, m := range merges {
		a, b, _ := strings.Cut(m, " ")
		if _, ok := vocab[a+b]; !ok {
			vocab[a+b] = next
			next++
		}
	}
	m := map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil,
		"added_tokens": []any{
			map[string]any{"id": next, "content": "<|end|>", "special": true, "lstrip": false, "rstrip": false, "single_word": false, "normalized": false},
			map[string]any{"id": next + 1, "content": "<x>", "special": false, "lstrip": false, "rstrip": false, "single_word": false, "normalized": false},
		},
		"normalizer":     map[string]any{"type": "NFC"},
		"pre_tokenizer":  map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
		"post_processor": map[string]any{"type": "TemplateProcessing", "single": []any{map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}, map[string]any{"SpecialToken": map[string]any{"id": "<|end|>", "type_id": 0}}}, "special_tokens": map[string]any{"<|end|>": map[string]any{"id": "<|end|>", "ids": []int{next}, "tokens": []string{"<|end|>"}}}},
		"decoder":        map[string]any{"type": "ByteLevel"},
		"model":          map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": merges},
	}
	if mutate != nil {
		mutate(m)
	}
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func tiny(t testing.TB) *Tokenizer {
	tk, err := Parse(tinyJSON(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func TestTinyEncode(t *testing.T) {
	tk := tiny(t)
	hello, _ := tk.TokenID("hello")
	world, _ := tk.TokenID("Ġworld")
	end, _ := tk.TokenID("<|end|>")
	x, _ := tk.TokenID("<x>")
	for _, c := range []struct {
		text    string
		special bool
		want    []uint32
	}{
		{"hello world", false, []uint32{hello, world}},
		{"hello world", true, []uint32{hello, world, end}},
		{"hello<x> world<|end|>", false, []uint32{hello, x, world, end}},
		{"", true, []uint32{end}},
		{"", false, nil},
	} {
		if got := tk.Encode(c.text, c.special); !slices.Equal(got, c.want) {
			t.Errorf("Encode(%q, %v) = %v, want %v", c.text, c.special, got, c.want)
		}
	}
	if got := tk.Decode([]uint32{hello, x, world, end}, true); got != "hello<x> world" {
		t.Errorf("Decode skipping specials = %q", got)
	}
	if tk.VocabSize() != 256+11+2 {
		t.Errorf("VocabSize = %d", tk.VocabSize())
	}
}

// TestUnsupportedComponents: anything outside the supported set is refused
// with an error naming the component and its type.
func TestUnsupportedComponents(t *testing.T) {
	for _, c := range []struct {
		key  string
		val  any
		want string
	}{
		{"pre_tokenizer", map[string]any{"type": "Whitespace"}, `pre_tokenizer type "Whitespace" is not supported`},
		{"normalizer", map[string]any{"type": "Precompiled"}, `normalizer type "Precompiled" is not supported`},
		{"decoder", map[string]any{"type": "WordPiece"}, `decoder type "WordPiece" is not supported`},
		{"post_processor", map[string]any{"type": "Weird"}, `post_processor type "Weird" is not supported`},
		{"model", map[string]any{"type": "Unigram", "vocab": []any{}}, `model type "Unigram" is not supported`},
		{"truncation", map[string]any{"max_length": 10}, "truncation is not supported"},
		{"pre_tokenizer", map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "a"}, "behavior": "Sideways", "invert": false}, `behavior "Sideways" is not supported`},
	} {
		_, err := Parse(tinyJSON(t, func(m map[string]any) { m[c.key] = c.val }))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s=%v: err %v, want it to contain %q", c.key, c.val, err, c.want)
		}
	}
	if _, err := Parse([]byte("{")); err == nil {
		t.Error("truncated JSON: no error")
	}
}

// TestMergeSmallEqualsHeap: both merge loops give the same result.
func TestMergeSmallEqualsHeap(t *testing.T) {
	tk := tiny(t)
	rapid.Check(t, func(t *rapid.T) {
		w := rapid.StringOfN(rapid.SampledFrom([]rune("helowrdaĠ")), 1, 120, -1).Draw(t, "w")
		var a, b []uint32
		for i := 0; i < len(w); i++ {
			a = append(a, tk.model.byteIDs[w[i]])
		}
		b = append(b, a...)
		sc := &scratch{}
		got := tk.model.mergeSmall(a, sc)
		want := tk.model.mergeHeap(b, sc)
		if !slices.Equal(got, want) {
			t.Fatalf("%q: small %v, heap %v", w, got, want)
		}
	})
}

// TestEncodeDecodeRoundTrip: byte-level encoding is lossless on valid UTF-8
// (up to the tokenizer's NFC normalization).
func TestEncodeDecodeRoundTrip(t *testing.T) {
	tk := tiny(t)
	rapid.Check(t, func(t *rapid.T) {
		s := rapid.String().Draw(t, "s")
		if got := tk.Decode(tk.Encode(s, false), false); got != norm.NFC.String(s) {
			t.Fatalf("round trip of %q gave %q", s, got)
		}
	})
}

// TestSpanCacheBounded: the span cache never holds more ids than its bound
// and keeps entries in use over ones not used since the hand passed.
func TestSpanCacheBounded(t *testing.T) {
	c := newSpanCache(100)
	ids := func(n int) []uint32 { return make([]uint32, n) }
	for i := 0; i < 50; i++ {
		c.put(newSpanKey(strings.Repeat("x", i+1), false), ids(20))
		if _, tok := c.len(); tok > 100 {
			t.Fatalf("after %d puts the cache holds %d ids, bound 100", i+1, tok)
		}
	}
	hot := newSpanKey("hot", false)
	c.put(hot, ids(10))
	for i := 0; i < 20; i++ {
		c.get(hot)
		c.put(newSpanKey(strings.Repeat("y", i+1), false), ids(20))
	}
	if _, ok := c.get(hot); !ok {
		t.Error("an entry read between every insert was evicted")
	}
	c.put(newSpanKey("huge", false), ids(60)) // over a quarter of the bound
	if _, ok := c.get(newSpanKey("huge", false)); ok {
		t.Error("an entry over a quarter of the bound was cached")
	}
}

// TestConcurrentEncode: many goroutines sharing one Tokenizer get the
// serial results (run under -race by make test).
func TestConcurrentEncode(t *testing.T) {
	tk, err := ParseOptions(tinyJSON(t, nil), Options{WordCacheEntries: 64, SpanCacheTokens: 256, MinSpanBytes: 8})
	if err != nil {
		t.Fatal(err)
	}
	texts := []string{"hello world hello world<|end|>", strings.Repeat("aaaa hello ", 30), "wor<x>ld 🙂 héllo", strings.Repeat("world", 50)}
	want := make([][]uint32, len(texts))
	for i, s := range texts {
		want[i] = tiny(t).Encode(s, true)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for k := 0; k < 200; k++ {
				i := (g + k) % len(texts)
				if got := tk.Encode(texts[i], true); !slices.Equal(got, want[i]) {
					errs <- texts[i]
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for s := range errs {
		t.Errorf("concurrent Encode(%q) differs from serial", s)
	}
}

// TestEncode4MB encodes a 4 MiB text (the time is in BenchmarkEncode4MB).
func TestEncode4MB(t *testing.T) {
	if testing.Short() {
		t.Skip("4 MiB encode skipped in -short")
	}
	tk := tiny(t)
	text := strings.Repeat("hello world 🙂 aaaa\n", (4<<20)/24)
	start := time.Now()
	ids := tk.Encode(text, false)
	t.Logf("4 MiB: %d ids in %v", len(ids), time.Since(start))
	if len(ids) == 0 {
		t.Fatal("no ids")
	}
}

func TestLoadDirConfig(t *testing.T) {
	tk := loadShared(t, "mistral_7b")
	cfg := tk.Config()
	if cfg.AddBOS == nil || !*cfg.AddBOS || cfg.BOSToken != "<s>" || cfg.EOSToken != "</s>" {
		t.Errorf("config = %+v", cfg)
	}
	if id, ok := tk.BOS(); !ok || id != 1 {
		t.Errorf("BOS = %d, %v", id, ok)
	}
	if testing.Short() {
		return
	}
	q := loadShared(t, "qwen2_5")
	if _, ok := q.BOS(); ok {
		t.Error("qwen2_5 has no BOS token")
	}
	if id, ok := q.EOS(); !ok || id != 151645 {
		t.Errorf("qwen2_5 EOS = %d, %v", id, ok)
	}
	var tmpl string
	if err := json.Unmarshal(q.Config().ChatTemplate, &tmpl); err != nil || !strings.Contains(tmpl, "im_start") {
		t.Errorf("chat template: %v", err)
	}
}

func FuzzEncode(f *testing.F) {
	for _, s := range []string{"", "hello world", "<|end|>x", "\xff\xfe", "é\u0301", "🙂🏽"} {
		f.Add(s)
	}
	tk := tiny(f)
	f.Fuzz(func(t *testing.T, s string) {
		ids := tk.Encode(s, true)
		if utf8.ValidString(s) {
			if got := tk.Decode(tk.Encode(s, false), false); got != norm.NFC.String(s) {
				t.Fatalf("round trip of %q gave %q", s, got)
			}
		}
		if len(ids) == 0 || ids[len(ids)-1] != tk.suffix[0] {
			t.Fatalf("Encode(%q, true) = %v does not end with the post-processor's token", s, ids)
		}
	})
}

func FuzzParse(f *testing.F) {
	f.Add(tinyJSON(f, nil))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0},"merges":["a a"]}}`))
	f.Add([]byte(`{"pre_tokenizer":{"type":"Split","pattern":{"Regex":"(?!"},"behavior":"Isolated"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tk, err := Parse(data)
		if err != nil {
			return
		}
		ids := tk.Encode("hello world <|end|> 🙂", true)
		tk.Decode(ids, false)
	})
}

func TestLoadSpec(t *testing.T) {
	sim, err := Load(BuiltinSim)
	if err != nil {
		t.Fatal(err)
	}
	ids := sim.Encode("hello simulated world", true)
	if len(ids) == 0 || sim.Decode(ids, false) == "" {
		t.Errorf("builtin:sim encoded to %v", ids)
	}
	if _, err := Load(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no tokenizer.json") {
		t.Errorf("empty directory: err %v", err)
	}
	if _, err := Load("no/such/path"); err == nil || !strings.Contains(err.Error(), BuiltinSim) {
		t.Errorf("missing path: err %v", err)
	}
	dir := filepath.Join(sharedDir(t), "tokenizers", "gpt2")
	for _, spec := range []string{dir, filepath.Join(dir, "tokenizer.json")} {
		e, err := Load(spec)
		if err != nil {
			t.Fatal(err)
		}
		if got := e.Decode(e.Encode("Hello world", false), false); got != "Hello world" {
			t.Errorf("%s: round trip gave %q", spec, got)
		}
	}
}
