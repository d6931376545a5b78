package engine

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
	"go.yaml.in/yaml/v3"
	"pgregory.net/rapid"
)

type fataler interface {
	Fatalf(format string, args ...any)
}

// tierHashes lists a tier's hashes, least recently used first.
func tierHashes(tr *tier) []kvblock.Hash {
	var hs []kvblock.Hash
	if tr != nil {
		tr.each(func(h kvblock.Hash) { hs = append(hs, h) })
	}
	return hs
}

// checkTiers verifies the lower tiers and the loads in flight: each tier's
// list, index and free entries agree and stay within its capacity, no hash
// is in both tiers, and every loading request is waiting with a load.
func checkTiers(t fataler, e *Engine) {
	p := e.pool
	if p.cpu == nil && (p.disk != nil || len(e.loads) > 0 || e.nloading != 0) {
		t.Fatalf("no CPU tier, yet disk %v, %d loads, %d loading", p.disk != nil, len(e.loads), e.nloading)
	}
	inCPU := map[kvblock.Hash]bool{}
	for _, tr := range []*tier{p.cpu, p.disk} {
		if tr == nil {
			continue
		}
		n := 0
		prev := nilBlock
		for id := tr.head; id != nilBlock; id = tr.links[id].next {
			nd := tr.links[id]
			if nd.prev != prev {
				t.Fatalf("%s tier: entry %d links back to %d, not %d", tr.medium, id, nd.prev, prev)
			}
			if got, ok := tr.get(tr.nodes[id].hash); !ok || got != id {
				t.Fatalf("%s tier: entry %d (%v) not findable", tr.medium, id, tr.nodes[id].hash)
			}
			if tr == p.cpu {
				inCPU[tr.nodes[id].hash] = true
			} else if inCPU[tr.nodes[id].hash] {
				t.Fatalf("hash %v in both the CPU and the disk tier", tr.nodes[id].hash)
			}
			prev = id
			n++
		}
		if prev != tr.tail {
			t.Fatalf("%s tier: list ends at %d, tail %d", tr.medium, prev, tr.tail)
		}
		if n != tr.len() || n > tr.cap || n+len(tr.free) != len(tr.nodes) {
			t.Fatalf("%s tier: %d listed, index %d, cap %d, %d free of %d entries", tr.medium, n, tr.len(), tr.cap, len(tr.free), len(tr.nodes))
		}
	}
	if m := e.Metrics(); m.CPUBlocks != len(inCPU) || (p.disk != nil && m.DiskBlocks != p.disk.len()) {
		t.Fatalf("tier gauges %d/%d", m.CPUBlocks, m.DiskBlocks)
	}
	loading := 0
	for _, s := range e.seqs {
		if s.loading {
			loading++
			if s.state != stateWaiting || !slices.ContainsFunc(e.loads, func(l load) bool { return l.s == s && !l.aborted }) {
				t.Fatalf("request %d loading, state %v, not among the loads", s.id, s.state)
			}
		}
	}
	if loading != e.nloading {
		t.Fatalf("%d requests loading, counter %d", loading, e.nloading)
	}
	for _, l := range e.loads {
		if live := e.seqs[l.s.id] == l.s; live == l.aborted {
			t.Fatalf("load of request %d: aborted %v, still in the engine %v", l.s.id, l.aborted, live)
		}
		if len(l.s.blocks) <= l.s.numStored {
			t.Fatalf("load of request %d holds %d blocks, %d hit", l.s.id, len(l.s.blocks), l.s.numStored)
		}
	}
}

// media replays KV events per medium and compares them with the caches.
type media map[string]map[kvblock.Hash]bool

func (m media) apply(t fataler, evs []KVEvent) {
	for _, ev := range evs {
		set := m[ev.Medium]
		if set == nil {
			set = map[kvblock.Hash]bool{}
			m[ev.Medium] = set
		}
		switch ev.Kind {
		case BlockStored:
			for _, h := range ev.BlockHashes {
				if set[h] {
					t.Fatalf("%s: hash %v stored twice", ev.Medium, h)
				}
				set[h] = true
			}
		case BlockRemoved:
			for _, h := range ev.BlockHashes {
				if !set[h] {
					t.Fatalf("%s: hash %v removed, not stored", ev.Medium, h)
				}
				delete(set, h)
			}
		case AllBlocksCleared:
			clear(set)
		}
	}
}

func (m media) check(t fataler, e *Engine) {
	want := map[string][]kvblock.Hash{MediumCPU: tierHashes(e.pool.cpu), MediumDisk: tierHashes(e.pool.disk)}
	e.pool.eachCached(func(h kvblock.Hash, _ int32) { want[MediumGPU] = append(want[MediumGPU], h) })
	for medium, hs := range want {
		if len(hs) != len(m[medium]) {
			t.Fatalf("%s holds %d hashes, its events say %d", medium, len(hs), len(m[medium]))
		}
		for _, h := range hs {
			if !m[medium][h] {
				t.Fatalf("%s holds %v, never reported", medium, h)
			}
		}
	}
}

// tierConfig is the default engine with 16 GPU blocks and a CPU tier.
func tierConfig(cpu, disk int) Config {
	cfg := DefaultConfig()
	cfg.NumGPUBlocks = 16
	cfg.EnableKVEvents = true
	cfg.KVTiers = KVTiers{CPUBlocks: cpu, CPULink: "pcie-gen4", DiskBlocks: disk}
	if disk > 0 {
		cfg.KVTiers.DiskLink = "nvme"
	}
	return cfg
}

