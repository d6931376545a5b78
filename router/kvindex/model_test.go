package kvindex

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/internal/lane"
	"pgregory.net/rapid"
)

// The reference model: per replica a slice of blocks, most recent first,
// searched linearly. Obviously correct, obviously slow. Pinned blocks stay
// in the slice (where they sit there is meaningless: a release makes them
// most recent) and eviction skips them. Each pinned receipt remembers which
// incarnation of each block it pinned, rather than the index's generation
// test.

type mnode struct {
	h     kvblock.Hash
	owner uint64 // generation of the owning record, 0 when none
	spec  bool
	pins  int
	inc   uint64 // incarnation: a block removed and inserted again is another
}

type mrep struct {
	capacity int
	lru      []mnode // most recently used first
	// live maps each live pinned receipt's generation to the incarnation
	// of the block it pinned at each position of its hashes.
	live map[uint64][]uint64
}

type mexpiry struct {
	at      time.Duration
	gen     uint64
	replica int
	hashes  []kvblock.Hash
}

type mreceipt struct {
	replica int
	gen     uint64 // 0 when the record owned nothing
	hashes  []kvblock.Hash
	pinned  bool
}

type model struct {
	defCap int
	gen    uint64
	inc    uint64
	reps   map[int]*mrep
	queue  []mexpiry
}

func newModel(defCap int) *model { return &model{defCap: defCap, reps: map[int]*mrep{}} }

func (m *model) ensure(r int) *mrep {
	if m.reps[r] == nil {
		m.reps[r] = &mrep{capacity: m.defCap, live: map[uint64][]uint64{}}
	}
	return m.reps[r]
}

func (p *mrep) find(h kvblock.Hash) int {
	return slices.IndexFunc(p.lru, func(n mnode) bool { return n.h == h })
}

func (p *mrep) remove(j int) { p.lru = slices.Delete(p.lru, j, j+1) }

// trim evicts the least recently used unpinned blocks while over capacity.
func (p *mrep) trim() {
	for len(p.lru) > p.capacity {
		j := len(p.lru) - 1
		for j >= 0 && p.lru[j].pins > 0 {
			j--
		}
		if j < 0 {
			return
		}
		p.remove(j)
	}
}

func (p *mrep) toFront(j int, n mnode) {
	p.remove(j)
	p.lru = slices.Insert(p.lru, 0, n)
}

func (p *mrep) clear() {
	p.lru = nil
	p.live = map[uint64][]uint64{}
}

const (
	opRecord = iota
	opSpeculative
	opStored
	opPinned
)

func (m *model) record(r int, hashes []kvblock.Hash, kind int, expires time.Duration) mreceipt {
	p := m.ensure(r)
	var gen uint64
	if kind != opStored {
		m.gen++
		gen = m.gen
	}
	spec, pin := kind == opSpeculative, kind == opPinned
	var incs []uint64
	if pin {
		incs = make([]uint64, len(hashes))
	}
	owned := false
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		j := p.find(h)
		if j < 0 {
			// Insert as most recent, then evict the least recent unpinned
			// blocks over capacity.
			m.inc++
			n := mnode{h: h, owner: gen, spec: spec, inc: m.inc}
			if pin {
				n.pins = 1
				incs[i] = n.inc
			}
			p.lru = slices.Insert(p.lru, 0, n)
			p.trim()
			owned = owned || (gen != 0 && len(p.lru) > 0 && p.lru[0].h == h)
			continue
		}
		n := p.lru[j]
		switch {
		case kind == opStored:
			n.owner, n.spec = 0, false
		case n.owner == gen && n.spec == spec:
			// Inserted by this record earlier in the loop.
		case spec && n.spec:
			n.owner = gen // passes to this speculative record
			owned = true
		default:
			n.owner, n.spec = 0, false
		}
		if pin {
			n.pins++
			incs[i] = n.inc
		}
		p.toFront(j, n)
	}
	if pin {
		p.live[gen] = incs
		return mreceipt{replica: r, gen: gen, hashes: hashes, pinned: true}
	}
	if !owned {
		return mreceipt{replica: r}
	}
	if spec {
		m.queue = append(m.queue, mexpiry{at: expires, gen: gen, replica: r, hashes: hashes})
	}
	return mreceipt{replica: r, gen: gen, hashes: hashes}
}

