package simtok

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/inferrail/inferrail/engine/kvblock"
	"pgregory.net/rapid"
)

func TestWordsAreDistinctAndRoundTrip(t *testing.T) {
	tk := New()
	seen := make(map[string]uint32, VocabSize)
	for id := uint32(0); id < VocabSize; id++ {
		w := tk.Word(id)
		if len(w) != WordBytes || w[WordBytes-1] != ' ' {
			t.Fatalf("word %d = %q, want %d bytes ending in a space", id, w, WordBytes)
		}
		if prev, ok := seen[w]; ok {
			t.Fatalf("ids %d and %d share the word %q", prev, id, w)
		}
		seen[w] = id
		if got := tk.Encode(w); len(got) != 1 || got[0] != id {
			t.Fatalf("Encode(%q) = %v, want [%d]", w, got, id)
		}
	}
}

// Generated text (any id sequence rendered as words) tokenizes back to the
// same ids: what makes multi-turn reuse work.
func TestDecodeEncodeIdentity(t *testing.T) {
	tk := New()
	rapid.Check(t, func(t *rapid.T) {
		ids := rapid.SliceOf(rapid.Uint32Range(0, VocabSize-1)).Draw(t, "ids")
		got := tk.Encode(tk.Decode(ids))
		if len(got) != len(ids) {
			t.Fatalf("got %d ids, want %d", len(got), len(ids))
		}
		for i := range ids {
			if got[i] != ids[i] {
				t.Fatalf("id %d: got %d, want %d", i, got[i], ids[i])
			}
		}
	})
}

// Token boundaries depend only on the text to their left: the tokens of a
// prefix, but for its last (possibly cut) one, are a prefix of the tokens of
// the whole.
func TestPrefixStability(t *testing.T) {
	tk := New()
	rapid.Check(t, func(t *rapid.T) {
		text := rapid.StringMatching(`([a-zé漢 \n\t]{0,20}|[a-z]{10,40})*`).Draw(t, "text")
		cutAt := rapid.IntRange(0, len(text)).Draw(t, "cut")
		whole := tk.Encode(text)
		pre := tk.Encode(text[:cutAt])
		if len(pre) == 0 {
			return
		}
		if len(pre) > len(whole) {
			t.Fatalf("prefix has %d tokens, whole %d", len(pre), len(whole))
		}
		for i := 0; i < len(pre)-1; i++ {
			if pre[i] != whole[i] {
				t.Fatalf("token %d differs: prefix %d, whole %d (%q)", i, pre[i], whole[i], text[:cutAt])
			}
		}
		if tk.CountTokens(text) != len(whole) {
			t.Fatalf("CountTokens = %d, Encode gives %d", tk.CountTokens(text), len(whole))
		}
	})
}

func TestLongPiecesAreCutBetweenRunes(t *testing.T) {
	tk := New()
	text := strings.Repeat("漢字", 20) + strings.Repeat("x", 30)
	var start, need int
	for i := 0; i < len(text); i++ {
		if cut(text[i], i+1-start, &need) {
			if p := text[start : i+1]; !utf8.ValidString(p) || len(p) > MaxPieceBytes+3 {
				t.Fatalf("piece %q is not whole runes or too long", p)
			}
			start = i + 1
		}
	}
	if n := tk.CountTokens(text); n < len(text)/(MaxPieceBytes+3) {
		t.Fatalf("%d tokens for %d bytes", n, len(text))
	}
}

func TestSegmentText(t *testing.T) {
	tk := New()
	seg := kvblock.Segment{ID: 42, Len: 100}
	text := tk.AppendSegmentText(nil, seg)
	ids := tk.Encode(string(text))
	want := kvblock.AppendSegmentTokens(nil, []kvblock.Segment{seg})
	if len(ids) != len(want) {
		t.Fatalf("%d ids, want %d", len(ids), len(want))
	}
	for i := range want {
		if ids[i] != want[i] {
			t.Fatalf("token %d: %d, want %d", i, ids[i], want[i])
		}
	}
}

func FuzzEncode(f *testing.F) {
	f.Add("hello world, 漢字 \xff\xfe")
	f.Add(strings.Repeat("a", 100))
	tk := New()
	f.Fuzz(func(t *testing.T, s string) {
		ids := tk.Encode(s)
		if len(ids) != tk.CountTokens(s) {
			t.Fatalf("count mismatch")
		}
		if len(s) > 0 && len(ids) == 0 {
			t.Fatalf("no tokens for %q", s)
		}
		for _, id := range ids {
			if id >= VocabSize {
				t.Fatalf("id %d out of range", id)
			}
		}
	})
}

func BenchmarkEncode(b *testing.B) {
	tk := New()
	text := string(tk.AppendSegmentText(nil, kvblock.Segment{ID: 7, Len: 2000}))
	dst := make([]uint32, 0, 4096)
	b.ReportAllocs()
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		dst = tk.AppendEncode(dst[:0], text)
	}
	b.ReportMetric(float64(len(dst))*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}

func BenchmarkDecode(b *testing.B) {
	tk := New()
	ids := kvblock.AppendSegmentTokens(nil, []kvblock.Segment{{ID: 7, Len: 2000}})
	dst := make([]byte, 0, 2000*WordBytes)
	b.ReportAllocs()
	for b.Loop() {
		dst = tk.AppendDecode(dst[:0], ids)
	}
}