// offloadA runs prompt A (176 tokens, 11 full blocks), then prompt B (255
// tokens), which needs all 16 GPU blocks: A's 11 cached blocks are evicted
// to the lower tiers, tail first (A freed its blocks tail first).
func offloadA(t *testing.T, e *Engine, m media) (aHashes []kvblock.Hash) {
	t.Helper()
	a := mkReq(1, 16, []kvblock.Segment{{ID: 1, Len: 176}}, 1)
	if err := e.Add(0, a); err != nil {
		t.Fatal(err)
	}
	drain(t, e, 0, m)
	if err := e.Add(time.Second, mkReq(2, 16, []kvblock.Segment{{ID: 2, Len: 255}}, 1)); err != nil {
		t.Fatal(err)
	}
	drain(t, e, time.Second, m)
	return a.BlockHashes[:11]
}

// drain steps e until idle, replaying its events into m (when not nil),
// and returns the emissions with their times.
func drain(t *testing.T, e *Engine, from time.Duration, m media) []emitted {
	t.Helper()
	var out []emitted
	now := from
	for i := 0; ; i++ {
		at, ok := e.NextStep()
		if !ok {
			return out
		}
		if i > 100_000 {
			t.Fatal("engine did not drain")
		}
		res := e.Step(max(now, at))
		if m != nil {
			m.apply(t, res.Events)
			m.check(t, e)
		}
		checkTiers(t, e)
		for _, em := range res.Emitted {
			out = append(out, emitted{res.End(), em})
		}
		now = res.End()
	}
}

func TestTierOffloadOnEviction(t *testing.T) {
	e, err := New(tierConfig(64, 0))
	if err != nil {
		t.Fatal(err)
	}
	m := media{}
	a := offloadA(t, e, m)
	// B evicted A's blocks in the order A freed them: tail first.
	want := slices.Clone(a)
	slices.Reverse(want)
	if got := tierHashes(e.pool.cpu); !slices.Equal(got, want) {
		t.Fatalf("CPU tier %v, want A's blocks tail first %v", got, want)
	}
	if mt := e.Metrics(); mt.CPUBlocks != 11 || mt.DiskBlocks != 0 || mt.CachedBlocks != 15 {
		t.Fatalf("metrics %+v", mt)
	}
	if ok, evs := e.ResetPrefixCache(); !ok || len(evs) != 2 || evs[1].Kind != AllBlocksCleared || evs[1].Medium != MediumCPU {
		t.Fatalf("reset: %v %+v", ok, evs)
	}
	if e.pool.cpu.len() != 0 || e.Metrics().CPUBlocks != 0 {
		t.Fatal("reset left the CPU tier full")
	}
}

// A prompt whose blocks were all offloaded loads 10 of them back (the
// eleventh holds the last token, which is recomputed): 10 blocks x 16
// tokens x 131,072 bytes / 25 GB/s = 838,860.8 ns, then a 16-token prefill
// after 160 cached tokens.
func TestTierLoadHandComputed(t *testing.T) {
	cfg := tierConfig(64, 0)
	e, _ := New(cfg)
	m := media{}
	a := offloadA(t, e, m)
	before := e.Metrics()
	at := 2 * time.Second
	if err := e.Add(at, mkReq(3, 16, []kvblock.Segment{{ID: 1, Len: 176}}, 2)); err != nil {
		t.Fatal(err)
	}
	res := e.Step(at)
	if res.Scheduled != 0 || len(res.Admitted) != 0 || len(res.Emitted) != 0 {
		t.Fatalf("a loading request was scheduled: %+v", res)
	}
	m.apply(t, res.Events)
	load := 838861 * time.Nanosecond
	if got := cfg.TierLoadTime(10, 0); got != load {
		t.Fatalf("TierLoadTime(10, 0) = %v, want %v", got, load)
	}
	if next, ok := e.NextStep(); !ok || next != at+load {
		t.Fatalf("NextStep %v %v, want the load's end %v", next, ok, at+load)
	}
	if mt := e.Metrics(); mt.UsedBlocks != 10 || mt.Waiting != 1 || mt.Running != 0 {
		t.Fatalf("loading request: %+v", mt)
	}
	// The load ends: the 10 blocks enter the GPU cache and the request
	// prefills its last block.
	res = e.Step(at + load)
	stored := 0
	for _, ev := range res.Events {
		if ev.Kind == BlockStored && ev.Medium == MediumGPU {
			if stored == 0 && !slices.Equal(ev.BlockHashes, a[:10]) {
				t.Fatalf("loaded blocks stored as %v, want %v", ev.BlockHashes, a[:10])
			}
			stored += len(ev.BlockHashes)
		}
	}
	if stored != 11 { // the 10 loaded, then the one it computed
		t.Fatalf("%d GPU blocks stored, want 11: %+v", stored, res.Events)
	}
	m.apply(t, res.Events)
	m.check(t, e)
	if len(res.Admitted) != 1 || res.Batch.PrefillTokens != 16 || len(res.Emitted) != 1 {
		t.Fatalf("step after the load: %+v", res)
	}
	first := at + load + cfg.Latency.PrefillTime(16, 160)
	if got := res.End(); got != first {
		t.Fatalf("first token at %v, want %v (load %v + prefill %v)", got, first, load, cfg.Latency.PrefillTime(16, 160))
	}
	em := res.Emitted[0]
	mt := e.Metrics()
	if em.CachedTokens != 160 || mt.CPUHitTokens != 160 || mt.DiskHitTokens != 0 || mt.KVLoadTime != load || mt.KVLoads != 1 {
		t.Fatalf("cached %d, metrics %+v", em.CachedTokens, mt)
	}
	if mt.PrefixCacheHits != before.PrefixCacheHits || mt.PrefixCacheQueries != before.PrefixCacheQueries+176 {
		t.Fatalf("GPU hits %d->%d, queries %d->%d: the loaded blocks are not GPU hits", before.PrefixCacheHits, mt.PrefixCacheHits, before.PrefixCacheQueries, mt.PrefixCacheQueries)
	}
	drain(t, e, res.End(), m)
	// The CPU copies stayed after the load.
	for _, h := range a[:10] {
		if _, ok := e.pool.cpu.get(h); !ok {
			t.Fatalf("loaded hash %v left the CPU tier", h)
		}
	}
}

