package engine

import (
	"errors"
	"fmt"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// RequestID names a request inside one engine.
type RequestID uint64

// Request is what the engine needs to know of a request.
type Request struct {
	ID RequestID
	// PromptTokens is the prompt's length.
	PromptTokens int
	// OutputTokens is how many tokens the request generates before it
	// finishes (its true output length; at most max_tokens).
	OutputTokens int
	// MaxTokens is the client's max_tokens (checked against MaxModelLen); 0 means OutputTokens.
	MaxTokens int
	// BlockHashes names the full blocks of the request's token sequence,
	// prompt then output, as kvblock derives them. Blocks past the prompt
	// become cacheable once generated; a request that hashes fewer blocks
	// than it fills simply caches fewer.
	BlockHashes []kvblock.Hash
	// RemotePrefill marks the decode side of disaggregated prefill: the
	// prompt's KV was computed on another engine and has arrived already
	// (the caller delays Add by the transfer, Config.TransferTime; the
	// engine does not model it). At its first admission the prompt counts
	// as computed but for its last token, as a fully cached prompt: the
	// request takes blocks for the whole prompt (its locally cached prefix
	// reused, the rest new), its full blocks enter the prefix cache at once
	// (BlockStored, medium GPU), and its first step computes one token and
	// emits the first output token, within max_num_seqs, the blocks and the
	// token budget like any admission. The lower tiers are not consulted.
	// Emission.CachedTokens is the locally cached part only;
	// Metrics.RemoteKVTokens counts the rest of the prompt. A preempted
	// request recomputes as any other (the transferred KV is not kept).
	RemotePrefill bool
}

// Errors returned by Add and Abort.
var (
	ErrDuplicateID = errors.New("engine: duplicate request id")
	ErrUnknownID   = errors.New("engine: unknown request id")
	ErrTooLong     = errors.New("engine: request exceeds max_model_len")
	ErrTooLarge    = errors.New("engine: request needs more KV blocks than the engine has")
	ErrInvalid     = errors.New("engine: invalid request")
)

type seqState uint8

const (
	stateWaiting seqState = iota
	stateRunning
)

// seq is a request inside the engine.
type seq struct {
	id          RequestID
	prompt      int
	output      int
	hashes      []kvblock.Hash
	numComputed int
	numOutput   int
	numStored   int // leading blocks registered in the prefix cache
	blocks      []int32
	cached      int // prompt tokens served from the prefix cache (GPU and tiers) at first admission; -1 before
	preemptions int
	state       seqState
	done        bool
	loading     bool // waiting for a load from a lower tier (holds blocks); see Engine.loads
	remote      bool // Request.RemotePrefill, until its first admission
	queried     bool // this admission counted its prefix-cache query (reset by preemption)
	scheduled   bool // scheduled once (listed in Result.Admitted)
	newTokens   int  // scheduled in the current step
}

func (s *seq) numTokens() int { return s.prompt + s.numOutput }

// Engine is one vLLM v1 engine. It is not safe for concurrent use; drive it
// from one goroutine.
type Engine struct {
	cfg     Config
	pool    *pool
	seqs    map[RequestID]*seq
	waiting deque
	running []*seq
	sched   []*seq // scheduled in the current step
	hitBuf  []int32
	// spare holds the block lists of finished requests for reuse, at most
	// maxSpareBlockLists.
	spare [][]int32

	now        time.Duration // latest time the engine was told
	busyUntil  time.Duration // end of the last step
	lastOutput time.Duration // OutputAt of the last step
	lagged     bool          // the profile delays outputs past the step's end
	metrics    Metrics
	res        Result
	events     []KVEvent

	// Loads from the lower tiers in flight, in the order they started (an
	// aborted request's too: its blocks are written until the load ends).
	loads    []load
	nloading int  // waiting requests with a load in flight
	stalled  bool // the last step scheduled nothing: wait for a load to end
}

// load is a request's load of blocks from the lower tiers: its blocks
// [numStored, len(blocks)) receive the KV until the load ends.
type load struct {
	s       *seq
	until   time.Duration
	aborted bool
}

// New returns an idle engine with an empty cache. cfg is validated.
func New(cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("engine config: %w", err)
	}
	e := &Engine{
		cfg:  cfg,
		pool: newPool(cfg.NumGPUBlocks, cfg.BlockSize, !cfg.DisablePrefixCaching),
		seqs: make(map[RequestID]*seq),
	}
	if cfg.EnableKVEvents {
		e.pool.events = &e.events
	}
	if t := cfg.KVTiers; t.CPUBlocks > 0 {
		e.pool.cpu = newTier(MediumCPU, t.CPUBlocks)
		if t.DiskBlocks > 0 {
			e.pool.disk = newTier(MediumDisk, t.DiskBlocks)
		}
	}
	e.metrics.NumGPUBlocks = cfg.NumGPUBlocks
	e.lagged = cfg.Latency.OutputLagSteps != 0 || cfg.Latency.OutputDelayMs != 0
	return e, nil
}

// Config returns the engine's configuration.
func (e *Engine) Config() Config { return e.cfg }

func (e *Engine) tell(now time.Duration) {
	if now > e.now {
		e.now = now
	}
}

// blocksFor returns the blocks needed to hold n tokens.
func (e *Engine) blocksFor(n int) int { return (n + e.cfg.BlockSize - 1) / e.cfg.BlockSize }

