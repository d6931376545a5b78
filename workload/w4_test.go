package workload

import (
	"math"
	"slices"
	"testing"

	"github.com/inferrail/inferrail/engine/kvblock"
	"pgregory.net/rapid"
)

// checkW4 checks the structure of w4 requests and returns, per request, the
// popularity ranks (from 0) of its documents in prompt order.
func checkW4(t tb, c *Config, src *w4, reqs []*Request) [][]int {
	t.Helper()
	p := &c.W4
	rank := map[kvblock.Segment]int{}
	for i, d := range src.docs {
		if d.Len < p.DocMinTokens || d.Len > p.DocMaxTokens {
			t.Fatalf("document %d of %d tokens", i, d.Len)
		}
		rank[d] = i
	}
	if len(rank) != p.Documents {
		t.Fatalf("%d distinct documents, want %d", len(rank), p.Documents)
	}
	nsys := 0
	if p.SystemTokens > 0 {
		nsys = 1
	}
	fresh := map[uint64]bool{}
	out := make([][]int, len(reqs))
	var sys kvblock.Segment
	for i, r := range reqs {
		checkRequest(t, c, r)
		if r.ID != uint64(i+1) || r.Session != 0 || r.Turn != 0 {
			t.Fatalf("request %d at %d: session %d turn %d", r.ID, i, r.Session, r.Turn)
		}
		if i > 0 && r.Arrival < reqs[i-1].Arrival {
			t.Fatal("arrivals out of order")
		}
		if len(r.Prompt) != nsys+p.DocsPerPrompt+1 {
			t.Fatalf("request %d: %d segments, want %d", r.ID, len(r.Prompt), nsys+p.DocsPerPrompt+1)
		}
		if nsys > 0 {
			if s := r.Prompt[0]; s.Len != p.SystemTokens || (i > 0 && s != sys) {
				t.Fatalf("request %d: system prompt %+v, want the shared one of %d tokens", r.ID, s, p.SystemTokens)
			}
			sys = r.Prompt[0]
		}
		ranks := make([]int, p.DocsPerPrompt)
		for j, d := range r.Prompt[nsys : nsys+p.DocsPerPrompt] {
			k, ok := rank[d]
			if !ok {
				t.Fatalf("request %d: segment %+v is not a document", r.ID, d)
			}
			ranks[j] = k
		}
		sorted := slices.Sorted(slices.Values(ranks))
		if len(slices.Compact(sorted)) != len(ranks) {
			t.Fatalf("request %d: documents %v not distinct", r.ID, ranks)
		}
		if p.Order == OrderRank && !slices.IsSorted(ranks) {
			t.Fatalf("request %d: documents %v not in rank order", r.ID, ranks)
		}
		q := r.Prompt[len(r.Prompt)-1]
		if q.Len < p.QuestionMinTokens || q.Len > p.QuestionMaxTokens {
			t.Fatalf("request %d: question of %d tokens", r.ID, q.Len)
		}
		for _, id := range []uint64{q.ID, r.Output.ID} {
			if fresh[id] {
				t.Fatalf("segment %x reused", id)
			}
			fresh[id] = true
		}
		out[i] = ranks
	}
	return out
}

func TestW4Documents(t *testing.T) {
	c := mustConfig(t, "w4")
	c.Requests = 20000
	src := mustNew(t, c).(*w4)
	reqs := drainOpen(src)
	if len(reqs) != c.Requests {
		t.Fatalf("%d requests, want %d", len(reqs), c.Requests)
	}
	ranks := checkW4(t, &c, src, reqs)
	counts := make([]int, c.W4.Documents)
	var topFirst int
	for _, rs := range ranks {
		for _, k := range rs {
			counts[k]++
		}
		if rs[0] == 0 {
			topFirst++
		}
	}
	byCount := slices.Sorted(slices.Values(counts))
	median := byCount[len(byCount)/2]
	// Zipf 1.0 over 1000 documents: rank 1 has weight 1/H(1000) ≈ 13.4% per
	// draw, the median document (rank ≈ 500) ≈ 0.027%.
	if counts[0] < 100*max(median, 1) {
		t.Fatalf("most popular document in %d requests, the median one in %d", counts[0], median)
	}
	// Rank 1 is drawn in about 45% of the requests (4 draws without
	// replacement), and then always leads.
	if f := float64(counts[0]) / float64(len(reqs)); f < 0.40 || f > 0.50 {
		t.Fatalf("most popular document in %.3f of requests", f)
	}
	if topFirst != counts[0] {
		t.Fatalf("rank 1 in %d requests but first in %d", counts[0], topFirst)
	}
	for k := 1; k < 10; k++ {
		if counts[k] > counts[k-1] {
			t.Fatalf("rank %d drawn %d times, more than rank %d (%d)", k+1, counts[k], k, counts[k-1])
		}
	}
	t.Logf("rank 1 in %.1f%% of requests, rank 2 %.1f%%, median document %d times in %d requests",
		100*float64(counts[0])/float64(len(reqs)), 100*float64(counts[1])/float64(len(reqs)), median, len(reqs))
}

