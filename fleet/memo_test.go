package fleet

import (
	"slices"
	"testing"

	"github.com/inferrail/inferrail/engine/kvblock"
	"pgregory.net/rapid"
)

// The memo returns what hashing the segment returns, whether it computes,
// finds or recomputes after a clear (with small bounds it clears often; with
// large ones its index grows).
func TestSegmentMemoMatchesHashing(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		maxEntries := rapid.SampledFrom([]int{3, 10, memoLimit}).Draw(t, "maxEntries")
		maxHashes := rapid.SampledFrom([]int{100, memoArenaLimit}).Draw(t, "maxHashes")
		m := newSegmentMemo(maxEntries, maxHashes)
		bs := rapid.SampledFrom([]int{1, 4, 16}).Draw(t, "bs")
		salt := kvblock.Salt("m", "", "")
		for range rapid.IntRange(1, 3000).Draw(t, "calls") {
			key := memoKey{
				parent: kvblock.Hash{Lo: rapid.Uint64Range(0, 40).Draw(t, "parent")},
				seg:    kvblock.Segment{ID: rapid.Uint64Range(0, 40).Draw(t, "id"), Len: rapid.IntRange(bs, 80).Draw(t, "len")},
			}
			if key.parent.Lo == 0 {
				key.parent = salt
			}
			want := kvblock.AppendSegmentHashes(nil, key.parent, []kvblock.Segment{key.seg}, bs, -1)
			if got := m.hashes(key, bs); !slices.Equal(got, want) {
				t.Fatalf("memo of %+v: %d hashes, want %d (or they differ)", key, len(got), len(want))
			}
			if len(m.arena) > maxHashes+80 || m.n > maxEntries {
				t.Fatalf("memo holds %d hashes in %d entries", len(m.arena), m.n)
			}
		}
	})
}

// BenchmarkSegmentMemo looks up memoised 512-token segments (hits) and
// hashes new ones (misses), as a trace replay's prompts do.
func BenchmarkSegmentMemo(b *testing.B) {
	for _, tc := range []struct {
		name string
		hit  bool
	}{{"hit", true}, {"miss", false}} {
		b.Run(tc.name, func(b *testing.B) {
			m := newSegmentMemo(memoLimit, memoArenaLimit)
			salt := kvblock.Salt("m", "", "")
			id := uint64(0)
			b.ReportAllocs()
			for b.Loop() {
				if !tc.hit {
					id++
				}
				m.hashes(memoKey{parent: salt, seg: kvblock.Segment{ID: id, Len: 512}}, 16)
			}
		})
	}
}
