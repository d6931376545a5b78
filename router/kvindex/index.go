package kvindex

import (
	"fmt"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/internal/lane"
	"github.com/inferrail/inferrail/internal/timeheap"
)

// DefaultCapacityBlocks is the shadow-LRU capacity of a replica whose
// capacity was never set, when Config leaves it zero.
const DefaultCapacityBlocks = 16384

// MaxReplica is the largest replica id. Ids index a slice, so they should be
// small and dense; ids 0..63 take the fast path of Lookup.
const MaxReplica = 1<<16 - 1

// maxCapacity bounds a replica's capacity so that node indices fit in int32.
const maxCapacity = math.MaxInt32 - 1

// Config configures an Index.
type Config struct {
	// DefaultCapacityBlocks is the shadow-LRU capacity of a replica whose
	// capacity was never set. Zero or negative means DefaultCapacityBlocks
	// (16384).
	DefaultCapacityBlocks int
	// Lane, when set, runs the work of RecordPinned and Finish on the
	// lane's worker while the caller goes on (background.go): the results
	// are the same, the caller's next call on the index waits for it. The
	// index is then for the lane's caller only: its methods are not safe
	// for concurrent use.
	Lane *lane.Lane
}

// Index predicts, for each candidate replica, how many leading blocks of a
// prompt it holds. The zero value is not usable; call New.
//
// Replica ids passed to the methods that change the index must lie in
// 0..MaxReplica (they panic otherwise); the read-only methods treat any other
// id as a replica that holds nothing.
type Index struct {
	// mu guards everything below, but with a lane (background.go).
	mu     sync.RWMutex
	bg     background
	defCap int
	gen    uint64 // last generation handed to a Record or RecordSpeculative
	shared table
	reps   []*replica // by id; nil for replicas the index knows nothing about
	queue  timeheap.Heap[expiry]
	// nextExpiry is the earliest expiry in queue (math.MaxInt64 when empty),
	// so that Expire can return without the write lock.
	nextExpiry atomic.Int64
	sink       uint64 // warm's loads, kept so that they are not optimised away
}

// New returns an empty index.
func New(cfg Config) *Index {
	x := &Index{defCap: cfg.DefaultCapacityBlocks, shared: newTable()}
	x.bg.lane = cfg.Lane
	x.bg.window = adaptWindow
	if cfg.Lane != nil {
		x.bg.ops = new(opQueue)
	}
	if x.defCap <= 0 {
		x.defCap = DefaultCapacityBlocks
	}
	x.defCap = min(x.defCap, maxCapacity)
	x.nextExpiry.Store(math.MaxInt64)
	return x
}

// Receipt names the blocks one Record, RecordPinned or RecordSpeculative
// inserted, for TakeBack, and the pins a RecordPinned took, for Release. It
// is a small value; the zero Receipt names nothing. A receipt refers to the
// caller's hash slice rather than copying it, so the caller must not modify
// that slice while the receipt may still be taken back or released (and,
// for RecordSpeculative, until the record expires). A Record that inserted
// nothing returns the zero Receipt and keeps no reference.
type Receipt struct {
	hashes  []kvblock.Hash
	gen     uint64
	replica int32
	// pin is, for a RecordPinned, one plus the index of the replica's
	// record of the receipt's pins (replica.pins); 0 otherwise.
	pin int32
}

// checkReplica panics unless r is a valid replica id for a mutation.
func checkReplica(r int) {
	if r < 0 || r > MaxReplica {
		panic(fmt.Sprintf("kvindex: replica %d out of range [0, %d]", r, MaxReplica))
	}
}

// get returns replica r's state, or nil.
func (x *Index) get(r int) *replica {
	if r < 0 || r >= len(x.reps) {
		return nil
	}
	return x.reps[r]
}

// ensure returns replica r's state, creating it with the default capacity.
func (x *Index) ensure(r int) *replica {
	checkReplica(r)
	if r >= len(x.reps) {
		x.reps = append(x.reps, make([]*replica, r+1-len(x.reps))...)
	}
	p := x.reps[r]
	if p == nil {
		p = newReplica(x.defCap)
		x.reps[r] = p
	}
	return p
}

// SetCapacity declares or resizes replica's capacity in blocks (negative
// means 0). Shrinking evicts its least recently used blocks, never pinned
// ones: if the pinned blocks alone exceed the new capacity, the replica
// keeps them (and nothing else) until Release frees the excess.
func (x *Index) SetCapacity(replica, blocks int) {
	x.lock()
	defer x.unlock()
	p := x.ensure(replica)
	p.capacity = min(max(blocks, 0), maxCapacity)
	if p.n <= p.capacity {
		return
	}
	x.trim(p, replica)
	p.compact()
	x.shared.maybeShrink()
}