// With a 4-block CPU tier, A's first four blocks (evicted last) stay in
// CPU and the other seven go on to disk: the load takes 4 blocks at 25
// GB/s and 6 at 6 GB/s, 335,544.32 + 2,097,152 ns.
func TestTierDiskPath(t *testing.T) {
	cfg := tierConfig(4, 64)
	e, _ := New(cfg)
	m := media{}
	a := offloadA(t, e, m)
	if got, want := tierHashes(e.pool.cpu), []kvblock.Hash{a[3], a[2], a[1], a[0]}; !slices.Equal(got, want) {
		t.Fatalf("CPU tier %v, want %v", got, want)
	}
	if got := tierHashes(e.pool.disk); len(got) != 7 || got[0] != a[10] || got[6] != a[4] {
		t.Fatalf("disk tier %v, want A's blocks 10 down to 4", got)
	}
	if mt := e.Metrics(); mt.CPUBlocks != 4 || mt.DiskBlocks != 7 {
		t.Fatalf("tier gauges %d, %d", mt.CPUBlocks, mt.DiskBlocks)
	}
	at := 2 * time.Second
	if err := e.Add(at, mkReq(3, 16, []kvblock.Segment{{ID: 1, Len: 176}}, 1)); err != nil {
		t.Fatal(err)
	}
	load := 2432696 * time.Nanosecond
	if got := cfg.TierLoadTime(4, 6); got != load {
		t.Fatalf("TierLoadTime(4, 6) = %v, want %v", got, load)
	}
	got := drain(t, e, at, m)
	if len(got) != 1 || got[0].at != at+load+cfg.Latency.PrefillTime(16, 160) || got[0].CachedTokens != 160 {
		t.Fatalf("emissions %+v, want one at %v with 160 cached", got, at+load+cfg.Latency.PrefillTime(16, 160))
	}
	if mt := e.Metrics(); mt.CPUHitTokens != 64 || mt.DiskHitTokens != 96 || mt.KVLoadTime != load {
		t.Fatalf("metrics %+v", mt)
	}
}

// The events of an eviction cascade name their media: B's allocation
// evicts A's blocks from the GPU into the CPU tier, whose oldest move on to
// disk.
func TestTierEventsMedia(t *testing.T) {
	e, _ := New(tierConfig(4, 64))
	m := media{}
	if err := e.Add(0, mkReq(1, 16, []kvblock.Segment{{ID: 1, Len: 176}}, 1)); err != nil {
		t.Fatal(err)
	}
	drain(t, e, 0, m)
	if err := e.Add(time.Second, mkReq(2, 16, []kvblock.Segment{{ID: 2, Len: 255}}, 1)); err != nil {
		t.Fatal(err)
	}
	res := e.Step(time.Second)
	count := map[string][2]int{}
	for _, ev := range res.Events {
		c := count[ev.Medium]
		switch ev.Kind {
		case BlockStored:
			c[0] += len(ev.BlockHashes)
			if ev.BlockSize != 16 {
				t.Fatalf("stored event without block size: %+v", ev)
			}
		case BlockRemoved:
			c[1] += len(ev.BlockHashes)
		}
		count[ev.Medium] = c
	}
	want := map[string][2]int{
		MediumGPU:  {15, 11}, // B's 15 full blocks stored, A's 11 evicted
		MediumCPU:  {11, 7},  // all 11 offloaded, 7 pushed on
		MediumDisk: {7, 0},
	}
	for medium, w := range want {
		if count[medium] != w {
			t.Errorf("%s: stored/removed %v, want %v (events %+v)", medium, count[medium], w, res.Events)
		}
	}
	// Each hash's own events come in order: removed from the GPU before it
	// is stored in CPU, removed from CPU before it is stored on disk.
	m.apply(t, res.Events)
	m.check(t, e)
}

// A request loading from a tier does not hold up the queue: the request
// behind it is scheduled in the step that starts the load.
func TestTierLoadingSkippedInQueue(t *testing.T) {
	e, _ := New(tierConfig(64, 0))
	offloadA(t, e, nil)
	at := 2 * time.Second
	_ = e.Add(at, mkReq(3, 16, []kvblock.Segment{{ID: 1, Len: 176}}, 1))
	_ = e.Add(at, mkReq(4, 16, []kvblock.Segment{{ID: 9, Len: 20}}, 1))
	res := e.Step(at)
	if res.Scheduled != 1 || !slices.Equal(res.Admitted, []RequestID{4}) {
		t.Fatalf("step with a loading request first: scheduled %d, admitted %v", res.Scheduled, res.Admitted)
	}
	if res.Batch.PrefillTokens != 20 {
		t.Fatalf("the loading request took budget: %+v", res.Batch)
	}
	if next, _ := e.NextStep(); next != res.End() {
		t.Fatalf("NextStep %v, want the step's end %v", next, res.End())
	}
	got := drain(t, e, res.End(), nil)
	if len(got) != 1 || got[0].ID != 3 || got[0].CachedTokens != 160 {
		t.Fatalf("loading request's emissions: %+v", got)
	}
}