// TestW4OrderSharesPrefix checks the reason for rank order: consecutive
// requests share longer prefixes than with random order.
func TestW4OrderSharesPrefix(t *testing.T) {
	shared := func(order string) float64 {
		c := mustConfig(t, "w4")
		c.Requests = 20000
		c.W4.Order = order
		src := mustNew(t, c).(*w4)
		reqs := drainOpen(src)
		ranks := checkW4(t, &c, src, reqs)
		if order == OrderRandom {
			var sorted int
			for _, rs := range ranks {
				if slices.IsSorted(rs) {
					sorted++
				}
			}
			// 4 distinct documents are sorted in 1/24 of the orders.
			if f := float64(sorted) / float64(len(ranks)); f < 0.03 || f > 0.055 {
				t.Fatalf("random order: %.3f of requests in rank order", f)
			}
		}
		// Mean number of leading documents a request shares with its
		// predecessor.
		var n int
		for i := 1; i < len(ranks); i++ {
			for j := range ranks[i] {
				if ranks[i][j] != ranks[i-1][j] {
					break
				}
				n++
			}
		}
		return float64(n) / float64(len(ranks)-1)
	}
	rank, random := shared(OrderRank), shared(OrderRandom)
	if rank < 2*random {
		t.Fatalf("documents shared as a prefix with the previous request: rank order %.3f, random %.3f", rank, random)
	}
	t.Logf("mean leading documents shared with the previous request: rank %.3f, random %.3f", rank, random)
}

// TestW4WithoutReplacement checks draw against the exact distribution of
// successive sampling without replacement on a small corpus.
func TestW4WithoutReplacement(t *testing.T) {
	c := mustConfig(t, "w4")
	c.W4.Documents = 4
	c.W4.DocsPerPrompt = 2
	c.W4.PopularityZipf = 2
	src := mustNew(t, c).(*w4)
	w := []float64{1, 1.0 / 4, 1.0 / 9, 1.0 / 16}
	var sum float64
	for _, x := range w {
		sum += x
	}
	const n = 200000
	got := map[[2]int]int{}
	for range n {
		src.draw()
		got[[2]int(src.chosen)]++
	}
	for a := range 4 {
		for b := a + 1; b < 4; b++ {
			pa, pb := w[a]/sum, w[b]/sum
			want := pa*pb/(1-pa) + pb*pa/(1-pb)
			f := float64(got[[2]int{a, b}]) / n
			if math.Abs(f-want) > 4*math.Sqrt(want*(1-want)/n)+1e-4 {
				t.Fatalf("documents {%d, %d} drawn with frequency %.4f, want %.4f", a, b, f, want)
			}
		}
	}
	// Every document, however unpopular, once all are drawn.
	c.W4.Documents = 50
	c.W4.DocsPerPrompt = 50
	c.W4.PopularityZipf = 6
	c.MaxModelLen = 300 + 50*1500 + 200 + c.Output.MaxTokens
	src = mustNew(t, c).(*w4)
	for range 100 {
		src.draw()
		for i, d := range src.chosen {
			if d != i {
				t.Fatalf("all 50 documents drawn as %v", src.chosen)
			}
		}
	}
}

func TestW4Property(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c, _ := DefaultConfig("w4")
		c.Seed = rapid.Uint64().Draw(t, "seed")
		c.Rate = rapid.Float64Range(0.01, 1e4).Draw(t, "rate")
		c.Requests = rapid.IntRange(1, 300).Draw(t, "requests")
		genOutput(t, &c)
		genArrival(t, &c)
		p := &c.W4
		p.SystemTokens = rapid.IntRange(0, 2000).Draw(t, "system")
		p.Documents = rapid.IntRange(1, 200).Draw(t, "documents")
		p.DocMinTokens = rapid.IntRange(1, 2000).Draw(t, "doc_min")
		p.DocMaxTokens = rapid.IntRange(p.DocMinTokens, 2000).Draw(t, "doc_max")
		p.PopularityZipf = rapid.Float64Range(0, 8).Draw(t, "zipf")
		p.DocsPerPrompt = rapid.IntRange(1, min(p.Documents, 12)).Draw(t, "docs_per_prompt")
		p.Order = rapid.SampledFrom([]string{OrderRank, OrderRandom}).Draw(t, "order")
		p.QuestionMinTokens = rapid.IntRange(1, 300).Draw(t, "question_min")
		p.QuestionMaxTokens = rapid.IntRange(p.QuestionMinTokens, 300).Draw(t, "question_max")
		c.MaxModelLen = p.SystemTokens + p.DocsPerPrompt*p.DocMaxTokens + p.QuestionMaxTokens + c.Output.MaxTokens +
			rapid.IntRange(0, 100).Draw(t, "slack")
		src := mustNew(t, c).(*w4)
		reqs := drainOpen(src)
		if len(reqs) != c.Requests {
			t.Fatalf("%d requests, want %d", len(reqs), c.Requests)
		}
		checkW4(t, &c, src, reqs)
	})
}