func (m *model) dropOwned(r int, hashes []kvblock.Hash, gen uint64, specOnly bool) {
	p := m.reps[r]
	if p == nil || gen == 0 {
		return
	}
	for _, h := range hashes {
		if j := p.find(h); j >= 0 && p.lru[j].owner == gen && (!specOnly || p.lru[j].spec) {
			p.remove(j)
		}
	}
}

// release ends pinned receipt rc, unpinning from the last block to the
// first the incarnations it pinned that are still there; it reports whether
// rc was live.
func (m *model) release(rc mreceipt, trim bool) bool {
	p := m.reps[rc.replica]
	if !rc.pinned || p == nil || p.live[rc.gen] == nil {
		return false
	}
	incs := p.live[rc.gen]
	delete(p.live, rc.gen)
	for i := len(rc.hashes) - 1; i >= 0; i-- {
		j := p.find(rc.hashes[i])
		if j < 0 || p.lru[j].inc != incs[i] {
			continue
		}
		n := p.lru[j]
		if n.pins == 0 {
			panic("model: a live receipt's pin is missing")
		}
		if n.pins--; n.pins > 0 {
			p.lru[j] = n
			continue
		}
		p.toFront(j, n)
	}
	if trim {
		p.trim()
	}
	return true
}

func (m *model) takeBack(rc mreceipt) {
	if !rc.pinned {
		m.dropOwned(rc.replica, rc.hashes, rc.gen, false)
		return
	}
	if m.release(rc, false) {
		m.dropOwned(rc.replica, rc.hashes, rc.gen, false)
		m.reps[rc.replica].trim()
	}
}

func (m *model) expire(now time.Duration) {
	keep := m.queue[:0]
	for _, e := range m.queue {
		if e.at <= now {
			m.dropOwned(e.replica, e.hashes, e.gen, true)
		} else {
			keep = append(keep, e)
		}
	}
	m.queue = keep
}

func (m *model) removed(r int, hashes []kvblock.Hash) {
	if p := m.reps[r]; p != nil {
		for _, h := range hashes {
			if j := p.find(h); j >= 0 {
				p.remove(j)
			}
		}
	}
}

// compare checks that replica r's unpinned blocks are the model's, in the
// same order with the same owners, and its pinned blocks the model's with
// the same pin counts and owners.
func (m *model) compare(x *Index, r int) error {
	lru, pinned := x.pinState(r)
	var wantLRU []nodeState
	wantPinned := map[kvblock.Hash]nodeState{}
	if p := m.reps[r]; p != nil {
		for _, n := range p.lru {
			owner := n.owner
			if n.spec {
				owner |= specBit
			}
			s := nodeState{h: n.h, pins: n.pins, owner: owner}
			if n.pins == 0 {
				wantLRU = append(wantLRU, s)
			} else {
				wantPinned[n.h] = s
			}
		}
	}
	if !slices.Equal(lru, wantLRU) {
		return fmt.Errorf("LRU %v, model %v", lru, wantLRU)
	}
	if !maps.Equal(pinned, wantPinned) {
		return fmt.Errorf("pinned %v, model %v", pinned, wantPinned)
	}
	return nil
}

func (m *model) depth(r int, hashes []kvblock.Hash) int {
	p := m.reps[r]
	if p == nil {
		return 0
	}
	for d, h := range hashes {
		if p.find(h) < 0 {
			return d
		}
	}
	return len(hashes)
}

func (m *model) blocks(r int) int {
	if p := m.reps[r]; p != nil {
		return len(p.lru)
	}
	return 0
}

func (m *model) capacity(r int) int {
	if p := m.reps[r]; p != nil {
		return p.capacity
	}
	return m.defCap
}

// testReplicas covers the one-word fast path, its edges and the sparse
// words beyond.
var testReplicas = []int{0, 1, 2, 63, 64, 65, 130, 4095}

