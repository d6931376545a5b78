package engine

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
	"pgregory.net/rapid"
)

// mkReq builds a request over a segment chain (prompt then output segment).
func mkReq(id RequestID, bs int, prompt []kvblock.Segment, out int) Request {
	seq := append(append([]kvblock.Segment(nil), prompt...), kvblock.Segment{ID: 1<<60 + uint64(id), Len: out})
	return Request{
		ID:           id,
		PromptTokens: kvblock.TotalLen(prompt),
		OutputTokens: out,
		BlockHashes:  kvblock.AppendSegmentHashes(nil, kvblock.Salt("m", "", ""), seq, bs, -1),
	}
}

// runToIdle steps e until it has no work, returning every emission with its time.
type emitted struct {
	at time.Duration
	Emission
}

func runToIdle(t testing.TB, e *Engine, from time.Duration) []emitted {
	t.Helper()
	var out []emitted
	now := from
	for i := 0; ; i++ {
		at, ok := e.NextStep()
		if !ok {
			return out
		}
		if i > 1_000_000 {
			t.Fatalf("engine did not drain")
		}
		now = max(now, at)
		res := e.Step(now)
		for _, em := range res.Emitted {
			out = append(out, emitted{res.End(), em})
		}
		now = res.End()
	}
}

func ms(f float64) time.Duration { return time.Duration(f * 1e6) }

func TestHandComputedTimings(t *testing.T) {
	cfg := DefaultConfig()
	// Profile: 12 ms + 90 us/prefill token + 3.3 ns/pair + 150 us/decode seq + 128 ns/ctx token.
	type want struct {
		output int
		at     time.Duration
	}
	cases := []struct {
		name   string
		prompt int
		out    int
		want   []want
	}{
		{
			// step 1: prefill 100 tokens: 12 + 0.09*100 + 3.3e-6*100*(0+50) = 21.0165 ms
			// step 2: decode ctx 101: 12 + 0.15 + 128e-6*101 = 12.162928 ms -> 33.179428
			// step 3: decode ctx 102: 12 + 0.15 + 128e-6*102 = 12.163056 ms -> 45.342484
			name: "short prompt", prompt: 100, out: 3,
			want: []want{{1, ms(21.0165)}, {2, ms(33.179428)}, {3, ms(45.342484)}},
		},
		{
			// chunked prefill at the 2048-token budget:
			// step 1: 2048 tokens, ctx 0: 12 + 184.32 + 3.3e-6*2048*1024 = 203.2406016 ms (no token)
			// step 2: 952 tokens, ctx 2048: 12 + 85.68 + 3.3e-6*952*2524 = 105.6093984 ms -> 308.85
			name: "chunked prefill", prompt: 3000, out: 1,
			want: []want{{1, ms(308.85)}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Add(0, mkReq(1, cfg.BlockSize, []kvblock.Segment{{ID: 7, Len: tc.prompt}}, tc.out)); err != nil {
				t.Fatal(err)
			}
			got := runToIdle(t, e, 0)
			if len(got) != len(tc.want) {
				t.Fatalf("got %d tokens, want %d", len(got), len(tc.want))
			}
			for i, w := range tc.want {
				if got[i].Output != w.output || absDur(got[i].at-w.at) > time.Nanosecond {
					t.Errorf("token %d: got #%d at %v, want #%d at %v", i, got[i].Output, got[i].at, w.output, w.at)
				}
			}
		})
	}
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

func TestPrefixHitRecomputesLastTokenAndIsCheaper(t *testing.T) {
	cfg := DefaultConfig()
	e, _ := New(cfg)
	sys := []kvblock.Segment{{ID: 42, Len: 1600}} // exactly 100 blocks
	if err := e.Add(0, mkReq(1, 16, sys, 1)); err != nil {
		t.Fatal(err)
	}
	first := runToIdle(t, e, 0)
	cold := first[0].at
	// Same prompt again: fully cached, yet the last block is recomputed
	// (99 blocks hit, 16 tokens computed).
	if err := e.Add(time.Second, mkReq(2, 16, sys, 1)); err != nil {
		t.Fatal(err)
	}
	second := runToIdle(t, e, time.Second)
	if got := second[0].CachedTokens; got != 1584 {
		t.Fatalf("cached tokens %d, want 1584 (99 of 100 blocks)", got)
	}
	warm := second[0].at - time.Second
	// 16 tokens after 1584 cached: 12 + 1.44 + 3.3e-6*16*(1584+8) ms
	if want := cfg.Latency.PrefillTime(16, 1584); warm != want {
		t.Fatalf("warm TTFT %v, want %v", warm, want)
	}
	if warm >= cold {
		t.Fatalf("cached prefix not cheaper: warm %v, cold %v", warm, cold)
	}
	m := e.Metrics()
	if m.PrefixCacheHits != 1584 || m.PrefixCacheQueries != 3200 {
		t.Fatalf("prefix cache counters: hits %d queries %d", m.PrefixCacheHits, m.PrefixCacheQueries)
	}
}

func TestPrefillCheaperWithCache(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := DefaultConfig().Latency
		p.PrefillPairNs = rapid.Float64Range(0, 10).Draw(t, "pair")
		p.PrefillTokenUs = rapid.Float64Range(1, 200).Draw(t, "tok")
		u := rapid.IntRange(2, 30000).Draw(t, "u")
		c := rapid.IntRange(0, 30000).Draw(t, "c")
		k := rapid.IntRange(1, u-1).Draw(t, "k")
		if p.PrefillTime(u-k, c+k) >= p.PrefillTime(u, c) {
			t.Fatalf("caching %d more tokens did not make prefill cheaper", k)
		}
	})
}