// An aborted loading request leaves at once, but its blocks are being
// written until the load ends: they stay in use until then, and are freed
// without entering the GPU cache.
func TestTierAbortWhileLoading(t *testing.T) {
	cfg := tierConfig(64, 0)
	e, _ := New(cfg)
	m := media{}
	offloadA(t, e, m)
	at := 2 * time.Second
	_ = e.Add(at, mkReq(3, 16, []kvblock.Segment{{ID: 1, Len: 176}}, 1))
	res := e.Step(at)
	m.apply(t, res.Events)
	cached := e.Metrics().CachedBlocks
	if err := e.Abort(at+time.Microsecond, 3); err != nil {
		t.Fatal(err)
	}
	mt := e.Metrics()
	if e.Len() != 0 || mt.Waiting != 0 || mt.RequestsAborted != 1 || mt.UsedBlocks != 10 {
		t.Fatalf("after abort: len %d, %+v", e.Len(), mt)
	}
	if ok, _ := e.ResetPrefixCache(); ok {
		t.Fatal("reset while a load writes blocks")
	}
	if err := e.Abort(at, 3); !errors.Is(err, ErrUnknownID) {
		t.Fatalf("second abort: %v", err)
	}
	next, ok := e.NextStep()
	if !ok || next != at+cfg.TierLoadTime(10, 0) {
		t.Fatalf("NextStep %v %v, want the load's end", next, ok)
	}
	res = e.Step(next)
	m.apply(t, res.Events)
	m.check(t, e)
	checkTiers(t, e)
	for _, ev := range res.Events {
		if ev.Kind == BlockStored {
			t.Fatalf("an aborted load stored blocks: %+v", ev)
		}
	}
	if mt := e.Metrics(); mt.UsedBlocks != 0 || mt.CachedBlocks != cached {
		t.Fatalf("after the load: %+v (cached before %d)", mt, cached)
	}
	if _, ok := e.NextStep(); ok {
		t.Fatal("idle engine wants to step")
	}
	if ok, _ := e.ResetPrefixCache(); !ok {
		t.Fatal("reset failed on an idle engine")
	}
}

// A remote-prefill request's prompt arrives computed: one step of one
// token emits its first token, its full blocks are cached at admission,
// and a second one with the same prompt reuses them locally.
func TestRemotePrefill(t *testing.T) {
	cfg := DefaultConfig()
	cfg.EnableKVEvents = true
	e, _ := New(cfg)
	req := mkReq(1, 16, []kvblock.Segment{{ID: 5, Len: 1000}}, 3)
	req.RemotePrefill = true
	if err := e.Add(0, req); err != nil {
		t.Fatal(err)
	}
	res := e.Step(0)
	want := Batch{PrefillTokens: 1, PrefillPairs: 999.5}
	if res.Batch != want || len(res.Emitted) != 1 || res.Emitted[0].Output != 1 || res.Emitted[0].CachedTokens != 0 {
		t.Fatalf("first step: batch %+v, emitted %+v", res.Batch, res.Emitted)
	}
	if res.Duration != cfg.Latency.StepTime(want) || !slices.Equal(res.Admitted, []RequestID{1}) {
		t.Fatalf("first step took %v, admitted %v", res.Duration, res.Admitted)
	}
	stored := 0
	for _, ev := range res.Events {
		if ev.Kind == BlockStored && ev.Medium == MediumGPU {
			stored += len(ev.BlockHashes)
		}
	}
	// 999 computed tokens fill 62 blocks; the 63rd holds the last 8.
	if stored != 62 || e.Metrics().UsedBlocks != 63 {
		t.Fatalf("%d blocks stored, %d used; want 62, 63", stored, e.Metrics().UsedBlocks)
	}
	if mt := e.Metrics(); mt.RemoteKVTokens != 1000 || mt.PrefixCacheHits != 0 || mt.PrefixCacheQueries != 1000 {
		t.Fatalf("metrics %+v", mt)
	}
	got := drain(t, e, res.End(), nil)
	if len(got) != 2 || got[1].Output != 3 || !got[1].Finished {
		t.Fatalf("decode: %+v", got)
	}
	// The same prompt again, remote: 62 blocks are cached locally.
	req2 := mkReq(2, 16, []kvblock.Segment{{ID: 5, Len: 1000}}, 1)
	req2.RemotePrefill = true
	_ = e.Add(time.Second, req2)
	got = drain(t, e, time.Second, nil)
	if len(got) != 1 || got[0].CachedTokens != 992 {
		t.Fatalf("second remote request: %+v", got)
	}
	if mt := e.Metrics(); mt.RemoteKVTokens != 1008 || mt.PrefixCacheHits != 992 {
		t.Fatalf("metrics %+v", mt)
	}
	// And a local request finds the remote prompt's blocks.
	_ = e.Add(2*time.Second, mkReq(3, 16, []kvblock.Segment{{ID: 5, Len: 1000}}, 1))
	if got = drain(t, e, 2*time.Second, nil); got[0].CachedTokens != 992 {
		t.Fatalf("local request after remote: %+v", got)
	}
}

