package fleet

import (
	"slices"
	"testing"

	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/workload"
	"pgregory.net/rapid"
)

// aheadSource is a listSource (dp_test.go) that may be taken ahead.
type aheadSource struct{ listSource }

func (s *aheadSource) TakesAhead() bool { return true }

// TestPreparerGivesEachRequestItsHashes: however spare work (pieces of
// hashing and taking arrivals ahead) interleaves with the loop taking
// arrivals, hashing them and recycling finished ones' slices, every
// arrival comes out in the source's order with the hashes of its whole
// sequence, as hashing it alone gives. Prompts share segments (the memo)
// and end inside blocks; some are long enough to take several pieces.
func TestPreparerGivesEachRequestItsHashes(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bs := rapid.SampledFrom([]int{1, 4, 16}).Draw(t, "bs")
		n := rapid.IntRange(0, 40).Draw(t, "requests")
		src := &aheadSource{}
		for i := range n {
			r := &workload.Request{ID: uint64(i + 1), Model: rapid.SampledFrom([]string{"a", "b"}).Draw(t, "model")}
			for range rapid.IntRange(1, 12).Draw(t, "segments") {
				r.Prompt = append(r.Prompt, kvblock.Segment{
					ID:  rapid.Uint64Range(0, 6).Draw(t, "id"),
					Len: rapid.SampledFrom([]int{bs, 3 * bs, 512, 512 + 5, 40*bs + 1}).Draw(t, "len"),
				})
			}
			r.OutputTokens = rapid.IntRange(1, 40).Draw(t, "out")
			r.Output = kvblock.Segment{ID: 1000 + uint64(i), Len: r.OutputTokens}
			src.reqs = append(src.reqs, r)
		}
		p := newPreparer(src, bs)
		want := func(r *workload.Request) []kvblock.Hash {
			segs := append(slices.Clone(r.Prompt), r.Output)
			return kvblock.AppendSegmentHashes(nil, kvblock.Salt(r.Model, "", ""), segs, bs, -1)
		}
		var pending []*reqState // taken, not yet hashed (as pullArrival leaves them in the heap)
		var done [][]kvblock.Hash
		got := 0
		for steps := 0; got < n; steps++ {
			if steps > 100000 {
				t.Fatalf("%d of %d requests after %d steps", got, n, steps)
			}
			switch rapid.IntRange(0, 3).Draw(t, "op") {
			case 0:
				p.spare()
			case 1:
				if len(pending) < 2 {
					if rs := p.next(); rs != nil {
						pending = append(pending, rs)
					}
				}
			case 2:
				if len(pending) == 0 {
					continue
				}
				rs := pending[0]
				pending = pending[1:]
				h := p.hashesOf(rs)
				if rs.w != src.reqs[got] {
					t.Fatalf("arrival %d is request %d", got+1, rs.w.ID)
				}
				if w := want(rs.w); !slices.Equal(h, w) {
					t.Fatalf("request %d: %d hashes, want %d (or they differ)", rs.w.ID, len(h), len(w))
				}
				got++
				done = append(done, h)
			case 3:
				if len(done) > 0 {
					k := rapid.IntRange(0, len(done)-1).Draw(t, "finished")
					p.recycle(done[k])
					done = slices.Delete(done, k, k+1)
				}
			}
		}
		if rs := p.next(); rs != nil || len(pending) > 0 {
			t.Fatalf("an arrival after the source's last")
		}
		p.stop()
		if p.spare() {
			t.Fatalf("spare work after stop")
		}
	})
}

// TestPreparerConcurrentSpareWork: with another goroutine doing spare work
// all the time (as the lane's worker does between jobs), the loop still
// gets every arrival once, in the source's order, with its own hashes.
func TestPreparerConcurrentSpareWork(t *testing.T) {
	const n = 3000
	src := &aheadSource{}
	for i := range n {
		src.reqs = append(src.reqs, &workload.Request{
			ID:           uint64(i + 1),
			Model:        "m",
			Prompt:       []kvblock.Segment{{ID: uint64(i % 7), Len: 512}, {ID: uint64(i), Len: 16*(i%50) + 3}},
			OutputTokens: 5,
			Output:       kvblock.Segment{ID: 1 << 40, Len: 5},
		})
	}
	p := newPreparer(src, 16)
	stop := make(chan struct{})
	worker := make(chan struct{})
	go func() {
		defer close(worker)
		for {
			select {
			case <-stop:
				return
			default:
				p.spare()
			}
		}
	}()
	for i := range n {
		rs := p.next()
		if rs == nil {
			t.Fatalf("no arrival %d", i+1)
		}
		if rs.w != src.reqs[i] {
			t.Fatalf("arrival %d is request %d", i+1, rs.w.ID)
		}
		r := rs.w
		want := kvblock.AppendSegmentHashes(nil, kvblock.Salt(r.Model, "", ""), append(slices.Clone(r.Prompt), r.Output), 16, -1)
		if h := p.hashesOf(rs); !slices.Equal(h, want) {
			t.Fatalf("request %d: %d hashes, want %d (or they differ)", r.ID, len(h), len(want))
		}
		if i%3 == 0 {
			p.recycle(rs.hashes)
		}
	}
	if rs := p.next(); rs != nil {
		t.Fatalf("an arrival after the source's last")
	}
	close(stop)
	<-worker
}
