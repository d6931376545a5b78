package fleet

import (
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/workload"
)

// preparer owns what a run's arrivals need before they reach a gateway:
// the source (Next and Done) and the block hashes of each request, with
// the segment memo and the slices of finished requests they reuse.
//
// On two cores (Config.TwoCores) with a source whose arrivals do not depend
// on the run (workload.TakesAhead), arrivals are taken from the source
// ahead of their time and hashed as spare work (lane.Lane.SetSpare): by the
// loop while it waits for the index's jobs, and by the lane's worker
// between them. Hashing is a quarter of a trace replay's loop, and both
// cores have time left over at different moments. Each arrival still
// enters the event heap when the one before it arrives (pullArrival), the
// source is asked for arrivals in the same order, and a request's hashes
// depend on the request alone (the memo only saves work), so a run gives
// the same bytes either way. The loop waits for the worker only for an
// arrival the worker is hashing, or to take one from the source itself.
type preparer struct {
	// work is held for one piece of preparation: it guards the source's
	// Next, salts, memo, segs, cur and the hashing fields of a reqState.
	work sync.Mutex
	// mu guards the rest, and is never held for long.
	mu    sync.Mutex
	src   workload.Source
	bs    int // block size
	ahead bool
	// q[head:] are the arrivals taken ahead, oldest first; q[head:hashed]
	// of them have been claimed for hashing (reqState.inPrep), and are
	// hashed once their prepared flag is set.
	q            []*reqState
	head, hashed int
	ended        bool // the source has no more (guarded by work)
	stopped      bool // the run is over: no more spare work
	// idle is set (under mu) when spare work found nothing to do, and
	// cleared when taking an arrival makes room: the lane's worker asks
	// for spare work between all its jobs, and a flag nobody writes costs
	// it one load, where the locks cost writes the loop's core must fetch.
	idle  atomic.Bool
	salts map[string]kvblock.Hash
	memo  segmentMemo
	// segs holds the sequence of cur, segsNow that of a request hashed
	// at once (hashSome): one taken from the queue before the spare work
	// claimed it may be hashed while cur is half done.
	segs, segsNow []kvblock.Segment
	cur           *reqState        // the arrival being hashed by spare work, if any (guarded by work)
	free          [][]kvblock.Hash // hash slices of finished requests, for reuse
}

// aheadMax bounds the arrivals taken ahead of their time.
const aheadMax = 64

// maxFree bounds the hash slices kept for reuse.
const maxFree = 1024

func newPreparer(src workload.Source, blockSize int) *preparer {
	return &preparer{
		src:   src,
		bs:    blockSize,
		ahead: workload.TakesAhead(src),
		salts: make(map[string]kvblock.Hash),
		memo:  newSegmentMemo(memoLimit, memoArenaLimit),
	}
}

// next returns the source's next open-loop arrival (the oldest taken
// ahead, if any), or nil when there are no more.
func (p *preparer) next() *reqState {
	if rs := p.pop(); rs != nil {
		return rs
	}
	// Spare work may be taking one from the source right now: once work
	// is ours, what it took is in the queue.
	p.work.Lock()
	defer p.work.Unlock()
	if rs := p.pop(); rs != nil {
		return rs
	}
	if p.ended {
		return nil
	}
	r, ok := p.src.Next()
	if !ok {
		p.ended = true
		return nil
	}
	return &reqState{w: r}
}

// pop takes the oldest arrival taken ahead, if any.
func (p *preparer) pop() *reqState {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.head == len(p.q) {
		return nil
	}
	rs := p.q[p.head]
	p.q[p.head] = nil
	p.head++
	if p.idle.Load() {
		p.idle.Store(false)
	}
	p.hashed = max(p.hashed, p.head) // unclaimed, it is the loop's to hash
	if p.head == len(p.q) {
		p.q, p.head, p.hashed = p.q[:0], 0, 0
	}
	return rs
}

// hashesOf returns the block hashes of rs's whole sequence (prompt, then
// output): those prepared ahead (helping to finish them if they are being
// prepared), or computed now.
func (p *preparer) hashesOf(rs *reqState) []kvblock.Hash {
	if rs.inPrep {
		for i := 1; !rs.prepared.Load(); i++ {
			// The oldest arrival claimed is the one being hashed: help.
			if !p.spare() && i%256 == 0 {
				runtime.Gosched()
			}
		}
		return rs.hashes
	}
	p.work.Lock()
	defer p.work.Unlock()
	p.hashSome(rs, math.MaxInt, &p.segsNow)
	return rs.hashes
}

// recycle keeps a slice of hashes nothing refers to any more for reuse.
func (p *preparer) recycle(h []kvblock.Hash) {
	if h == nil {
		return
	}
	p.mu.Lock()
	if len(p.free) < maxFree {
		p.free = append(p.free, h)
	}
	p.mu.Unlock()
}