// Remote-prefill requests obey max_num_seqs and the token budget: with one
// slot the second waits for the first to finish.
func TestRemotePrefillLimits(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxNumSeqs = 1
	e, _ := New(cfg)
	for id := RequestID(1); id <= 2; id++ {
		r := mkReq(id, 16, []kvblock.Segment{{ID: uint64(id), Len: 500}}, 2)
		r.RemotePrefill = true
		_ = e.Add(0, r)
	}
	res := e.Step(0)
	if res.Scheduled != 1 || res.Batch.PrefillTokens != 1 {
		t.Fatalf("step 1: %+v", res)
	}
	cfg.MaxNumSeqs = 4
	cfg.MaxNumBatchedTokens = 1
	e, _ = New(cfg)
	for id := RequestID(1); id <= 2; id++ {
		r := mkReq(id, 16, []kvblock.Segment{{ID: uint64(id), Len: 500}}, 2)
		r.RemotePrefill = true
		_ = e.Add(0, r)
	}
	if res := e.Step(0); res.Scheduled != 1 {
		t.Fatalf("a budget of one token scheduled %d", res.Scheduled)
	}
}

func TestTransferTime(t *testing.T) {
	cfg := DefaultConfig()
	for _, tc := range []struct {
		tokens int
		want   time.Duration
	}{
		{0, 50000},              // the base latency, 0.05 ms
		{1000, 50000 + 5242880}, // 1000 x 131072 bytes / 25 GB/s
		{3, 65729},              // 393216 / 25 = 15728.64 ns, rounded
	} {
		if got := cfg.TransferTime(tc.tokens); got != tc.want {
			t.Errorf("TransferTime(%d) = %v, want %v", tc.tokens, got, tc.want)
		}
	}
	var zero Config
	zero.KVBytesPerToken = 131072
	if got := zero.TransferTime(1000); got != cfg.TransferTime(1000) {
		t.Errorf("a zero pd_transfer section should mean the defaults: %v", got)
	}
	huge := cfg
	huge.PDTransfer.BandwidthGBps = 1e-300
	if got := huge.TransferTime(1000); got != time.Duration(math.MaxInt64) {
		t.Errorf("a transfer over an absurd bandwidth: %v, want the largest Duration", got)
	}
	if got := cfg.KVBytes(16); got != 16*131072 {
		t.Errorf("KVBytes(16) = %v", got)
	}
}