// Add enqueues req at time now. It fails if the id is in use, if prompt plus
// max_tokens exceed MaxModelLen, or if the request could never fit in the KV
// cache.
func (e *Engine) Add(now time.Duration, req Request) error {
	e.tell(now)
	if req.PromptTokens <= 0 || req.OutputTokens <= 0 {
		return fmt.Errorf("%w: prompt_tokens %d and output tokens %d must be positive", ErrInvalid, req.PromptTokens, req.OutputTokens)
	}
	if _, dup := e.seqs[req.ID]; dup {
		return fmt.Errorf("%w: %d", ErrDuplicateID, req.ID)
	}
	if err := e.cfg.Admissible(req.PromptTokens, req.OutputTokens, req.MaxTokens); err != nil {
		return err
	}
	s := &seq{
		id:     req.ID,
		prompt: req.PromptTokens,
		output: req.OutputTokens,
		hashes: req.BlockHashes,
		cached: -1,
		remote: req.RemotePrefill,
	}
	e.seqs[req.ID] = s
	e.waiting.pushBack(s)
	e.stalled = false
	return nil
}

// Admissible reports whether an engine with this configuration can ever
// serve a request: prompt plus max_tokens (at least the output) within
// MaxModelLen, and its KV footprint within the cache. The last sampled token
// is never fed back, so a request holds at most prompt+output-1 tokens of KV.
// A gateway that knows the engine's limits can refuse such a request before
// routing it, as the engine would.
func (c *Config) Admissible(prompt, output, maxTokens int) error {
	maxTok := max(maxTokens, output)
	if prompt+maxTok > c.MaxModelLen {
		return fmt.Errorf("%w: %d prompt + %d max tokens > %d", ErrTooLong, prompt, maxTok, c.MaxModelLen)
	}
	if need := (prompt + output - 1 + c.BlockSize - 1) / c.BlockSize; need > c.NumGPUBlocks {
		return fmt.Errorf("%w: %d blocks needed, %d available", ErrTooLarge, need, c.NumGPUBlocks)
	}
	return nil
}

// Abort removes a request at once, freeing its slot and its blocks (which stay
// cached). Outputs of an in-progress step for it should be ignored by the caller.
// A request loading blocks from a lower tier leaves at once too, but its
// blocks are being written until the load ends: they stay in use until
// then, and are freed uncached (as vLLM frees an aborted request's blocks
// when its finished_recving arrives).
func (e *Engine) Abort(now time.Duration, id RequestID) error {
	e.pool.settle()
	e.tell(now)
	s, ok := e.seqs[id]
	if !ok {
		return fmt.Errorf("%w: %d", ErrUnknownID, id)
	}
	delete(e.seqs, id)
	e.stalled = false
	switch s.state {
	case stateWaiting:
		e.waiting.remove(s)
		if s.loading {
			s.loading = false
			e.nloading--
			for i := range e.loads {
				if e.loads[i].s == s {
					e.loads[i].aborted = true
				}
			}
			e.metrics.RequestsAborted++
			return nil // the load releases the blocks when it ends
		}
	case stateRunning:
		for i, r := range e.running {
			if r == s {
				e.running = append(e.running[:i], e.running[i+1:]...)
				break
			}
		}
	}
	e.pool.release(s.blocks)
	e.putBlockList(s.blocks)
	s.blocks = nil
	e.metrics.RequestsAborted++
	return nil
}

// NextStep returns when the engine wants to run its next step: the end of the
// current step (or now, if idle) when it has work, ok=false when it has none.
// When all it can do is wait for a load from a lower tier (every waiting
// request is loading, or the last step scheduled nothing while loads were
// in flight), it is the end of the first load.
func (e *Engine) NextStep() (time.Duration, bool) {
	if !e.hasWork() {
		return 0, false
	}
	at := max(e.now, e.busyUntil)
	if len(e.loads) > 0 && (e.stalled || len(e.running) == 0 && e.waiting.len() == e.nloading) {
		first := e.loads[0].until
		for _, l := range e.loads[1:] {
			first = min(first, l.until)
		}
		at = max(at, first)
	}
	return at, true
}

func (e *Engine) hasWork() bool {
	return len(e.running) > 0 || e.waiting.len() > 0 || len(e.loads) > 0
}

// ResetPrefixCache drops every cached block, as vLLM's /reset_prefix_cache,
// and empties the lower tiers (an AllBlocksCleared event for each medium).
// It fails (false) while any block is in use.
func (e *Engine) ResetPrefixCache() (bool, []KVEvent) {
	e.pool.settle()
	e.events = e.events[:0]
	ok := e.pool.reset()
	return ok, e.events
}

// maxSpareBlockLists bounds Engine.spare.
const maxSpareBlockLists = 64

// blockList returns an empty block list with room for n blocks, a finished
// request's if one is large enough: a request's list is sized once, at its
// first admission, for all the blocks it can hold, so it never grows.
func (e *Engine) blockList(n int) []int32 {
	if k := len(e.spare); k > 0 {
		l := e.spare[k-1]
		e.spare[k-1] = nil
		e.spare = e.spare[:k-1]
		if cap(l) >= n {
			return l[:0]
		}
	}
	return make([]int32, 0, n)
}

// putBlockList keeps a released request's block list for reuse.
func (e *Engine) putBlockList(l []int32) {
	if l != nil && len(e.spare) < maxSpareBlockLists {
		e.spare = append(e.spare, l[:0])
	}
}

// Len returns the number of requests in the engine (waiting or running).
func (e *Engine) Len() int { return len(e.seqs) }
