package engine

import (
	"math"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// Emission is a token a request produced at the end of a step.
type Emission struct {
	ID RequestID
	// Output is the number of tokens the request has produced so far,
	// this one included (1 for the first token).
	Output int
	// CachedTokens is the prompt tokens served from the prefix cache at the
	// request's first admission: its GPU prefix hit and the blocks it loaded
	// back from the lower tiers. For a RemotePrefill request it is the
	// locally cached prefix only (its GPU hit), not the transferred KV.
	CachedTokens int
	// Finished reports that this was the request's last token; its slot and
	// blocks are already free.
	Finished bool
	// Preemptions counts how often the request was preempted so far.
	Preemptions int
}

// Result is what one step did. The scheduler's state (slots, blocks,
// finished requests) and the KV events change at End(); the emitted tokens
// reach the API server at OutputAt, which is End() unless the profile models
// an output lag. The slices are reused by the next Step call.
type Result struct {
	Start    time.Duration
	Duration time.Duration
	// OutputAt is when the step's emitted tokens reach the API server:
	// Latency.OutputAt(End(), Duration, the previous step's OutputAt), so
	// never before End() and never before the previous step's tokens (a
	// request's tokens arrive in order).
	OutputAt time.Duration
	// Batch holds the priced features of the step.
	Batch Batch
	// Scheduled is the number of requests in the batch.
	Scheduled int
	// Emitted lists every token produced, in batch order.
	Emitted []Emission
	// Preempted lists requests preempted (sent back to waiting) in this step.
	Preempted []RequestID
	// Admitted lists requests scheduled for the first time in this step (at
	// Start: vLLM's scheduled_ts), in batch order.
	Admitted []RequestID
	// Events are the KV events of the step (only with Config.EnableKVEvents).
	Events []KVEvent
}

// End returns when the step's outputs happen.
func (r *Result) End() time.Duration { return r.Start + r.Duration }

// Medium names where a block lives, as vLLM's KV events do (MediumCPU and
// MediumDisk, the lower tiers, are in tier.go).
const MediumGPU = "GPU"

// KVEventKind is the type of a KV event.
type KVEventKind uint8

// The KV event kinds, named as vLLM names them.
const (
	BlockStored KVEventKind = iota + 1
	BlockRemoved
	AllBlocksCleared
)

func (k KVEventKind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "unknown"
}

// KVEvent mirrors vLLM's KV cache events.
type KVEvent struct {
	Kind        KVEventKind
	BlockHashes []kvblock.Hash
	// ParentBlockHash is the hash of the block before the first stored one.
	ParentBlockHash kvblock.Hash
	HasParent       bool
	BlockSize       int
	Medium          string
}

// Metrics are the engine's counters and gauges, named after vLLM's.
type Metrics struct {
	Running            int     // vllm:num_requests_running
	Waiting            int     // vllm:num_requests_waiting
	KVCacheUsage       float64 // vllm:kv_cache_usage_perc (referenced blocks / all blocks)
	NumGPUBlocks       int
	UsedBlocks         int
	CachedBlocks       int   // blocks findable in the prefix cache
	PrefixCacheQueries int64 // vllm:prefix_cache_queries_total (tokens)
	PrefixCacheHits    int64 // vllm:prefix_cache_hits_total (tokens): GPU hits only
	Preemptions        int64 // vllm:num_preemptions_total
	PromptTokens       int64 // vllm:prompt_tokens_total
	GenerationTokens   int64 // vllm:generation_tokens_total
	RequestsFinished   int64 // vllm:request_success_total
	RequestsAborted    int64
	Steps              int64
	BusyTime           time.Duration

	// CPUHitTokens and DiskHitTokens count the tokens loaded back from the
	// CPU and disk tiers (every load, a repeated one too).
	CPUHitTokens  int64
	DiskHitTokens int64
	// CPUBlocks and DiskBlocks are the hashes each lower tier holds.
	CPUBlocks  int
	DiskBlocks int
	// KVLoads counts the loads from the lower tiers (one per admission that
	// found its prefix continued there), and KVLoadTime is the total time
	// requests spent loading (each load's duration, counted when it
	// starts).
	KVLoads    int64
	KVLoadTime time.Duration
	// RemoteKVTokens counts the prompt tokens of RemotePrefill requests
	// that came with the transferred KV: neither cached locally nor loaded
	// (the last prompt token included: the transfer carries it, though the
	// engine recomputes it).
	RemoteKVTokens int64
}

// Metrics returns the engine's current counters and gauges.
func (e *Engine) Metrics() Metrics {
	e.pool.settle()
	m := e.loadMetrics()
	m.CachedBlocks = e.pool.ncached
	return m
}

// loadMetrics is Metrics but for CachedBlocks (Group.LoadMetrics).
func (e *Engine) loadMetrics() Metrics {
	m := e.metrics
	m.Running = len(e.running)
	m.Waiting = e.waiting.len()
	m.UsedBlocks = e.cfg.NumGPUBlocks - e.pool.nfree
	m.KVCacheUsage = float64(m.UsedBlocks) / float64(e.cfg.NumGPUBlocks)
	if e.pool.cpu != nil {
		m.CPUBlocks = e.pool.cpu.len()
		if e.pool.disk != nil {
			m.DiskBlocks = e.pool.disk.len()
		}
	}
	return m
}

// Step runs one scheduler iteration starting at now (or at the end of the
// previous step, if that is later) and returns what it did. The result is
// valid until the next call.
func (e *Engine) Step(now time.Duration) *Result {
	e.pool.settle()
	defer e.pool.handOver()
	e.tell(now)
	start := max(e.now, e.busyUntil)
	res := &e.res
	*res = Result{Start: start, Emitted: res.Emitted[:0], Preempted: res.Preempted[:0], Admitted: res.Admitted[:0]}
	e.events = e.events[:0]
	e.sched = e.sched[:0]
	if len(e.loads) > 0 {
		e.finishLoads(start)
	}

	budget := e.cfg.MaxNumBatchedTokens
	preempted := false
	// Running requests first: the next decode token or prefill chunk.
	for i := 0; i < len(e.running) && budget > 0; i++ {
		s := e.running[i]
		n := e.chunk(s.numTokens()-s.numComputed, budget)
		if n <= 0 {
			continue
		}
		scheduled := true
		for !e.grow(s, n) {
			victim := e.running[len(e.running)-1]
			e.running = e.running[:len(e.running)-1]
			e.preempt(victim)
			res.Preempted = append(res.Preempted, victim.id)
			preempted = true
			if victim == s {
				scheduled = false
				break
			}
		}
		if !scheduled {
			break
		}
		s.newTokens = n
		e.sched = append(e.sched, s)
		budget -= n
	}
	// Then waiting requests in order, unless this step preempted. A request
	// that starts loading from a lower tier, or is loading, stays in its
	// place and the next one is tried (vLLM's WAITING_FOR_REMOTE_KVS).
	for i := 0; !preempted && i < e.waiting.len() && budget > 0 && len(e.running) < e.cfg.MaxNumSeqs; {
		s := e.waiting.at(i)
		if s.loading {
			i++
			continue
		}
		r := e.admit(s, budget)
		if r == admitNo {
			break
		}
		if r == admitLoad {
			i++
			continue
		}
		e.waiting.removeAt(i)
		s.state = stateRunning
		e.running = append(e.running, s)
		e.sched = append(e.sched, s)
		budget -= s.newTokens
	}

	// Execute: price the batch, advance every scheduled request, emit the
	// tokens of those that reached the end of their sequence. (Finishing
	// one, which frees its blocks, before registering the next one's new
	// blocks changes nothing: registering neither allocates nor reads the
	// free queue, and a finished request's blocks that others share are
	// registered already.)
	var b Batch
	finished := 0
	for _, s := range e.sched {
		ctx, n := s.numComputed, s.newTokens
		if n == 1 && s.numOutput > 0 && ctx == s.numTokens()-1 {
			b.DecodeSeqs++
			b.DecodeCtxTokens += int64(ctx + 1)
		} else {
			b.PrefillTokens += int64(n)
			b.PrefillPairs += float64(n) * (float64(ctx) + float64(n)/2)
		}
		s.numComputed += n
		s.newTokens = 0
		// New full blocks to register: min(numComputed/BlockSize,
		// len(hashes)) > numStored, tested without dividing.
		if s.numStored < len(s.hashes) && s.numComputed >= (s.numStored+1)*e.cfg.BlockSize {
			full := min(s.numComputed/e.cfg.BlockSize, len(s.hashes))
			e.pool.store(s.blocks, s.hashes, s.numStored, full)
			s.numStored = full
		}
		if s.numComputed < s.numTokens() {
			continue // a prefill chunk that did not reach the end of the sequence
		}
		s.numOutput++
		e.metrics.GenerationTokens++
		em := Emission{ID: s.id, Output: s.numOutput, CachedTokens: s.cached, Preemptions: s.preemptions}
		if s.numOutput >= s.output {
			em.Finished = true
			s.done = true
			finished++
			e.pool.release(s.blocks)
			e.putBlockList(s.blocks)
			s.blocks = nil
			delete(e.seqs, s.id)
			e.metrics.RequestsFinished++
		}
		res.Emitted = append(res.Emitted, em)
	}
	res.Batch = b
	res.Scheduled = len(e.sched)
	e.stalled = len(e.sched) == 0
	if len(e.sched) == 0 {
		res.OutputAt = max(start, e.lastOutput)
		res.Events = e.events
		return res
	}
	res.Duration = e.cfg.Latency.StepTime(b)
	end := start + res.Duration
	e.busyUntil = end
	res.OutputAt = end // steps end in order: no need to wait for the previous output
	if e.lagged {
		res.OutputAt = e.cfg.Latency.OutputAt(end, res.Duration, e.lastOutput)
	}
	e.lastOutput = res.OutputAt
	e.metrics.Steps++
	e.metrics.BusyTime += res.Duration

	if finished > 0 {
		kept := e.running[:0]
		for _, s := range e.running {
			if !s.done {
				kept = append(kept, s)
			}
		}
		clear(e.running[len(kept):])
		e.running = kept
	}
	res.Events = e.events
	return res
}

// chunk caps a request's next token count by the long-prefill threshold and
// the remaining budget.
func (e *Engine) chunk(n, budget int) int {
	if t := e.cfg.LongPrefillTokenThreshold; t > 0 && n > t {
		n = t
	}
	return min(n, budget)
}

// grow allocates the blocks a running request needs for n more tokens.
func (e *Engine) grow(s *seq, n int) bool {
	if s.numComputed+n <= len(s.blocks)*e.cfg.BlockSize {
		return true // the blocks it holds have room
	}
	need := e.blocksFor(s.numComputed+n) - len(s.blocks)
	if need > e.pool.nfree {
		return false
	}
	for range need {
		s.blocks = append(s.blocks, e.pool.alloc())
	}
	return true
}

// admitResult is what admit did with a waiting request.
type admitResult uint8

const (
	admitNo   admitResult = iota // it stays waiting; the queue stops here
	admitYes                     // it runs: blocks for its first chunk are allocated
	admitLoad                    // it started loading from a lower tier and stays waiting
)

// admit looks up the waiting request's cached prefix and allocates blocks for
// its first chunk; a prefix continued in the lower tiers starts a load
// instead (startLoad), a RemotePrefill request takes its prompt as computed
// (admitRemote).
func (e *Engine) admit(s *seq, budget int) admitResult {
	total := s.numTokens()
	// A fully cached sequence still recomputes its last token.
	maxHit := min((total-1)/e.cfg.BlockSize, len(s.hashes))
	hits := e.pool.lookup(s.hashes[:maxHit], e.hitBuf[:0])
	e.hitBuf = hits
	if s.remote {
		return e.admitRemote(s, hits)
	}
	if e.pool.cpu != nil && len(hits) < maxHit {
		if c, d := e.pool.tierLookup(s.hashes[len(hits):maxHit]); c+d > 0 {
			return e.startLoad(s, hits, c, d)
		}
	}
	computed := len(hits) * e.cfg.BlockSize
	n := e.chunk(total-computed, budget)
	if n <= 0 {
		return admitNo
	}
	need := e.blocksFor(computed+n) - len(hits)
	if need+e.pool.freeAmong(hits) > e.pool.nfree {
		return admitNo
	}
	e.takeBlocks(s, hits, need)
	s.numComputed = computed
	s.numStored = len(hits)
	s.newTokens = n
	e.admitted(s, total, computed, computed)
	return admitYes
}

// takeBlocks gives s the cached blocks hits and need new ones.
func (e *Engine) takeBlocks(s *seq, hits []int32, need int) {
	for _, id := range hits {
		e.pool.touch(id)
	}
	if s.blocks == nil {
		// Its most: every token but the last sampled one is computed.
		s.blocks = e.blockList(e.blocksFor(s.prompt + s.output - 1))
	}
	s.blocks = append(s.blocks[:0], hits...)
	for range need {
		s.blocks = append(s.blocks, e.pool.alloc())
	}
}

// admitted does the accounting of an admission that looked up total
// tokens, gpuHit of them in the GPU prefix cache and cached of them cached
// in any tier: the query once per admission (a request back from a load
// was counted when the load started), the request's cached tokens at its
// first admission, and Result.Admitted when it is first scheduled.
func (e *Engine) admitted(s *seq, total, gpuHit, cached int) {
	if !s.queried {
		s.queried = true
		e.metrics.PrefixCacheQueries += int64(total)
		e.metrics.PrefixCacheHits += int64(gpuHit)
	}
	if s.cached < 0 {
		s.cached = min(cached, s.prompt)
	}
	if s.newTokens > 0 && !s.scheduled {
		s.scheduled = true
		e.res.Admitted = append(e.res.Admitted, s.id)
		e.metrics.PromptTokens += int64(s.prompt)
	}
}

// startLoad admits s to load its next cpu+disk blocks after the GPU hit
// hits from the lower tiers: it takes the hit blocks and new blocks for
// the loaded ones (false if they do not fit) and waits, in its place in
// the queue and without token budget, until the step's start plus
// Config.TierLoadTime. finishLoads then registers the loaded blocks in the
// GPU prefix cache.
func (e *Engine) startLoad(s *seq, hits []int32, cpu, disk int) admitResult {
	n := cpu + disk
	if n+e.pool.freeAmong(hits) > e.pool.nfree {
		return admitNo
	}
	// Reading them makes them the tiers' most recent: allocating the new
	// blocks offloads evicted GPU blocks, which pushes the least recent out.
	e.pool.tierTouch(s.hashes[len(hits) : len(hits)+n])
	e.takeBlocks(s, hits, n)
	s.numComputed = 0
	s.numStored = len(hits)
	s.loading = true
	e.nloading++
	d := e.cfg.TierLoadTime(cpu, disk)
	until := e.res.Start + d
	if until < e.res.Start {
		until = math.MaxInt64 // an absurd bandwidth: the load never ends
	}
	e.loads = append(e.loads, load{s: s, until: until})
	bs := e.cfg.BlockSize
	e.metrics.CPUHitTokens += int64(cpu * bs)
	e.metrics.DiskHitTokens += int64(disk * bs)
	e.metrics.KVLoads++
	e.metrics.KVLoadTime += d
	e.admitted(s, s.numTokens(), len(hits)*bs, (len(hits)+n)*bs)
	return admitLoad
}

// finishLoads ends the loads due by now (the step's start): a request's
// loaded blocks enter the GPU prefix cache (BlockStored) and, with its hit
// blocks, return to the free queue still cached, so that its admission in
// its turn finds them all as a prefix hit; an aborted request's loaded
// blocks are freed uncached.
//
// vLLM keeps a loaded request's blocks until it is scheduled; giving them
// back instead (they are the free queue's most recent, evicted last) means
// waiting requests never hold blocks once their loads end, so a request at
// the front of the queue always fits when nothing runs.
func (e *Engine) finishLoads(now time.Duration) {
	kept := e.loads[:0]
	for _, l := range e.loads {
		if l.until > now {
			kept = append(kept, l)
			continue
		}
		s := l.s
		if !l.aborted {
			e.pool.store(s.blocks, s.hashes, s.numStored, len(s.blocks))
			s.loading = false
			e.nloading--
		}
		e.pool.release(s.blocks)
		if l.aborted {
			e.putBlockList(s.blocks)
			s.blocks = nil
		} else {
			s.blocks = s.blocks[:0]
		}
		s.numStored = 0
	}
	clear(e.loads[len(kept):])
	e.loads = kept
}

// admitRemote admits a RemotePrefill request: its prompt is computed but
// for the last token, which it schedules (one token of budget), with
// blocks for the whole prompt; its full blocks enter the prefix cache now.
func (e *Engine) admitRemote(s *seq, hits []int32) admitResult {
	total := s.numTokens()
	need := e.blocksFor(total) - len(hits)
	if need+e.pool.freeAmong(hits) > e.pool.nfree {
		return admitNo
	}
	e.takeBlocks(s, hits, need)
	bs := e.cfg.BlockSize
	s.numComputed = total - 1
	s.numStored = len(hits)
	if full := min(s.numComputed/bs, len(s.hashes)); full > s.numStored {
		e.pool.store(s.blocks, s.hashes, s.numStored, full)
		s.numStored = full
	}
	s.newTokens = 1
	s.remote = false
	hit := len(hits) * bs
	e.metrics.RemoteKVTokens += int64(s.prompt - min(hit, s.prompt))
	e.admitted(s, total, hit, hit)
	return admitYes
}

// preempt sends a running request back to the front of the waiting queue,
// dropping its blocks: it will recompute (vLLM v1's preemption mode).
func (e *Engine) preempt(s *seq) {
	e.pool.release(s.blocks)
	s.blocks = s.blocks[:0]
	s.numComputed = 0
	s.numStored = 0
	s.newTokens = 0
	s.queried = false
	s.preemptions++
	s.state = stateWaiting
	e.waiting.pushFront(s)
	e.metrics.Preemptions++
}
