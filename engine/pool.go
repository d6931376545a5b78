package engine

import "github.com/inferrail/inferrail/engine/kvblock"

// block is one KV block slot.
type block struct {
	ref int32
	// qpos is the block's entry in the free queue while inFree.
	qpos   int32
	inFree bool
	hashed bool
	hash   kvblock.Hash
}

const nilBlock = int32(-1)

// pool is the KV block pool with vLLM v1's prefix cache: blocks with a
// reference count of zero sit in an LRU free queue (front evicted first); a
// free block that still carries a hash stays findable in the cache until its
// slot is reallocated.
//
// The free queue is a FIFO of block ids in freeing order, not a linked list:
// a block reused from the cache while free only leaves its entry behind,
// stale (a live entry is the one its block's qpos names), and allocation
// skips stale entries at the front. So allocating a run of blocks reads the
// queue in order and loads the blocks independently, where a list chased
// one block's links to the next, a cache miss each, and a reuse touched two
// neighbours. The queue is compacted when it fills its 4x-the-blocks buffer.
type pool struct {
	blocks []block
	// sink keeps alloc's loads ahead from being compiled away.
	sink   uint32
	queue  []int32 // the free queue: queue[qhead:] (capacity fixed)
	qhead  int
	nfree  int
	cached hashTable
	// ncached counts the cached blocks; stale the slots of cached that
	// name blocks evicted since (alloc leaves them: rebuildCached).
	ncached, stale int
	caching        bool
	events         *[]KVEvent // nil when KV events are off
	blockSize      int
	// The lower tiers (tier.go): nil when off; disk only with cpu.
	cpu, disk *tier
	// hand holds the insertions store sets aside (handoff.go).
	hand handOff
}

func newPool(n, blockSize int, caching bool) *pool {
	p := &pool{
		blocks:    make([]block, n),
		queue:     make([]int32, 0, 4*n+16),
		cached:    newHashTable(n),
		caching:   caching,
		blockSize: blockSize,
	}
	for i := range p.blocks {
		p.pushBack(int32(i))
	}
	return p
}

// pushBack puts block id at the back of the free queue.
func (p *pool) pushBack(id int32) {
	if len(p.queue) == cap(p.queue) {
		p.compact()
	}
	b := &p.blocks[id]
	b.inFree = true
	b.qpos = int32(len(p.queue))
	p.queue = append(p.queue, id)
	p.nfree++
}

// live reports whether queue entry i is its block's.
func (p *pool) live(i int) bool {
	b := &p.blocks[p.queue[i]]
	return b.inFree && int(b.qpos) == i
}

// compact moves the free queue's live entries to the front of its buffer,
// in order. At most len(blocks) are live, so the next compaction is at
// least 3x that many pushes away.
func (p *pool) compact() {
	q := p.queue
	w := 0
	for i := p.qhead; i < len(q); i++ {
		if p.live(i) {
			id := q[i]
			q[w] = id
			p.blocks[id].qpos = int32(w)
			w++
		}
	}
	p.queue, p.qhead = q[:w], 0
}

// unlink takes free block id out of the free queue (its entry goes stale).
func (p *pool) unlink(id int32) {
	p.blocks[id].inFree = false
	p.nfree--
}

// front returns the block at the front of the free queue, dropping the
// stale entries before it. The caller has checked nfree > 0.
func (p *pool) front() int32 {
	for !p.live(p.qhead) {
		p.qhead++
	}
	return p.queue[p.qhead]
}

// lookup returns how many leading hashes are cached, appending their block
// ids to ids.
func (p *pool) lookup(hashes []kvblock.Hash, ids []int32) []int32 {
	if !p.caching {
		return ids
	}
	for _, h := range hashes {
		id, ok := p.cached.get(h, p.blocks)
		if !ok {
			break
		}
		ids = append(ids, id)
	}
	return ids
}

// freeAmong counts how many of ids are in the free queue (reusing them takes
// them out of the free count).
func (p *pool) freeAmong(ids []int32) int {
	n := 0
	for _, id := range ids {
		if p.blocks[id].ref == 0 {
			n++
		}
	}
	return n
}