func TestTierConfigValidation(t *testing.T) {
	for _, bad := range []struct{ yaml, mention string }{
		{"pd_transfer:\n  bandwidth_gbps: 0\n", "pd_transfer.bandwidth_gbps: must be positive"},
		{"pd_transfer: {bandwidth_gbps: 0, base_latency_ms: 0}\n", "pd_transfer.bandwidth_gbps: must be positive"},
		{"pd_transfer: {bandwidth_gbps: -2}\n", "pd_transfer.bandwidth_gbps"},
		{"pd_transfer: {base_latency_ms: -1}\n", "pd_transfer.base_latency_ms"},
		{"kv_tiers: {disk_blocks: 10, disk_link: nvme}\n", "kv_tiers.disk_blocks: a disk tier needs a CPU tier"},
		{"kv_tiers: {cpu_blocks: 100}\n", "kv_tiers.cpu_bandwidth_gbps: must be positive when cpu_blocks is set"},
		{"kv_tiers: {cpu_blocks: 100, cpu_link: pcie-gen4, disk_blocks: 100}\n", "kv_tiers.disk_bandwidth_gbps: must be positive when disk_blocks is set"},
		{"kv_tiers: {cpu_blocks: 100000, cpu_link: pcie-gen5, host_memory_gb: 128}\n", "kv_tiers.cpu_blocks: 100000 blocks x 16 tokens x 131072 bytes per token = 209.7 GB do not fit in kv_tiers.host_memory_gb 128 GB; at most 61035 blocks fit"},
		{"kv_tiers: {cpu_blocks: 10, cpu_link: pcie-gen9}\n", `kv_tiers.cpu_link: unknown link "pcie-gen9", want one of pcie-gen5 (50 GB/s), pcie-gen4 (25 GB/s)`},
		{"kv_tiers: {cpu_blocks: 10, cpu_link: nvme}\n", "kv_tiers.cpu_link: unknown link \"nvme\""},
		{"kv_tiers: {cpu_blocks: 10, cpu_link: pcie-gen4, disk_blocks: 10, disk_link: sata}\n", "nvme (6 GB/s)"},
		{"kv_tiers: {cpu_blocks: -1}\n", "kv_tiers.cpu_blocks: must be 0 (off)"},
		{"kv_tiers: {cpu_blocks: 10, cpu_bandwidth_gbps: .nan}\n", "kv_tiers.cpu_bandwidth_gbps: must be a finite number"},
		{"kv_tiers: {cpu_blocks: 10, cpu_bandwidth_gbps: -5}\n", "kv_tiers.cpu_bandwidth_gbps: must be zero or positive"},
		{"kv_tiers: {cpu_blocks: 10, cpu_link: pcie-gen4, host_memory_gb: -1}\n", "kv_tiers.host_memory_gb"},
		{"kv_bytes_per_token: -1\n", "kv_bytes_per_token: must be zero or positive"},
		{"kv_bytes_per_token: 1e12\n", "kv_bytes_per_token: must be at most"},
		{"kv_bytes_per_token: 0\nkv_tiers: {cpu_blocks: 10, cpu_link: pcie-gen4}\n", "kv_bytes_per_token: must be positive when kv_tiers.cpu_blocks is set"},
		{"disable_prefix_caching: true\nkv_tiers: {cpu_blocks: 10, cpu_link: pcie-gen4}\n", "kv_tiers.cpu_blocks: a KV tier holds evicted prefix-cache blocks"},
		{"kv_tiers: {cpu_block: 10}\n", "cpu_block"},
	} {
		_, err := ParseConfig([]byte(bad.yaml))
		if err == nil || !strings.Contains(err.Error(), bad.mention) {
			t.Errorf("%q: error %v should mention %q", bad.yaml, err, bad.mention)
		}
	}
	// A Go-built configuration: the zero section means the defaults, a
	// bandwidth of zero beside a latency is an error.
	c := DefaultConfig()
	c.PDTransfer = PDTransfer{}
	if err := c.Validate(); err != nil {
		t.Errorf("zero pd_transfer: %v", err)
	}
	c.PDTransfer = PDTransfer{BaseLatencyMs: 1}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "pd_transfer.bandwidth_gbps") {
		t.Errorf("zero bandwidth with a latency: %v", err)
	}

	good := "kv_tiers:\n  cpu_blocks: 1000\n  cpu_link: pcie-gen5\n  disk_blocks: 10000\n  disk_link: nvme\n  host_memory_gb: 64\npd_transfer:\n  bandwidth_gbps: 50\n"
	c, err := ParseConfig([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if c.KVTiers.CPUBandwidth() != 50 || c.KVTiers.DiskBandwidth() != 6 || c.PDTransfer != (PDTransfer{BandwidthGBps: 50, BaseLatencyMs: 0.05}) || c.KVBytesPerToken != 131072 {
		t.Fatalf("parsed %+v", c)
	}
	if got := (KVTiers{CPUBlocks: 1, DiskBlocks: 1, DiskLink: "pcie-gen4"}).WithLinks("pcie-gen5", "nvme"); got.CPULink != "pcie-gen5" || got.DiskLink != "pcie-gen4" {
		t.Fatalf("WithLinks: %+v", got)
	}
	if got := (KVTiers{CPUBandwidthGBps: 9}).WithLinks("pcie-gen5", "nvme"); got != (KVTiers{CPUBandwidthGBps: 9}) {
		t.Fatalf("WithLinks on tiers that are off: %+v", got)
	}
	if got := (KVTiers{CPUBlocks: 1, CPUBandwidthGBps: 9}).WithLinks("pcie-gen5", ""); got.CPULink != "" {
		t.Fatalf("WithLinks over an explicit bandwidth: %+v", got)
	}
	c.KVTiers.CPUBandwidthGBps = 40 // an explicit bandwidth wins over the link
	if c.KVTiers.CPUBandwidth() != 40 {
		t.Fatalf("explicit bandwidth ignored: %v", c.KVTiers.CPUBandwidth())
	}
	// The YAML form reads back as the same configuration, and a profile
	// without tiers writes none.
	b, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseConfig(b)
	if err != nil || back != c {
		t.Fatalf("round trip: %+v, %v\n%s", back, err, b)
	}
	b, _ = yaml.Marshal(DefaultConfig())
	if strings.Contains(string(b), "kv_tiers") || !strings.Contains(string(b), "kv_bytes_per_token: 131072") {
		t.Fatalf("default profile:\n%s", b)
	}
	if back, err := ParseConfig(b); err != nil || back != DefaultConfig() {
		t.Fatalf("default round trip: %+v, %v", back, err)
	}
}

// Under random traffic with tiers on (prompts sharing prefixes, aborts,
// remote prefills, a pool small enough to preempt), after every operation:
// GPU blocks are conserved and referenced by their holders, each tier
// stays within its capacity and no hash is in two lower tiers, the KV
// events of each medium describe its content, a step that schedules
// nothing is never repeated at the same time, and every request ends with
// all its tokens in order.
func TestTierInvariants(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := DefaultConfig()
		cfg.BlockSize = rapid.SampledFrom([]int{4, 16}).Draw(t, "bs")
		cfg.NumGPUBlocks = rapid.IntRange(8, 60).Draw(t, "blocks")
		cfg.MaxNumSeqs = rapid.IntRange(1, 8).Draw(t, "seqs")
		cfg.MaxNumBatchedTokens = rapid.IntRange(8, 256).Draw(t, "budget")
		cfg.LongPrefillTokenThreshold = rapid.SampledFrom([]int{0, 0, 32}).Draw(t, "threshold")
		cfg.EnableKVEvents = rapid.Bool().Draw(t, "events")
		// Large KV makes loads last several steps.
		cfg.KVBytesPerToken = rapid.SampledFrom([]float64{131072, 4e6, 1e8}).Draw(t, "kvbytes")
		cfg.KVTiers = KVTiers{
			CPUBlocks:  rapid.IntRange(1, 24).Draw(t, "cpu"),
			CPULink:    rapid.SampledFrom([]string{"pcie-gen4", "pcie-gen5"}).Draw(t, "link"),
			DiskBlocks: rapid.SampledFrom([]int{0, 0, 1, 8, 40}).Draw(t, "disk"),
			DiskLink:   "nvme",
		}
		e, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		m := media{}
		type req struct {
			life
			remote bool
			prompt int
		}
		lives := map[RequestID]*req{}
		var ids []RequestID
		var now, emptyAt time.Duration
		emptyAt = -1
		next := RequestID(1)
		onStep := func(res *Result) {
			if got := res.Batch.PrefillTokens + res.Batch.DecodeSeqs; got > int64(cfg.MaxNumBatchedTokens) {
				t.Fatalf("step used %d tokens > budget %d", got, cfg.MaxNumBatchedTokens)
			}
			if res.Scheduled == 0 {
				if res.Start == emptyAt {
					t.Fatalf("a second empty step at %v: the engine spins (%+v)", res.Start, e.Metrics())
				}
				emptyAt = res.Start
			} else {
				emptyAt = -1
			}
			if cfg.EnableKVEvents {
				m.apply(t, res.Events)
			}
			for _, id := range res.Admitted {
				l := lives[id]
				if l.remote && !slices.ContainsFunc(res.Emitted, func(em Emission) bool { return em.ID == id }) {
					t.Fatalf("remote-prefill request %d admitted without its first token", id)
				}
			}
			for _, em := range res.Emitted {
				l := lives[em.ID]
				l.tokens++
				if em.Output != l.tokens || l.finished || l.aborted || em.CachedTokens > l.prompt || em.CachedTokens < 0 {
					t.Fatalf("request %d: emission %+v after %d tokens", em.ID, em, l.tokens)
				}
				l.finished = em.Finished
			}
			now = res.End()
		}
		for range rapid.IntRange(1, 100).Draw(t, "ops") {
			switch rapid.IntRange(0, 7).Draw(t, "op") {
			case 0, 1, 2:
				nseg := rapid.IntRange(1, 3).Draw(t, "nseg")
				prompt := make([]kvblock.Segment, nseg)
				for i := range prompt {
					prompt[i] = kvblock.Segment{ID: rapid.Uint64Range(1, 4).Draw(t, "seg"), Len: rapid.IntRange(1, 60).Draw(t, "len")}
				}
				out := rapid.IntRange(1, 40).Draw(t, "out")
				r := mkReq(next, cfg.BlockSize, prompt, out)
				r.RemotePrefill = rapid.IntRange(0, 4).Draw(t, "remote") == 0
				if err := e.Add(now, r); err == nil {
					lives[next] = &req{life: life{out: out}, remote: r.RemotePrefill, prompt: r.PromptTokens}
					ids = append(ids, next)
				} else if !errors.Is(err, ErrTooLarge) {
					t.Fatalf("add: %v", err)
				}
				next++
				emptyAt = -1
			case 3: // abort a live request, loading ones included
				var live []RequestID
				for _, id := range ids {
					if l := lives[id]; !l.finished && !l.aborted {
						live = append(live, id)
					}
				}
				if len(live) == 0 {
					continue
				}
				id := rapid.SampledFrom(live).Draw(t, "abort")
				if err := e.Abort(now, id); err != nil {
					t.Fatalf("abort %d: %v", id, err)
				}
				lives[id].aborted = true
				emptyAt = -1
			case 4:
				if ok, evs := e.ResetPrefixCache(); ok && cfg.EnableKVEvents {
					m.apply(t, evs)
				}
			case 5:
				now += time.Duration(rapid.IntRange(0, 50).Draw(t, "wait")) * time.Millisecond
			default:
				if at, ok := e.NextStep(); ok {
					onStep(e.Step(max(now, at)))
				}
			}
			checkInvariants(t, e)
			if cfg.EnableKVEvents {
				m.check(t, e)
			}
		}
		for i := 0; ; i++ {
			at, ok := e.NextStep()
			if !ok {
				break
			}
			if i > 100_000 {
				t.Fatalf("engine did not drain: %+v", e.Metrics())
			}
			onStep(e.Step(max(now, at)))
			checkInvariants(t, e)
			if cfg.EnableKVEvents {
				m.check(t, e)
			}
		}
		for _, id := range ids {
			if l := lives[id]; !l.aborted && (!l.finished || l.tokens != l.out) {
				t.Fatalf("request %d: finished %v with %d of %d tokens", id, l.finished, l.tokens, l.out)
			}
		}
		if mt := e.Metrics(); mt.UsedBlocks != 0 || e.Len() != 0 || len(e.loads) != 0 {
			t.Fatalf("idle engine holds %d blocks, %d requests, %d loads", mt.UsedBlocks, e.Len(), len(e.loads))
		}
	})
}