// trim evicts replica r's least recently used unpinned blocks while it holds
// more than its capacity.
func (x *Index) trim(p *replica, r int) {
	for p.n > p.capacity && p.tail != nilNode {
		x.dropNode(p, r, p.tail)
	}
}

// Forget drops everything about replica, capacity included: it left the
// fleet. Pins go with the blocks: Release and TakeBack of the replica's
// receipts from before Forget are no-ops.
func (x *Index) Forget(replica int) {
	x.lock()
	defer x.unlock()
	checkReplica(replica)
	if x.get(replica) == nil {
		return
	}
	x.clear(replica)
	x.reps[replica] = nil
}

// Clear drops replica's blocks but keeps its capacity: it restarted, or its
// engine reported AllBlocksCleared. Pins go with the blocks: Release and
// TakeBack of pinned receipts from before Clear are no-ops (they never unpin
// blocks recorded after it).
func (x *Index) Clear(replica int) {
	x.lock()
	defer x.unlock()
	checkReplica(replica)
	if x.get(replica) == nil {
		return
	}
	x.clear(replica)
}

func (x *Index) clear(r int) {
	p := x.reps[r]
	for id := range p.nodes {
		if nd := &p.nodes[id]; nd.prev != freeNode && !x.bg.perReplica {
			x.shared.remove(nd.h, r)
		}
	}
	p.reset()
	x.shared.maybeShrink()
}

// Record notes that the prompt whose full blocks are hashes (in order) was
// routed to replica: every block becomes most recently used there, inserted
// if absent. Blocks are touched from last to first, so block 0 ends most
// recent and, under capacity pressure, the replica loses a prompt's tail
// blocks before its head (as vLLM frees a finished request's blocks tail
// first). Over capacity, the replica's least recently used unpinned blocks
// are evicted; when every block it holds is pinned, a block Record would
// insert is the least recently used unpinned one itself, so it is not
// inserted. A replica never seen before gets the default capacity. Pinned
// blocks that Record finds stay pinned (and their recency is settled when
// they are released).
//
// A block Record finds already present becomes confirmed (no longer
// speculative) and is no longer owned by any earlier receipt. The returned
// Receipt lets TakeBack undo the insertions; see Receipt for the aliasing of
// hashes.
func (x *Index) Record(replica int, hashes []kvblock.Hash) Receipt {
	x.lock()
	defer x.unlock()
	return x.record(replica, hashes, kindRecord)
}

// RecordPinned is Record for a request that the replica will now run, and
// additionally pins every block of hashes on replica, as a running vLLM
// request holds references on its blocks: a pinned block is never evicted
// for capacity. Each occurrence of a hash in hashes takes one pin; a block
// is pinned while it holds any, so a block that two receipts pinned needs
// both released.
//
// Capacity counts pinned and unpinned blocks. A block RecordPinned must
// insert evicts the least recently used unpinned block when the replica is
// full; when every block is pinned it is inserted anyway and the replica
// exceeds its capacity (a capacity of 0 included) until Release (or
// TakeBack, Removed, Clear, Forget) brings it back: the engine will hold the
// prompt's blocks while the request runs, whatever else it must drop.
//
// The returned receipt always names (replica, hashes) and the pins, whether
// or not anything was inserted; pass it to Release when the request
// finishes, or to TakeBack if the attempt failed before the engine computed
// the prompt. Until then the caller must not modify hashes.
func (x *Index) RecordPinned(replica int, hashes []kvblock.Hash) Receipt {
	x.lock()
	defer x.unlock()
	// The receipt is known before the insertions: with a lane they are
	// its job (background.go).
	p, gen, ids, rc := x.beginPinned(replica, hashes)
	if x.bg.lane != nil {
		x.handPinned(p, replica, hashes, gen, ids)
		return rc
	}
	x.insert(p, replica, hashes, kindPinned, gen, gen, ids)
	return rc
}

// beginPinned starts a RecordPinned of hashes on replica r: the replica's
// state, the record's generation, the slice its pinned nodes go in and its
// receipt.
func (x *Index) beginPinned(r int, hashes []kvblock.Hash) (p *replica, gen uint64, ids []int32, rc Receipt) {
	p, gen, _ = x.begin(r, kindPinned)
	slot, ids := p.newPins(gen, len(hashes))
	return p, gen, ids, Receipt{hashes: hashes, gen: gen, replica: int32(r), pin: slot}
}