func TestGeneratedBlocksAreCachedForTheNextTurn(t *testing.T) {
	e, _ := New(DefaultConfig())
	turn0 := []kvblock.Segment{{ID: 1, Len: 320}}
	if err := e.Add(0, mkReq(1, 16, turn0, 161)); err != nil {
		t.Fatal(err)
	}
	runToIdle(t, e, 0)
	// Turn 1 resends the prompt, the answer (output segment of request 1) and a question.
	turn1 := []kvblock.Segment{{ID: 1, Len: 320}, {ID: 1<<60 + 1, Len: 161}, {ID: 9, Len: 40}}
	if err := e.Add(time.Minute, mkReq(2, 16, turn1, 1)); err != nil {
		t.Fatal(err)
	}
	got := runToIdle(t, e, time.Minute)
	// 320+160 tokens had KV (the last sampled token never does): 30 full blocks.
	if got[0].CachedTokens != 480 {
		t.Fatalf("cached %d tokens of the history, want 480", got[0].CachedTokens)
	}
}

func TestAddRejectsBadRequests(t *testing.T) {
	cfg := DefaultConfig()
	cfg.NumGPUBlocks = 10
	cfg.MaxModelLen = 1000
	e, _ := New(cfg)
	cases := []struct {
		req  Request
		want error
	}{
		{Request{ID: 1, PromptTokens: 900, OutputTokens: 10, MaxTokens: 200}, ErrTooLong},
		{Request{ID: 2, PromptTokens: 200, OutputTokens: 10}, ErrTooLarge},
		{Request{ID: 3, PromptTokens: 0, OutputTokens: 10}, ErrInvalid},
	}
	for _, c := range cases {
		if err := e.Add(0, c.req); !errors.Is(err, c.want) {
			t.Errorf("request %d: got %v, want %v", c.req.ID, err, c.want)
		}
	}
	if err := e.Add(0, Request{ID: 4, PromptTokens: 10, OutputTokens: 1}); err != nil {
		t.Fatal(err)
	}
	if err := e.Add(0, Request{ID: 4, PromptTokens: 10, OutputTokens: 1}); !errors.Is(err, ErrDuplicateID) {
		t.Fatalf("duplicate id: %v", err)
	}
	if err := e.Abort(0, 99); !errors.Is(err, ErrUnknownID) {
		t.Fatalf("abort unknown: %v", err)
	}
}

func TestAbortFreesAtOnce(t *testing.T) {
	e, _ := New(DefaultConfig())
	_ = e.Add(0, mkReq(1, 16, []kvblock.Segment{{ID: 3, Len: 1000}}, 100))
	e.Step(0)
	if m := e.Metrics(); m.UsedBlocks == 0 || m.Running != 1 {
		t.Fatalf("request not running: %+v", m)
	}
	if err := e.Abort(time.Millisecond, 1); err != nil {
		t.Fatal(err)
	}
	m := e.Metrics()
	if m.UsedBlocks != 0 || m.Running != 0 || m.Waiting != 0 || m.RequestsAborted != 1 {
		t.Fatalf("abort left state behind: %+v", m)
	}
	if m.CachedBlocks != 62 {
		t.Fatalf("computed blocks should stay cached: %d", m.CachedBlocks)
	}
	if _, ok := e.NextStep(); ok {
		t.Fatal("idle engine wants to step")
	}
}