// A group of ranks with tiers reports each medium's hashes once per group:
// its holder counts per medium are the ranks' contents, and its events
// replay to their union.
func TestGroupTierEvents(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := DefaultConfig()
		cfg.DataParallelSize = rapid.IntRange(2, 3).Draw(t, "ranks")
		cfg.ExpertParallel = rapid.Bool().Draw(t, "ep")
		cfg.BlockSize = 4
		cfg.NumGPUBlocks = rapid.IntRange(12, 40).Draw(t, "blocks")
		cfg.MaxNumSeqs = rapid.IntRange(1, 6).Draw(t, "seqs")
		cfg.MaxNumBatchedTokens = rapid.IntRange(8, 128).Draw(t, "budget")
		cfg.EnableKVEvents = true
		cfg.KVBytesPerToken = rapid.SampledFrom([]float64{131072, 1e8}).Draw(t, "kvbytes")
		cfg.KVTiers = KVTiers{CPUBlocks: rapid.IntRange(1, 12).Draw(t, "cpu"), CPULink: "pcie-gen5", DiskBlocks: rapid.SampledFrom([]int{0, 6}).Draw(t, "disk"), DiskLink: "nvme"}
		g, err := NewGroup(cfg)
		if err != nil {
			t.Fatal(err)
		}
		union := media{}
		check := func() {
			for _, medium := range []string{MediumGPU, MediumCPU, MediumDisk} {
				counts := map[kvblock.Hash]int32{}
				for r := range g.Ranks() {
					e := g.Rank(r)
					switch medium {
					case MediumGPU:
						e.pool.eachCached(func(h kvblock.Hash, _ int32) { counts[h]++ })
					case MediumCPU:
						for _, h := range tierHashes(e.pool.cpu) {
							counts[h]++
						}
					case MediumDisk:
						for _, h := range tierHashes(e.pool.disk) {
							counts[h]++
						}
					}
					checkTiers(t, e)
				}
				held := g.holders(medium)
				if len(counts) != len(held) || len(counts) != len(union[medium]) {
					t.Fatalf("%s: ranks hold %d hashes, the group counts %d, its events say %d", medium, len(counts), len(held), len(union[medium]))
				}
				for h, c := range counts {
					if held[h] != c || !union[medium][h] {
						t.Fatalf("%s: hash %v on %d ranks, counted %d, reported %v", medium, h, c, held[h], union[medium][h])
					}
				}
			}
		}
		var now time.Duration
		next := RequestID(1)
		var live []RequestID
		for range rapid.IntRange(1, 120).Draw(t, "ops") {
			switch rapid.IntRange(0, 6).Draw(t, "op") {
			case 0, 1, 2:
				prompt := []kvblock.Segment{{ID: rapid.Uint64Range(1, 5).Draw(t, "seg"), Len: rapid.IntRange(1, 40).Draw(t, "len")}}
				if err := g.Add(now, mkReq(next, 4, prompt, rapid.IntRange(1, 12).Draw(t, "out"))); err == nil {
					live = append(live, next)
				}
				next++
			case 3:
				if len(live) > 0 {
					i := rapid.IntRange(0, len(live)-1).Draw(t, "abort")
					_ = g.Abort(now, live[i]) // it may have finished
					live = slices.Delete(live, i, i+1)
				}
			case 4:
				if ok, evs := g.ResetPrefixCache(); ok {
					union.apply(t, evs)
				}
			default:
				if at, ok := g.NextStep(); ok {
					res := g.Step(max(now, at))
					union.apply(t, res.Events)
					now = max(now, res.End())
				}
			}
			check()
		}
		for i := 0; ; i++ {
			at, ok := g.NextStep()
			if !ok {
				break
			}
			if i > 100_000 {
				t.Fatal("group did not drain")
			}
			res := g.Step(max(now, at))
			union.apply(t, res.Events)
			now = max(now, res.End())
			check()
		}
		if g.Len() != 0 || g.Metrics().UsedBlocks != 0 {
			t.Fatalf("idle group holds %d requests, %d blocks", g.Len(), g.Metrics().UsedBlocks)
		}
	})
}