// done is the source's Done. A source that takes arrivals ahead changes
// nothing in Done (workload.TakesAhead), so Done needs no lock.
func (p *preparer) done(w *workload.Request, at time.Duration, ok bool) (*workload.Request, bool) {
	return p.src.Done(w, at, ok)
}

// spare does one piece of preparation, unless another goroutine is doing
// one: it hashes on (at most pieceBlocks blocks) the arrival being hashed
// or the oldest one taken ahead that nobody has claimed, or else takes the
// next arrival from the source. It reports whether there may be more to do
// (lane.Lane.SetSpare). Pieces are small so that the lane's worker, which
// does them between the index's jobs, takes the next job soon.
func (p *preparer) spare() bool {
	if !p.ahead || p.idle.Load() || !p.work.TryLock() {
		return false
	}
	defer p.work.Unlock()
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return false
	}
	rs := p.cur
	if rs == nil && p.hashed < len(p.q) {
		rs = p.q[p.hashed]
		p.hashed++
		rs.inPrep = true
	}
	if rs != nil {
		p.mu.Unlock()
		p.cur = rs
		if p.hashSome(rs, pieceBlocks, &p.segs) {
			p.cur = nil
			rs.prepared.Store(true)
		}
		return true
	}
	if p.ended || len(p.q)-p.head >= aheadMax {
		p.idle.Store(true)
		p.mu.Unlock()
		return false
	}
	p.mu.Unlock()
	r, ok := p.src.Next()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !ok {
		p.ended = true
		p.idle.Store(true)
		return false
	}
	p.q = append(p.q, &reqState{w: r})
	return true
}

// pieceBlocks bounds the blocks one piece of spare work hashes (a few
// microseconds).
const pieceBlocks = 128

// stop ends the spare work once the piece in progress is done: the run is
// over, and the source is the caller's again (the worker may still look
// for spare work before it leaves, and finds none).
func (p *preparer) stop() {
	p.work.Lock()
	p.mu.Lock()
	p.stopped = true
	p.idle.Store(true)
	p.mu.Unlock()
	p.work.Unlock()
}

// takeFree returns a finished request's slice that holds n hashes (among
// the last few kept), else a new one of that size, rather than one grown
// by appends.
func (p *preparer) takeFree(n int) []kvblock.Hash {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k := len(p.free) - 1; k >= max(len(p.free)-8, 0); k-- {
		if cap(p.free[k]) >= n {
			out := p.free[k][:0]
			last := len(p.free) - 1
			p.free[k], p.free[last] = p.free[last], nil
			p.free = p.free[:last]
			return out
		}
	}
	return make([]kvblock.Hash, 0, n)
}

func (p *preparer) salt(model string) kvblock.Hash {
	h, ok := p.salts[model]
	if !ok {
		h = kvblock.Salt(model, "", "")
		p.salts[model] = h
	}
	return h
}

// hashSome derives the block hashes of rs's whole sequence (prompt, then
// output) into rs.hashes, memoising the blocks of a shared leading
// segment, and reports whether they are complete. It stops after the
// segment that takes it past budget blocks; the next call goes on from
// there (buf, which holds the sequence, and rs's hash fields keep its
// place). The caller holds work.
func (p *preparer) hashSome(rs *reqState, budget int, buf *[]kvblock.Segment) bool {
	w, bs := rs.w, p.bs
	if !rs.hashing {
		rs.hashing = true
		rs.hashes = p.takeFree((w.PromptTokens() + w.OutputTokens) / bs)
		rs.parent = p.salt(w.Model)
		rs.seg = 0
		*buf = append(append((*buf)[:0], w.Prompt...), w.Output)
	}
	// Prompts are chains of segments that recur (system prompts, documents,
	// a trace's hash ids): the full blocks inside a segment depend only on
	// the hash before it and the segment, so they are memoised per (parent,
	// segment) while segments start on block boundaries. The last prompt
	// segment (a question, a user turn) is usually unique and not memoised.
	segs, n := *buf, 0
	for ; rs.seg < len(w.Prompt)-1; rs.seg++ {
		if n >= budget {
			return false
		}
		seg := segs[rs.seg]
		full := seg.Len / bs
		if full == 0 {
			rs.hashes = kvblock.AppendSegmentHashesFrom(rs.hashes, rs.parent, segs[rs.seg:], bs, 0, -1)
			return true
		}
		hs := p.memo.hashes(memoKey{parent: rs.parent, seg: seg}, bs)
		rs.hashes = append(rs.hashes, hs...)
		rs.parent = hs[len(hs)-1]
		n += full
		if seg.Len%bs != 0 {
			// The segment ends inside a block: hash on from its last full block.
			rs.hashes = kvblock.AppendSegmentHashesFrom(rs.hashes, rs.parent, segs[rs.seg:], bs, full, -1)
			return true
		}
	}
	rs.hashes = kvblock.AppendSegmentHashesFrom(rs.hashes, rs.parent, segs[max(len(w.Prompt)-1, 0):], bs, 0, -1)
	return true
}