// TestIndexMatchesModel drives the index and the model with the same random
// operations and compares them after each.
func TestIndexMatchesModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		defCap := rapid.IntRange(0, 10).Draw(t, "defCap")
		// With a lane the same calls must give the same answers.
		var l *lane.Lane
		if rapid.Bool().Draw(t, "lane") {
			l = new(lane.Lane)
		}
		x := New(Config{DefaultCapacityBlocks: defCap, Lane: l})
		if l != nil {
			// Lookup's two ways, switched between within a test.
			x.bg.window = rapid.IntRange(1, 6).Draw(t, "window")
			x.bg.alternate = rapid.Bool().Draw(t, "alternate")
		}
		if defCap == 0 {
			defCap = DefaultCapacityBlocks
		}
		m := newModel(defCap)

		// Few distinct hashes whose low bits collide, some sharing Lo.
		pool := make([]kvblock.Hash, rapid.IntRange(1, 24).Draw(t, "nhash"))
		for i := range pool {
			pool[i] = kvblock.Hash{Hi: uint64(i) % 5, Lo: rapid.Uint64Range(0, 40).Draw(t, "lo")}
			if slices.Contains(pool[:i], pool[i]) {
				pool[i].Hi += 100 + uint64(i)
			}
		}
		hashGen := rapid.SampledFrom(pool)
		// Prompts mostly extend a few shared bases, so they share prefixes.
		bases := make([][]kvblock.Hash, 3)
		for i := range bases {
			bases[i] = rapid.SliceOfN(hashGen, 0, 10).Draw(t, "base")
		}
		prompt := func(t *rapid.T) []kvblock.Hash {
			if rapid.IntRange(0, 3).Draw(t, "fresh") == 0 {
				return rapid.SliceOfN(hashGen, 0, 10).Draw(t, "prompt")
			}
			b := rapid.SampledFrom(bases).Draw(t, "which")
			n := rapid.IntRange(0, len(b)).Draw(t, "prefix")
			p := slices.Clone(b[:n])
			return append(p, rapid.SliceOfN(hashGen, 0, 3).Draw(t, "tail")...)
		}
		replica := rapid.SampledFrom(testReplicas)
		var receipts []Receipt
		var mreceipts []mreceipt
		lookups := append([][]kvblock.Hash{}, bases...)
		depths := make([]int, len(testReplicas))

		for step := range rapid.IntRange(1, 60).Draw(t, "steps") {
			var hs []kvblock.Hash
			switch op := rapid.IntRange(0, 17).Draw(t, "op"); op {
			case 0, 1, 2:
				r, p := replica.Draw(t, "r"), prompt(t)
				hs = p
				receipts = append(receipts, x.Record(r, p))
				mreceipts = append(mreceipts, m.record(r, p, opRecord, 0))
			case 3:
				r, p := replica.Draw(t, "r"), prompt(t)
				at := time.Duration(rapid.IntRange(0, 10).Draw(t, "expires"))
				hs = p
				receipts = append(receipts, x.RecordSpeculative(r, p, at))
				mreceipts = append(mreceipts, m.record(r, p, opSpeculative, at))
			case 4:
				if len(receipts) == 0 {
					continue
				}
				i := rapid.IntRange(0, len(receipts)-1).Draw(t, "receipt")
				x.TakeBack(receipts[i])
				m.takeBack(mreceipts[i])
			case 5:
				r, p := replica.Draw(t, "r"), prompt(t)
				hs = p
				x.Stored(r, p)
				m.record(r, p, opStored, 0)
			case 6:
				r, p := replica.Draw(t, "r"), prompt(t)
				x.Removed(r, p)
				m.removed(r, p)
			case 7:
				now := time.Duration(rapid.IntRange(0, 10).Draw(t, "now"))
				x.Expire(now)
				m.expire(now)
			case 8:
				r := replica.Draw(t, "r")
				if rapid.Bool().Draw(t, "forget") {
					x.Forget(r)
					delete(m.reps, r)
				} else {
					x.Clear(r)
					if p := m.reps[r]; p != nil {
						p.clear()
					}
				}
			case 9, 10:
				r, c := replica.Draw(t, "r"), rapid.IntRange(-1, 12).Draw(t, "capacity")
				x.SetCapacity(r, c)
				p := m.ensure(r)
				p.capacity = max(c, 0)
				p.trim()
			case 11, 12:
				r, p := replica.Draw(t, "r"), prompt(t)
				hs = p
				receipts = append(receipts, x.RecordPinned(r, p))
				mreceipts = append(mreceipts, m.record(r, p, opPinned, 0))
			case 13, 14:
				if len(receipts) == 0 {
					continue
				}
				i := rapid.IntRange(0, len(receipts)-1).Draw(t, "receipt")
				x.Release(receipts[i])
				m.release(mreceipts[i], true)
			case 15, 16:
				// A few requests finish at once, each with an answer (that
				// the caller reuses as soon as Finish returns).
				if len(receipts) == 0 {
					continue
				}
				for range rapid.IntRange(1, 3).Draw(t, "finishing") {
					i := rapid.IntRange(0, len(receipts)-1).Draw(t, "receipt")
					r := int(receipts[i].replica)
					if receipts[i].gen == 0 {
						r = replica.Draw(t, "r")
					}
					answer := rapid.SliceOfN(hashGen, 0, 3).Draw(t, "answer")
					x.Finish(r, answer, receipts[i])
					if len(answer) > 0 {
						m.record(r, answer, opRecord, 0)
					}
					m.release(mreceipts[i], true)
					// The request is over: the caller reuses its answer's
					// and its prompt's hashes.
					scribble(answer)
					if receipts[i].pin != 0 {
						scribble(receipts[i].hashes)
						last := len(receipts) - 1
						receipts[i], mreceipts[i] = receipts[last], mreceipts[last]
						receipts, mreceipts = receipts[:last], mreceipts[:last]
					}
					if len(receipts) == 0 {
						break
					}
				}
			case 17:
				// A request that ends as soon as it is routed; the caller
				// then reuses its hashes.
				r, p := replica.Draw(t, "r"), prompt(t)
				answer := rapid.SliceOfN(hashGen, 0, 3).Draw(t, "answer")
				x.Finish(r, answer, x.RecordPinned(r, p))
				rc := m.record(r, slices.Clone(p), opPinned, 0)
				if len(answer) > 0 {
					m.record(r, answer, opRecord, 0)
				}
				m.release(rc, true)
				scribble(p)
				scribble(answer)
			}
			if n := len(receipts); n > 0 && ((receipts[n-1].gen == 0) != (mreceipts[n-1].gen == 0) ||
				(receipts[n-1].pin != 0) != mreceipts[n-1].pinned) {
				t.Fatalf("step %d: receipt %+v, model owned %v pinned %v", step, receipts[n-1], mreceipts[n-1].gen != 0, mreceipts[n-1].pinned)
			}
			if err := x.check(); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			for _, r := range testReplicas {
				if err := m.compare(x, r); err != nil {
					t.Fatalf("step %d: replica %d: %v", step, r, err)
				}
			}
			if hs != nil {
				lookups = append(lookups, hs)
			}
			for _, p := range lookups[max(0, len(lookups)-6):] {
				x.Lookup(p, testReplicas, depths)
				for i, r := range testReplicas {
					if want := m.depth(r, p); depths[i] != want {
						t.Fatalf("step %d: Lookup(%v) replica %d = %d, model %d", step, p, r, depths[i], want)
					}
					// Depth d: blocks 0..d-1 held, block d not.
					for k, h := range p {
						held := x.get(r) != nil && x.get(r).lookup(h) != nilNode
						if k < depths[i] && !held || k == depths[i] && held {
							t.Fatalf("step %d: replica %d depth %d but block %d held=%v", step, r, depths[i], k, held)
						}
					}
				}
			}
			for _, r := range testReplicas {
				if got, want := x.Blocks(r), m.blocks(r); got != want {
					t.Fatalf("step %d: Blocks(%d) = %d, model %d", step, r, got, want)
				}
				if got, want := x.Capacity(r), m.capacity(r); got != want {
					t.Fatalf("step %d: Capacity(%d) = %d, model %d", step, r, got, want)
				}
			}
		}
	})
}