func TestGroupSumsTierMetrics(t *testing.T) {
	cfg := tierConfig(64, 8)
	cfg.DataParallelSize = 2
	g := mustGroup(t, cfg)
	for i := range 2 {
		e := g.Rank(i)
		e.metrics.CPUHitTokens, e.metrics.DiskHitTokens, e.metrics.KVLoadTime, e.metrics.RemoteKVTokens, e.metrics.KVLoads = 1, 2, 3, 4, 5
	}
	m := g.Metrics()
	if m.CPUHitTokens != 2 || m.DiskHitTokens != 4 || m.KVLoadTime != 6 || m.RemoteKVTokens != 8 || m.KVLoads != 10 {
		t.Fatalf("group metrics %+v", m)
	}
}

// The tier's LRU matches a plain list under inserts, touches, removals and
// evictions, across growths of its index.
func TestTierMatchesList(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		capacity := rapid.IntRange(1, 3000).Draw(t, "cap")
		tr := newTier(MediumCPU, capacity)
		var list []kvblock.Hash // least recent first
		next := uint64(1)
		for range rapid.IntRange(0, 4000).Draw(t, "ops") {
			switch op := rapid.IntRange(0, 9).Draw(t, "op"); {
			case op < 6: // insert, evicting the least recent when full
				h := kvblock.Hash{Lo: next * 0x9e3779b97f4a7c15, Hi: next}
				next++
				if tr.len() >= tr.cap {
					if got := tr.popLRU(); got != list[0] {
						t.Fatalf("evicted %v, want %v", got, list[0])
					}
					list = list[1:]
				}
				tr.insert(h)
				list = append(list, h)
			case op < 8 && len(list) > 0: // touch
				i := rapid.IntRange(0, len(list)-1).Draw(t, "touch")
				id, ok := tr.get(list[i])
				if !ok {
					t.Fatalf("hash %v lost", list[i])
				}
				tr.touch(id)
				h := list[i]
				list = append(slices.Delete(list, i, i+1), h)
			case len(list) > 0: // remove
				i := rapid.IntRange(0, len(list)-1).Draw(t, "remove")
				id, _ := tr.get(list[i])
				tr.remove(id)
				list = slices.Delete(list, i, i+1)
			}
		}
		if got := tierHashes(tr); !slices.Equal(got, list) {
			t.Fatalf("tier %d hashes, list %d", len(got), len(list))
		}
		if 4*tr.len() > len(tr.index.slots) {
			t.Fatalf("index %d slots for %d entries", len(tr.index.slots), tr.len())
		}
		if _, ok := tr.get(kvblock.Hash{Lo: 1, Hi: 0}); ok {
			t.Fatal("found a hash never inserted")
		}
	})
}

// A load makes the blocks it reads the tier's most recent: the offloads its
// own allocation causes push out the other entries first.
func TestTierLoadTouchesWhatItReads(t *testing.T) {
	e, _ := New(tierConfig(16, 0))
	a := offloadA(t, e, nil) // CPU: A's 11 blocks, a[10] the oldest
	_ = e.Add(2*time.Second, mkReq(3, 16, []kvblock.Segment{{ID: 1, Len: 176}}, 1))
	// Loading a[0..9] takes 10 GPU blocks: B freed its blocks tail first,
	// so the first is its partial last block and the other 9 offload B's
	// cached blocks into the CPU tier, which has room for 5: 4 entries go,
	// the unread a[10] and then the first three read.
	e.Step(2 * time.Second)
	got := tierHashes(e.pool.cpu)
	if len(got) != 16 || !slices.Equal(got[:7], a[3:10]) {
		t.Fatalf("CPU tier after the load started: %v, want a[3:10] (%v) then B's blocks", got, a[3:10])
	}
}