// touch takes a reference on a cached block.
func (p *pool) touch(id int32) {
	b := &p.blocks[id]
	if b.ref == 0 && b.inFree {
		p.unlink(id)
	}
	b.ref++
}

// allocAhead is how far ahead alloc loads the blocks to come.
const allocAhead = 4

// alloc takes the least recently freed block, evicting its cached hash.
// The caller has checked nfree > 0.
func (p *pool) alloc() int32 {
	id := p.front()
	p.qhead++
	if i := p.qhead + allocAhead; i < len(p.queue) {
		// Load a block that a later allocation will take, so that its
		// cache miss overlaps this one's: a step allocates runs of them.
		p.sink += uint32(p.blocks[p.queue[i]].qpos)
	}
	p.unlink(id)
	b := &p.blocks[id]
	if b.hashed {
		// The block's slot in cached stays, stale: it names a block whose
		// hash is no longer the key (the zero hash, or one stored since,
		// under its own slot), so no lookup matches it. Deleting it here
		// was a random probe and shift on the prefix cache's hottest path;
		// rebuilding the table once the stale slots reach the block count
		// touches it in order (the table stays at most half full).
		if p.events != nil {
			*p.events = append(*p.events, KVEvent{Kind: BlockRemoved, BlockHashes: []kvblock.Hash{b.hash}, Medium: MediumGPU})
		}
		if p.cpu != nil {
			p.offload(b.hash)
		}
		b.hashed = false
		b.hash = kvblock.Hash{}
		p.ncached--
		if p.stale++; p.stale >= len(p.blocks) {
			p.rebuildCached()
		}
	}
	b.ref = 1
	return id
}

// rebuildCached rebuilds cached from the cached blocks, without the stale
// slots.
func (p *pool) rebuildCached() {
	p.cached.clear()
	for i := range p.blocks {
		if b := &p.blocks[i]; b.hashed {
			p.cached.insert(b.hash, int32(i), p.blocks)
		}
	}
	p.stale = 0
}

// release drops one reference on each block, tail first, so that a
// sequence's last blocks are evicted before its first ones.
func (p *pool) release(ids []int32) {
	for i := len(ids) - 1; i >= 0; i-- {
		id := ids[i]
		b := &p.blocks[id]
		b.ref--
		if b.ref == 0 {
			p.pushBack(id)
		}
	}
}

// store registers full blocks ids[from:to] under hashes[from:to]. A hash that
// is already cached in another block is left there (the new block stays
// anonymous), as vLLM keeps the first copy findable.
func (p *pool) store(ids []int32, hashes []kvblock.Hash, from, to int) {
	if !p.caching || from >= to {
		return
	}
	if p.hand.on {
		p.hand.note(ids, hashes, from, to)
		return
	}
	var stored []kvblock.Hash
	for k := from; k < to; k++ {
		id := ids[k]
		b := &p.blocks[id]
		if b.hashed {
			continue
		}
		h := hashes[k]
		if !p.cached.insert(h, id, p.blocks) {
			continue // another block already caches this content
		}
		b.hashed, b.hash = true, h
		p.ncached++
		if p.events != nil {
			stored = append(stored, h)
		}
	}
	if p.events != nil && len(stored) > 0 {
		ev := KVEvent{Kind: BlockStored, BlockHashes: stored, BlockSize: p.blockSize, Medium: MediumGPU}
		if from > 0 {
			ev.ParentBlockHash, ev.HasParent = hashes[from-1], true
		}
		*p.events = append(*p.events, ev)
	}
}

// reset drops every cached hash, the lower tiers' too; it is only valid
// when no block is referenced.
func (p *pool) reset() bool {
	if p.nfree != len(p.blocks) {
		return false
	}
	for i := range p.blocks {
		p.blocks[i].hashed = false
		p.blocks[i].hash = kvblock.Hash{}
	}
	p.cached.clear()
	p.ncached, p.stale = 0, 0
	if p.events != nil {
		*p.events = append(*p.events, KVEvent{Kind: AllBlocksCleared, Medium: MediumGPU})
	}
	p.resetTiers()
	return true
}