// Release drops the pins that a RecordPinned took: the request finished.
// Blocks whose pin count reaches zero become unpinned and most recently
// used, released from the last block of the prompt to the first so that
// block 0 ends the most recent (as vLLM frees a finished request's blocks
// tail first); then, while the replica is over capacity, its least recently
// used unpinned blocks are evicted (the prompt's own tail first if nothing
// else was unpinned). Blocks removed (by Removed) since the RecordPinned
// are ignored, even if something inserted them again.
//
// Releasing a receipt without pins, one already released or taken back, or
// one whose replica was cleared or forgotten since, is a no-op. It takes
// O(len(hashes)) time.
func (x *Index) Release(r Receipt) {
	if r.pin == 0 {
		return
	}
	x.lock()
	defer x.unlock()
	x.release(r)
}

func (x *Index) release(r Receipt) {
	if r.pin == 0 {
		return
	}
	rep := int(r.replica)
	p := x.get(rep)
	if p == nil {
		return
	}
	ids, ok := p.endPins(r)
	if !ok {
		return
	}
	p.unpin(r.hashes, r.gen, ids)
	x.trim(p, rep)
}

// RecordSpeculative is Record for event-fed mode: the blocks it inserts are
// speculative until a Stored (or Record) confirms them, and Expire drops them
// once now >= expires if nothing confirmed them by then. A confirmed block it
// finds only becomes most recently used (and is no longer owned by an earlier
// receipt). A speculative block it finds, inserted by an earlier speculative
// record, becomes most recently used and passes to this record: it now
// expires at expires, and this receipt's TakeBack removes it.
func (x *Index) RecordSpeculative(replica int, hashes []kvblock.Hash, expires time.Duration) Receipt {
	x.lock()
	defer x.unlock()
	rc := x.record(replica, hashes, kindSpeculative)
	if rc.gen != 0 {
		x.queue.Push(expires, expiry{gen: rc.gen, replica: replica, hashes: hashes})
		top, _ := x.queue.Top()
		x.nextExpiry.Store(int64(top.At))
	}
	return rc
}

// Stored applies an engine's BlockStored event: the blocks are cached on
// replica. Each becomes most recently used there (touched from last to
// first, as in Record), inserted if absent, confirmed if speculative, and no
// longer owned by any receipt. A replica never seen before gets the default
// capacity. Pinned blocks stay pinned, as in Record.
func (x *Index) Stored(replica int, hashes []kvblock.Hash) {
	x.lock()
	defer x.unlock()
	x.record(replica, hashes, kindStored)
}

// Removed applies an engine's BlockRemoved event: replica no longer holds
// the blocks. Unknown blocks are ignored. Pinned blocks are removed too (the
// engine is the truth), pins and all: releasing the receipts that pinned
// them ignores them, even once they are inserted again.
func (x *Index) Removed(replica int, hashes []kvblock.Hash) {
	x.lock()
	defer x.unlock()
	checkReplica(replica)
	p := x.get(replica)
	if p == nil {
		return
	}
	for _, h := range hashes {
		if id := p.lookup(h); id != nilNode {
			x.dropNode(p, replica, id)
		}
	}
}

// TakeBack undoes a Record, RecordPinned or RecordSpeculative whose attempt failed before
// the engine computed the prompt: it removes the blocks that record inserted
// and that nothing (Record, RecordPinned, RecordSpeculative, Stored) has
// touched since.
// Blocks that were present before the record stay, with the recency the
// record gave them. Taking back the zero Receipt, a receipt already taken
// back, or one whose blocks have all been touched, evicted or cleared since
// is a no-op.
//
// Taking back a RecordPinned's receipt first releases its pins, without
// making room: then it removes the blocks it owns as above (pinned blocks
// never: another receipt pinning a block has touched it), and then, while
// the replica is over capacity, evicts its least recently used unpinned
// blocks. Taking back a pinned receipt already released or taken back, or
// whose replica was cleared or forgotten since, is a no-op.
func (x *Index) TakeBack(r Receipt) {
	if r.gen == 0 {
		return
	}
	x.lock()
	defer x.unlock()
	rep := int(r.replica)
	if r.pin == 0 {
		x.dropOwned(rep, r.hashes, r.gen, false)
		return
	}
	p := x.get(rep)
	if p == nil {
		return
	}
	ids, ok := p.endPins(r)
	if !ok {
		return
	}
	p.unpin(r.hashes, r.gen, ids)
	x.dropOwned(rep, r.hashes, r.gen, false)
	x.trim(p, rep)
}