// scribble overwrites hashes, as a caller reusing the slice would.
func scribble(hashes []kvblock.Hash) {
	for k := range hashes {
		hashes[k] = kvblock.Hash{Hi: 1 << 60, Lo: uint64(k)}
	}
}

// TestLookupEdges covers empty prompts, unknown and out-of-range replicas
// and duplicate candidates.
func TestLookupEdges(t *testing.T) {
	x := New(Config{})
	h := func(i int) kvblock.Hash { return kvblock.Hash{Hi: uint64(i), Lo: uint64(i) * 0x9E3779B97F4A7C15} }
	p := []kvblock.Hash{h(1), h(2), h(3)}
	x.Record(3, p)
	x.Record(100, p[:2])
	reps := []int{3, -1, 3, 100, 7, MaxReplica + 1, 100}
	d := make([]int, len(reps))
	x.Lookup(p, reps, d)
	if want := []int{3, 0, 3, 2, 0, 0, 2}; !slices.Equal(d, want) {
		t.Fatalf("depths %v, want %v", d, want)
	}
	x.Lookup(nil, reps, d)
	if want := make([]int, len(reps)); !slices.Equal(d, want) {
		t.Fatalf("empty prompt: depths %v, want zeros", d)
	}
	if got := x.Capacity(5); got != DefaultCapacityBlocks {
		t.Fatalf("Capacity of unknown replica = %d", got)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Record on a negative replica did not panic")
		}
	}()
	x.Record(-1, p)
}

