package kvblock

import (
	"testing"

	"pgregory.net/rapid"
)

func genSegments(t *rapid.T) []Segment {
	n := rapid.IntRange(0, 6).Draw(t, "nseg")
	segs := make([]Segment, n)
	for i := range segs {
		segs[i] = Segment{ID: rapid.Uint64Range(0, 5).Draw(t, "id"), Len: rapid.IntRange(0, 70).Draw(t, "len")}
	}
	return segs
}

func TestSegmentHashesEqualTokenHashes(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		segs := genSegments(t)
		bs := rapid.SampledFrom([]int{1, 4, 16, 32, 100}).Draw(t, "bs")
		salt := Salt(rapid.StringN(0, 5, -1).Draw(t, "model"), "", "")
		toks := AppendSegmentTokens(nil, segs)
		want := AppendHashes(nil, salt, toks, bs)
		got := AppendSegmentHashes(nil, salt, segs, bs, -1)
		if len(got) != len(toks)/bs || len(want) != len(got) {
			t.Fatalf("got %d hashes, want %d (tokens %d, block %d)", len(got), len(want), len(toks), bs)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("block %d: segment hash %v != token hash %v", i, got[i], want[i])
			}
		}
		if skip := rapid.IntRange(0, len(got)).Draw(t, "skip"); true {
			parent := salt
			if skip > 0 {
				parent = want[skip-1]
			}
			rest := AppendSegmentHashesFrom(append([]Hash(nil), want[:skip]...), parent, segs, bs, skip, -1)
			if len(rest) != len(want) {
				t.Fatalf("continued chain has %d blocks, want %d", len(rest), len(want))
			}
			for i := range want {
				if rest[i] != want[i] {
					t.Fatalf("continued chain differs at block %d", i)
				}
			}
		}
		if k := rapid.IntRange(0, len(got)).Draw(t, "max"); true {
			lim := AppendSegmentHashes(nil, salt, segs, bs, k)
			if len(lim) != k {
				t.Fatalf("maxBlocks %d gave %d hashes", k, len(lim))
			}
		}
	})
}

func TestChainProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bs := rapid.IntRange(1, 20).Draw(t, "bs")
		toks := rapid.SliceOfN(rapid.Uint32Range(0, 50), 0, 200).Draw(t, "toks")
		salt := Salt("m", "", "")
		base := AppendHashes(nil, salt, toks, bs)
		// A prefix hashes the same alone or inside a longer prompt.
		cut := rapid.IntRange(0, len(toks)).Draw(t, "cut")
		pre := AppendHashes(nil, salt, toks[:cut], bs)
		for i := range pre {
			if pre[i] != base[i] {
				t.Fatalf("prefix block %d differs", i)
			}
		}
		if len(toks) == 0 {
			return
		}
		// A changed token changes its block and every later one, never an earlier one.
		pos := rapid.IntRange(0, len(toks)-1).Draw(t, "pos")
		mut := append([]uint32(nil), toks...)
		mut[pos] ^= 1 << 20
		changed := AppendHashes(nil, salt, mut, bs)
		for i := range base {
			same := changed[i] == base[i]
			if i < pos/bs && !same {
				t.Fatalf("block %d before the change at %d differs", i, pos)
			}
			if i >= pos/bs && same {
				t.Fatalf("block %d at or after the change at %d is unchanged", i, pos)
			}
		}
	})
}

func TestSaltSeparates(t *testing.T) {
	toks := make([]uint32, 32)
	a := AppendHashes(nil, Salt("m", "", ""), toks, 16)
	for _, s := range []Hash{Salt("m", "lora", ""), Salt("m", "", "x"), Salt("n", "", ""), Salt("", "m", "")} {
		b := AppendHashes(nil, s, toks, 16)
		if a[0] == b[0] || a[1] == b[1] {
			t.Fatalf("salt %v shares blocks with the default", s)
		}
	}
}

func FuzzAppendHashes(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8}, uint8(2))
	f.Fuzz(func(t *testing.T, data []byte, bs uint8) {
		toks := make([]uint32, len(data))
		for i, b := range data {
			toks[i] = uint32(b)
		}
		h := AppendHashes(nil, Hash{}, toks, int(bs))
		if bs == 0 {
			if len(h) != 0 {
				t.Fatal("block size 0 must hash nothing")
			}
			return
		}
		if len(h) != len(toks)/int(bs) {
			t.Fatalf("got %d blocks for %d tokens of %d", len(h), len(toks), bs)
		}
		for i := range h {
			if h[i] != HashBlock(parentOf(h, i), toks[i*int(bs):(i+1)*int(bs)]) {
				t.Fatalf("block %d not chained", i)
			}
		}
	})
}

func parentOf(h []Hash, i int) Hash {
	if i == 0 {
		return Hash{}
	}
	return h[i-1]
}

func BenchmarkHashBlock16(b *testing.B) {
	toks := make([]uint32, 16*512)
	for i := range toks {
		toks[i] = uint32(i * 7)
	}
	dst := make([]Hash, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendHashes(dst[:0], Hash{}, toks, 16)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*512), "ns/block")
}

func BenchmarkSegmentHashes16(b *testing.B) {
	segs := []Segment{{ID: 1, Len: 4096}, {ID: 2, Len: 4096}}
	dst := make([]Hash, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendSegmentHashes(dst[:0], Hash{}, segs, 16, -1)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*512), "ns/block")
}