// Expire drops the speculative blocks of every RecordSpeculative whose
// expiry is at or before now and that nothing has confirmed or passed to a
// later speculative record. It returns at once, without the write lock, when
// nothing is due.
func (x *Index) Expire(now time.Duration) {
	if int64(now) < x.nextExpiry.Load() {
		return
	}
	x.lock()
	defer x.unlock()
	for {
		top, ok := x.queue.Top()
		if !ok || top.At > now {
			break
		}
		e := x.queue.Pop().V
		x.dropOwned(e.replica, e.hashes, e.gen, true)
	}
	next := int64(math.MaxInt64)
	if top, ok := x.queue.Top(); ok {
		next = int64(top.At)
	}
	x.nextExpiry.Store(next)
}

// dropOwned removes replica's unpinned nodes among hashes that record gen
// owns; only the speculative ones when specOnly.
func (x *Index) dropOwned(replica int, hashes []kvblock.Hash, gen uint64, specOnly bool) {
	p := x.get(replica)
	if p == nil {
		return
	}
	for _, h := range hashes {
		id := p.lookup(h)
		if id == nilNode || p.nodes[id].pinned() {
			continue
		}
		if s := p.nodes[id].stamp; s&^specBit == gen && (!specOnly || s&specBit != 0) {
			x.dropNode(p, replica, id)
		}
	}
}

type recordKind uint8

const (
	kindRecord recordKind = iota
	kindSpeculative
	kindStored
	kindPinned
)

// record inserts or touches hashes on replica r from last to first (every
// kind but kindPinned: RecordPinned).
func (x *Index) record(r int, hashes []kvblock.Hash, kind recordKind) Receipt {
	p, gen, stamp := x.begin(r, kind)
	if !x.insert(p, r, hashes, kind, gen, stamp, nil) {
		return Receipt{}
	}
	return Receipt{hashes: hashes, gen: gen, replica: int32(r)}
}

// begin starts a record of kind on replica r: the replica's state, and the
// record's generation and stamp (0 for Stored).
func (x *Index) begin(r int, kind recordKind) (p *replica, gen, stamp uint64) {
	p = x.ensure(r)
	if kind != kindStored {
		x.gen++
		gen = x.gen
		stamp = gen
		if kind == kindSpeculative {
			stamp |= specBit
		}
	}
	return p, gen, stamp
}

// insert is record's work: it inserts or touches hashes on replica r (state
// p) from last to first, filling ids with the nodes it pins when kind is
// kindPinned, and reports whether the record owns a block.
func (x *Index) insert(p *replica, r int, hashes []kvblock.Hash, kind recordKind, gen, stamp uint64, ids []int32) bool {
	pin := kind == kindPinned
	owned := false
	x.warm(p, hashes)
	for i := len(hashes) - 1; i >= 0; i-- {
		if x.bg.inJob {
			x.bg.left = i
		}
		h := hashes[i]
		id := p.lookup(h)
		if id == nilNode {
			// Make room by evicting the least recently used unpinned block.
			// With none (every block pinned), an unpinned block would be
			// evicted as soon as inserted; a pinned one goes over capacity.
			if p.n >= p.capacity {
				if p.tail != nilNode {
					x.dropNode(p, r, p.tail)
				} else if !pin {
					continue
				}
			}
			id = p.add(h, stamp, pin)
			if pin {
				ids[i] = id
			}
			x.sharedAdd(h, r)
			owned = owned || stamp != 0
			continue
		}
		if pin {
			ids[i] = id
		}
		nd := &p.nodes[id]
		if nd.pinned() {
			// Out of the LRU list, so touching it changes no recency (its
			// release will). It stays owned only by the record that
			// inserted it, and only while that record alone touches it.
			if pin {
				nd.prev++
			}
			if !pin || nd.stamp&^ownedBit != gen {
				nd.stamp &^= ownedBit
			}
			continue
		}
		switch {
		case nd.stamp == stamp:
			// Inserted by this very record (a repeated hash), or unowned
			// and touched by Stored.
		case kind == kindSpeculative && nd.stamp&specBit != 0:
			nd.stamp = stamp
			owned = true
		default:
			nd.stamp = 0
		}
		if pin {
			p.pin(id, gen)
		} else {
			p.touch(id)
		}
	}
	return owned
}