func TestKVEventsAndReset(t *testing.T) {
	cfg := DefaultConfig()
	cfg.EnableKVEvents = true
	cfg.NumGPUBlocks = 8
	e, _ := New(cfg)
	_ = e.Add(0, mkReq(1, 16, []kvblock.Segment{{ID: 1, Len: 64}}, 1))
	res := e.Step(0)
	if len(res.Events) != 1 || res.Events[0].Kind != BlockStored || len(res.Events[0].BlockHashes) != 4 || res.Events[0].HasParent {
		t.Fatalf("first step events: %+v", res.Events)
	}
	stored := res.Events[0].BlockHashes
	// A different 128-token prompt needs all 8 blocks: the 4 cached ones are evicted.
	_ = e.Add(time.Second, mkReq(2, 16, []kvblock.Segment{{ID: 2, Len: 112}}, 1))
	res = e.Step(time.Second)
	var removed []kvblock.Hash
	for _, ev := range res.Events {
		if ev.Kind == BlockRemoved {
			removed = append(removed, ev.BlockHashes...)
		}
	}
	if len(removed) != 3 {
		t.Fatalf("removed %d blocks, want 3 (7 needed, 4 empty slots first)", len(removed))
	}
	// Tail blocks go first: the request freed its blocks tail first.
	if removed[0] != stored[3] || removed[1] != stored[2] || removed[2] != stored[1] {
		t.Fatalf("eviction order %v, want the tail of %v first", removed, stored)
	}
	ok, evs := e.ResetPrefixCache()
	if !ok || len(evs) != 1 || evs[0].Kind != AllBlocksCleared {
		t.Fatalf("reset: %v %+v", ok, evs)
	}
	if e.Metrics().CachedBlocks != 0 {
		t.Fatal("reset left cached blocks")
	}
}

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig([]byte("num_gpu_blocks: 100\nlatency:\n  step_fixed_ms: 5\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.NumGPUBlocks != 100 || c.Latency.StepFixedMs != 5 || c.BlockSize != 16 || c.Latency.PrefillTokenUs != 90 {
		t.Fatalf("overlay wrong: %+v", c)
	}
	if _, err := ParseConfig(nil); err != nil {
		t.Fatalf("empty profile: %v", err)
	}
	for _, bad := range []struct{ yaml, mention string }{
		{"num_gpu_blocks: -1\n", "num_gpu_blocks"},
		{"num_gpu_blocks: 1000000000\n", "num_gpu_blocks"},
		{"latency:\n  prefill_token_us: 0\n", "latency.prefill_token_us"},
		{"latency:\n  decode_seq_us: -3\n", "latency.decode_seq_us"},
		{"bogus: 1\n", "bogus"},
		{"block_size: [1]\n", "line 1"},
	} {
		_, err := ParseConfig([]byte(bad.yaml))
		if err == nil || !contains(err.Error(), bad.mention) {
			t.Errorf("%q: error %v should mention %q", bad.yaml, err, bad.mention)
		}
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && indexOf(s, sub) >= 0)
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// checkInvariants verifies the pool and scheduler state against each other.
func checkInvariants(t *rapid.T, e *Engine) {
	refs := make([]int32, len(e.pool.blocks))
	for _, s := range e.seqs {
		for _, id := range s.blocks {
			refs[id]++
		}
		if s.state == stateWaiting && len(s.blocks) != 0 && !s.loading {
			t.Fatalf("waiting request %d holds %d blocks", s.id, len(s.blocks))
		}
	}
	// An aborted request's load holds its blocks until it ends.
	for _, l := range e.loads {
		if l.aborted {
			for _, id := range l.s.blocks {
				refs[id]++
			}
		}
	}
	checkTiers(t, e)
	free := 0
	for i, b := range e.pool.blocks {
		if b.ref < 0 {
			t.Fatalf("block %d has ref %d", i, b.ref)
		}
		if b.ref != refs[i] {
			t.Fatalf("block %d: ref %d but held by %d requests", i, b.ref, refs[i])
		}
		if (b.ref == 0) != b.inFree {
			t.Fatalf("block %d: ref %d inFree %v", i, b.ref, b.inFree)
		}
		if b.ref == 0 {
			free++
		}
	}
	n := 0
	for i := e.pool.qhead; i < len(e.pool.queue); i++ {
		if e.pool.live(i) {
			n++
		}
	}
	if n != free || e.pool.nfree != free {
		t.Fatalf("free queue has %d, counter %d, free blocks %d", n, e.pool.nfree, free)
	}
	// Every cached block is found under its hash, and nothing else is
	// found: an entry matches only while its block holds the key, so the
	// entries are the cached blocks' plus the stale ones left by evictions
	// since the last rebuild, which keep the table at most half full.
	hashed := 0
	for i, b := range e.pool.blocks {
		if !b.hashed {
			continue
		}
		hashed++
		if got, ok := e.pool.cached.get(b.hash, e.pool.blocks); !ok || got != int32(i) {
			t.Fatalf("block %d holding %v: cache finds block %d (%v)", i, b.hash, got, ok)
		}
	}
	e.pool.cached.each(e.pool.blocks, func(h kvblock.Hash, id int32) {
		if got, ok := e.pool.cached.get(h, e.pool.blocks); ok && !e.pool.blocks[got].hashed {
			t.Fatalf("cache finds %v in block %d, which caches nothing", h, got)
		}
	})
	if hashed != e.pool.ncached || e.pool.cached.len() != hashed+e.pool.stale || 2*e.pool.cached.len() > len(e.pool.cached.slots) {
		t.Fatalf("%d blocks are hashed, %d counted; the cache holds %d entries (%d stale) in %d slots",
			hashed, e.pool.ncached, e.pool.cached.len(), e.pool.stale, len(e.pool.cached.slots))
	}
	if len(e.running) > e.cfg.MaxNumSeqs {
		t.Fatalf("%d running > max_num_seqs %d", len(e.running), e.cfg.MaxNumSeqs)
	}
	if len(e.running)+e.waiting.len() != len(e.seqs) {
		t.Fatalf("running %d + waiting %d != requests %d", len(e.running), e.waiting.len(), len(e.seqs))
	}
}

func TestEngineInvariants(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := DefaultConfig()
		cfg.BlockSize = rapid.SampledFrom([]int{4, 16}).Draw(t, "bs")
		cfg.NumGPUBlocks = rapid.IntRange(8, 120).Draw(t, "blocks")
		cfg.MaxNumSeqs = rapid.IntRange(1, 8).Draw(t, "seqs")
		cfg.MaxNumBatchedTokens = rapid.IntRange(8, 256).Draw(t, "budget")
		cfg.LongPrefillTokenThreshold = rapid.SampledFrom([]int{0, 0, 32}).Draw(t, "threshold")
		cfg.EnableKVEvents = rapid.Bool().Draw(t, "events")
		e, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		lives := map[RequestID]*life{}
		var now time.Duration
		nextID := RequestID(1)
		ops := rapid.IntRange(1, 80).Draw(t, "ops")
		for range ops {
			switch rapid.IntRange(0, 5).Draw(t, "op") {
			case 0, 1: // add a request sharing a prefix with others
				nseg := rapid.IntRange(1, 3).Draw(t, "nseg")
				prompt := make([]kvblock.Segment, nseg)
				for i := range prompt {
					prompt[i] = kvblock.Segment{ID: rapid.Uint64Range(1, 4).Draw(t, "seg"), Len: rapid.IntRange(1, 60).Draw(t, "len")}
				}
				out := rapid.IntRange(1, 40).Draw(t, "out")
				req := mkReq(nextID, cfg.BlockSize, prompt, out)
				if err := e.Add(now, req); err == nil {
					lives[nextID] = &life{out: out}
				} else if !errors.Is(err, ErrTooLarge) {
					t.Fatalf("add: %v", err)
				}
				nextID++
			case 2: // abort a live request
				for id, l := range lives {
					if !l.finished && !l.aborted {
						if err := e.Abort(now, id); err != nil {
							t.Fatalf("abort %d: %v", id, err)
						}
						l.aborted = true
						break
					}
				}
			default:
				if at, ok := e.NextStep(); ok {
					now = max(now, at)
					res := e.Step(now)
					if got := res.Batch.PrefillTokens + res.Batch.DecodeSeqs; got > int64(cfg.MaxNumBatchedTokens) {
						t.Fatalf("step used %d tokens > budget %d", got, cfg.MaxNumBatchedTokens)
					}
					for _, em := range res.Emitted {
						l := lives[em.ID]
						l.tokens++
						if em.Output != l.tokens || l.finished || l.aborted {
							t.Fatalf("request %d: emission %+v after %d tokens", em.ID, em, l.tokens)
						}
						if em.Finished {
							l.finished = true
						}
					}
					now = res.End()
				}
			}
			checkInvariants(t, e)
		}
		runToIdleRapid(t, e, now, lives)
		for id, l := range lives {
			if !l.aborted && (!l.finished || l.tokens != l.out) {
				t.Fatalf("request %d: finished %v with %d of %d tokens", id, l.finished, l.tokens, l.out)
			}
		}
		if m := e.Metrics(); m.UsedBlocks != 0 || e.Len() != 0 {
			t.Fatalf("idle engine holds %d blocks, %d requests", m.UsedBlocks, e.Len())
		}
		checkInvariants(t, e)
	})
}