// TestTailEvictedFirst checks that a prompt recorded over capacity keeps its
// head blocks.
func TestTailEvictedFirst(t *testing.T) {
	x := New(Config{DefaultCapacityBlocks: 4})
	p := make([]kvblock.Hash, 10)
	for i := range p {
		p[i] = kvblock.Hash{Hi: 7, Lo: uint64(i)}
	}
	x.Record(0, p)
	d := []int{0}
	x.Lookup(p, []int{0}, d)
	if d[0] != 4 {
		t.Fatalf("depth %d after recording 10 blocks at capacity 4, want 4", d[0])
	}
	// A second prompt sharing the first two blocks evicts the first prompt's
	// last block, not its head.
	q := []kvblock.Hash{p[0], p[1], {Hi: 8, Lo: 1}}
	x.Record(0, q)
	x.Lookup(p, []int{0}, d)
	if d[0] != 3 {
		t.Fatalf("depth %d, want 3", d[0])
	}
	// Two fresh blocks evict the least recent: p's block 2, then q's last.
	x.Record(0, []kvblock.Hash{{Hi: 9, Lo: 1}, {Hi: 9, Lo: 2}})
	x.Lookup(p, []int{0}, d)
	if d[0] != 2 {
		t.Fatalf("depth %d after fresh prompt, want 2", d[0])
	}
	x.Lookup(q, []int{0}, d)
	if d[0] != 2 {
		t.Fatalf("depth of q %d after fresh prompt, want 2", d[0])
	}
}

// TestLaneLongJobs: jobs whose changes to the shared table outnumber the
// queue that holds them (a 6,000-block prompt on a 2,500-block replica,
// then its answer) leave the index as the same calls without a lane do,
// while Lookups on the caller apply the changes as the worker makes them.
func TestLaneLongJobs(t *testing.T) {
	const n = 6000
	prompt := func(tag uint64) []kvblock.Hash {
		hs := make([]kvblock.Hash, n)
		for i := range hs {
			hs[i] = kvblock.Hash{Hi: tag, Lo: kvblock.Mix64(tag<<32 + uint64(i))}
		}
		return hs
	}
	plain, laned := New(Config{DefaultCapacityBlocks: 2500}), New(Config{DefaultCapacityBlocks: 2500, Lane: new(lane.Lane)})
	for _, x := range []*Index{plain, laned} {
		for r := range 3 {
			x.SetCapacity(r, 2500+1000*r)
		}
	}
	depths := func(x *Index, hs []kvblock.Hash) []int {
		d := make([]int, 3)
		x.Lookup(hs, []int{0, 1, 2}, d)
		return d
	}
	for k := range 6 {
		hs, ans := prompt(uint64(k%4)), prompt(uint64(100+k))
		r := k % 3
		var rcs [2]Receipt
		for i, x := range []*Index{plain, laned} {
			rcs[i] = x.RecordPinned(r, hs)
		}
		if a, b := depths(plain, prompt(uint64((k+1)%4))), depths(laned, prompt(uint64((k+1)%4))); !slices.Equal(a, b) {
			t.Fatalf("round %d, while pinned: depths %v with a lane, %v without", k, b, a)
		}
		for i, x := range []*Index{plain, laned} {
			x.Finish(r, ans[:n/2], rcs[i])
		}
		for _, q := range [][]kvblock.Hash{hs, ans, prompt(uint64((k + 2) % 4))} {
			if a, b := depths(plain, q), depths(laned, q); !slices.Equal(a, b) {
				t.Fatalf("round %d: depths %v with a lane, %v without", k, b, a)
			}
		}
		for rep := range 3 {
			if a, b := plain.Blocks(rep), laned.Blocks(rep); a != b {
				t.Fatalf("round %d: replica %d holds %d blocks with a lane, %d without", k, rep, b, a)
			}
		}
		if a, b := plain.shared.n, laned.shared.n; a != b && !laned.bg.perReplica {
			t.Fatalf("round %d: the shared table holds %d blocks with a lane, %d without", k, b, a)
		}
	}
}