// warm loads the home slots of hashes in p's table and the shared table,
// about to be probed: independent loads, so that their cache misses
// overlap, where the insert loop's branches take them one at a time. Any
// prompt of two blocks or more gains when its table lines are cold, as a
// proxy's are between requests on a shared machine
// (BenchmarkRecordPinnedCold), and loses nothing when they are warm.
func (x *Index) warm(p *replica, hashes []kvblock.Hash) {
	if len(hashes) < 2 {
		return
	}
	// A job on the lane leaves the shared table's lines with the caller,
	// which applies the job's changes to it when it waits.
	shared := !x.bg.inJob && !x.bg.perReplica
	rs, rmask := p.slots, p.mask
	if len(rs) == 0 && !shared {
		return
	}
	// In a job, the caller may be resizing the shared table: its header
	// is not to be read here at all.
	var ss []entry
	var smask uint64
	if shared {
		ss, smask = x.shared.slots, x.shared.mask
	}
	var acc uint64
	for i := range hashes {
		lo := hashes[i].Lo
		if len(rs) > 0 {
			acc += uint64(rs[uint32(lo)&rmask].ref)
		}
		if shared {
			acc += ss[lo&smask].bits
		}
	}
	x.sink = acc
}

// dropNode removes node id of replica r from the replica and the shared table.
func (x *Index) dropNode(p *replica, r int, id int32) {
	h := p.nodes[id].h
	p.drop(id)
	x.sharedRemove(h, r)
}

// Lookup sets depths[i] to the number of leading blocks of hashes (blocks
// 0..d-1, consecutive) that replicas[i] holds, speculative blocks included.
// It panics unless len(depths) == len(replicas). It only reads the index:
// recency does not change, it runs under the read lock and does not
// allocate.
func (x *Index) Lookup(hashes []kvblock.Hash, replicas []int, depths []int) {
	if len(depths) != len(replicas) {
		panic("kvindex: Lookup needs len(depths) == len(replicas)")
	}
	x.rlock()
	defer x.runlock()
	if x.bg.lane != nil {
		x.adapt()
		if x.bg.perReplica {
			x.walkEach(hashes, replicas, depths)
			return
		}
		defer x.countExtra(depths)
	}
	var low uint64
	maxWord := 0
	for _, r := range replicas {
		switch {
		case r < 0 || r > MaxReplica:
		case r < 64:
			low |= 1 << uint(r)
		default:
			maxWord = max(maxWord, r>>6)
		}
	}
	var d [64]int32
	if low != 0 {
		x.shared.walk(hashes, 0, low, &d)
	}
	for i, r := range replicas {
		switch {
		case r < 0 || r > MaxReplica:
			depths[i] = 0
		case r < 64:
			depths[i] = int(d[r])
		}
	}
	// Replicas beyond 63: one walk per word of ids among the candidates,
	// finding the words 64 at a time without allocating.
	for base := 1; base <= maxWord; base += 64 {
		var need uint64
		for _, r := range replicas {
			if w := r >> 6; r <= MaxReplica && w >= base && w < base+64 {
				need |= 1 << uint(w-base)
			}
		}
		for need != 0 {
			w := base + bits.TrailingZeros64(need)
			need &= need - 1
			var mask uint64
			for _, r := range replicas {
				if r >= 0 && r>>6 == w {
					mask |= 1 << uint(r&63)
				}
			}
			x.shared.walk(hashes, w, mask, &d)
			for i, r := range replicas {
				if r >= 0 && r>>6 == w {
					depths[i] = int(d[r&63])
				}
			}
		}
	}
}

// walkEach is Lookup without the shared table: each candidate's own table,
// block by block.
func (x *Index) walkEach(hashes []kvblock.Hash, replicas []int, depths []int) {
	for i, r := range replicas {
		d := 0
		if p := x.get(r); p != nil {
			for d < len(hashes) && p.lookup(hashes[d]) != nilNode {
				d++
			}
		}
		depths[i] = d
	}
	x.countExtra(depths)
}

// countExtra adds to adapt's window the probes that walking each candidate
// for these depths costs beyond one walk of the shared table.
func (x *Index) countExtra(depths []int) {
	var sum, deepest int
	for _, d := range depths {
		sum += d + 1
		deepest = max(deepest, d)
	}
	x.bg.extra += int64(sum - min(sum, deepest+1))
}