type life struct {
	out      int
	tokens   int
	finished bool
	aborted  bool
}

func runToIdleRapid(t *rapid.T, e *Engine, now time.Duration, lives map[RequestID]*life) {
	for i := 0; ; i++ {
		at, ok := e.NextStep()
		if !ok {
			return
		}
		if i > 100_000 {
			t.Fatalf("engine did not drain: %+v", e.Metrics())
		}
		res := e.Step(max(now, at))
		for _, em := range res.Emitted {
			l := lives[em.ID]
			l.tokens++
			if em.Output != l.tokens {
				t.Fatalf("request %d: emission %+v after %d tokens", em.ID, em, l.tokens)
			}
			l.finished = l.finished || em.Finished
		}
		now = res.End()
		checkInvariants(t, e)
	}
}

var update = flag.Bool("update", false, "rewrite golden files in testdata/")

// TestGoldenSmallPool replays 30 overlapping requests through a 64-block
// engine (prefix hits, chunking and preemption) and compares every token's
// time with testdata/small_pool.golden; go test ./engine -update rewrites it.
func TestGoldenSmallPool(t *testing.T) {
	run := func() string {
		cfg := DefaultConfig()
		cfg.NumGPUBlocks = 64
		cfg.MaxNumBatchedTokens = 256
		e, _ := New(cfg)
		for i := range 30 {
			_ = e.Add(time.Duration(i)*5*time.Millisecond, mkReq(RequestID(i+1), 16, []kvblock.Segment{{ID: uint64(i % 3), Len: 100 + 7*i}}, 5+i))
		}
		var b strings.Builder
		for _, em := range runToIdle(t, e, 0) {
			fmt.Fprintf(&b, "%-12v id=%-3d out=%-3d cached=%-4d preempted=%d finished=%v\n", em.at, em.ID, em.Output, em.CachedTokens, em.Preemptions, em.Finished)
		}
		m := e.Metrics()
		fmt.Fprintf(&b, "preemptions=%d hits=%d queries=%d steps=%d busy=%v\n", m.Preemptions, m.PrefixCacheHits, m.PrefixCacheQueries, m.Steps, m.BusyTime)
		return b.String()
	}
	got := run()
	if again := run(); again != got {
		t.Fatal("same inputs gave different traces")
	}
	if !strings.Contains(got, "preempted=1") {
		t.Fatal("scenario no longer exercises preemption")
	}
	path := filepath.Join("testdata", "small_pool.golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./engine -update to create it)", err)
	}
	if got != string(want) {
		t.Fatalf("trace differs from %s; rerun with -update if the change is intended", path)
	}
}

// FuzzParseConfig: any profile text is either a valid configuration or a
// clear error, never a panic.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte("num_gpu_blocks: 100\nlatency:\n  step_fixed_ms: 5\n"))
	f.Add([]byte("block_size: [1]\n"))
	f.Add([]byte("latency: {prefill_token_us: -1}\n"))
	f.Add([]byte(""))
	f.Add([]byte("kv_tiers: {cpu_blocks: 100, cpu_link: pcie-gen5, disk_blocks: 1000, disk_link: nvme, host_memory_gb: 1}\n"))
	f.Add([]byte("pd_transfer: {bandwidth_gbps: 0}\nkv_bytes_per_token: 1e300\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("ParseConfig returned an invalid config: %v", err)
		}
		if c.NumGPUBlocks > 1<<16 {
			return // valid, but too large to allocate on every fuzz input
		}
		if _, err := New(c); err != nil {
			t.Fatalf("valid config refused by New: %v", err)
		}
	})
}