// walk sets d[b] for every bit b of mask to the number of leading blocks of
// hashes whose replica set has bit b set in word w.
func (t *table) walk(hashes []kvblock.Hash, w int, mask uint64, d *[64]int32) {
	alive := mask
	slots, tmask := t.slots, t.mask
	for k := range hashes {
		h := hashes[k]
		var set uint64
		if w == 0 {
			// Inline probe for the common case.
			for i := h.Lo & tmask; ; i = (i + 1) & tmask {
				s := &slots[i]
				if s.live == 0 {
					break
				}
				if s.h == h {
					set = s.bits
					break
				}
			}
		} else {
			set = t.word(h, w)
		}
		if gone := alive &^ set; gone != 0 {
			alive &^= gone
			for ; gone != 0; gone &= gone - 1 {
				d[bits.TrailingZeros64(gone)] = int32(k)
			}
			if alive == 0 {
				return
			}
		}
	}
	for ; alive != 0; alive &= alive - 1 {
		d[bits.TrailingZeros64(alive)] = int32(len(hashes))
	}
}

// Blocks returns the number of blocks the index holds for replica.
func (x *Index) Blocks(replica int) int {
	x.rlock()
	defer x.runlock()
	if p := x.get(replica); p != nil {
		return p.n
	}
	return 0
}

// Capacity returns replica's capacity in blocks: the default for a replica
// whose capacity was never set (or was forgotten).
func (x *Index) Capacity(replica int) int {
	x.rlock()
	defer x.runlock()
	if p := x.get(replica); p != nil {
		return p.capacity
	}
	return x.defCap
}

// Bytes returns the approximate memory the index holds: its tables, slabs,
// queue and (with a lane) Finish's copies, counted by capacity, not by use.
func (x *Index) Bytes() int64 {
	x.rlock()
	defer x.runlock()
	n := int64(unsafe.Sizeof(*x))
	n += int64(cap(x.shared.slots)) * int64(unsafe.Sizeof(entry{}))
	n += int64(cap(x.shared.ext)) * int64(unsafe.Sizeof(extWord{}))
	n += int64(cap(x.reps)) * int64(unsafe.Sizeof((*replica)(nil)))
	n += int64(x.queue.Cap()) * int64(unsafe.Sizeof(timeheap.Item[expiry]{}))
	for _, p := range x.reps {
		if p == nil {
			continue
		}
		n += int64(unsafe.Sizeof(*p))
		n += int64(cap(p.nodes)) * int64(unsafe.Sizeof(node{}))
		n += int64(cap(p.slots)) * int64(unsafe.Sizeof(rslot{}))
		n += int64(cap(p.pins))*8 + int64(cap(p.pinFree))*4 + int64(cap(p.pinNodes))*int64(unsafe.Sizeof([]int32(nil)))
		for _, ids := range p.pinNodes {
			n += int64(cap(ids)) * 4
		}
	}
	for i := range x.bg.ring { // Finish's copies, with a lane
		j := &x.bg.ring[i]
		n += int64(cap(j.answer)+cap(j.prompt)) * int64(unsafe.Sizeof(kvblock.Hash{}))
	}
	return n
}

// PinnedBlocks returns how many distinct blocks RecordPinned receipts
// currently pin on replica: the KV footprint of its requests in flight, a
// prefix shared by several of them counted once.
func (x *Index) PinnedBlocks(replica int) int {
	x.rlock()
	defer x.runlock()
	if replica < 0 || replica > MaxReplica {
		return 0
	}
	p := x.get(replica)
	if p == nil {
		return 0
	}
	return p.npinned
}

// PinnedDepth returns how many leading blocks of hashes RecordPinned
// receipts pin on replica: the part of a prompt that requests in flight
// there already hold, so a new request sharing it adds nothing for it.
// Pins cover whole prompt prefixes (a pinned block's ancestors are pinned
// too), so the depth is found by binary search.
func (x *Index) PinnedDepth(replica int, hashes []kvblock.Hash) int {
	x.rlock()
	defer x.runlock()
	if replica < 0 || replica > MaxReplica {
		return 0
	}
	p := x.get(replica)
	if p == nil || p.npinned == 0 {
		return 0
	}
	pinned := func(i int) bool {
		id := p.lookup(hashes[i])
		return id != nilNode && p.nodes[id].pinned()
	}
	lo, hi := 0, len(hashes) // blocks before lo are pinned, from hi on not
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if pinned(mid) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}
