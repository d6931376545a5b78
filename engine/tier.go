package engine

import "github.com/inferrail/inferrail/engine/kvblock"

// Medium names of the lower KV tiers, as vLLM's KV events name them.
const (
	MediumCPU  = "CPU"
	MediumDisk = "DISK"
)

// tier is a lower KV tier (CPU or disk): an LRU of at most cap block
// hashes. Its entries are blocks (only their hash is used; the LRU links are
// beside them in links), so that its hash index is the pool's hashTable; both grow with the
// content, up to cap entries, instead of being allocated up front.
type tier struct {
	medium     string
	cap        int
	nodes      []block
	links      []link // by entry, as nodes
	head, tail int32  // LRU order: head is the least recently used
	free       []int32
	index      hashTable
}

// link is a tier entry's place in the LRU list.
type link struct{ prev, next int32 }

func newTier(medium string, capacity int) *tier {
	return &tier{medium: medium, cap: capacity, head: nilBlock, tail: nilBlock, index: newHashTable(min(capacity, 256))}
}

func (t *tier) len() int { return t.index.len() }

// get returns the entry holding h.
func (t *tier) get(h kvblock.Hash) (int32, bool) { return t.index.get(h, t.nodes) }

func (t *tier) unlink(id int32) {
	n := &t.links[id]
	if n.prev != nilBlock {
		t.links[n.prev].next = n.next
	} else {
		t.head = n.next
	}
	if n.next != nilBlock {
		t.links[n.next].prev = n.prev
	} else {
		t.tail = n.prev
	}
	n.prev, n.next = nilBlock, nilBlock
}

func (t *tier) pushBack(id int32) {
	n := &t.links[id]
	n.prev, n.next = t.tail, nilBlock
	if t.tail != nilBlock {
		t.links[t.tail].next = id
	} else {
		t.head = id
	}
	t.tail = id
}

// touch makes an entry the most recently used.
func (t *tier) touch(id int32) {
	if t.tail != id {
		t.unlink(id)
		t.pushBack(id)
	}
}

// remove drops an entry.
func (t *tier) remove(id int32) {
	t.index.deleteIf(t.nodes[id].hash, id)
	t.unlink(id)
	t.nodes[id].hash = kvblock.Hash{}
	t.free = append(t.free, id)
}

// popLRU drops the least recently used entry and returns its hash; the
// tier is not empty.
func (t *tier) popLRU() kvblock.Hash {
	id := t.head
	h := t.nodes[id].hash
	t.remove(id)
	return h
}

// insert adds h, which the tier does not hold, as the most recently used
// entry; the tier has room (len < cap).
func (t *tier) insert(h kvblock.Hash) {
	var id int32
	if k := len(t.free); k > 0 {
		id = t.free[k-1]
		t.free = t.free[:k-1]
	} else {
		id = int32(len(t.nodes))
		t.nodes = append(t.nodes, block{})
		t.links = append(t.links, link{prev: nilBlock, next: nilBlock})
	}
	if 4*(t.index.len()+1) > len(t.index.slots) {
		t.grow()
	}
	t.nodes[id].hash = h
	t.index.insert(h, id, t.nodes)
	t.pushBack(id)
}

// grow doubles the hash index, keeping it at most a quarter full.
func (t *tier) grow() {
	idx := hashTable{slots: make([]slot, 2*len(t.index.slots)), mask: uint32(2*len(t.index.slots) - 1)}
	for id := t.head; id != nilBlock; id = t.links[id].next {
		idx.insert(t.nodes[id].hash, id, t.nodes)
	}
	t.index = idx
}

// clear empties the tier, keeping its memory.
func (t *tier) clear() {
	t.index.clear()
	t.nodes = t.nodes[:0]
	t.links = t.links[:0]
	t.free = t.free[:0]
	t.head, t.tail = nilBlock, nilBlock
}

// each calls f for every hash from the least to the most recently used.
func (t *tier) each(f func(kvblock.Hash)) {
	for id := t.head; id != nilBlock; id = t.links[id].next {
		f(t.nodes[id].hash)
	}
}

// tierEvent records a hash entering (BlockStored) or leaving (BlockRemoved)
// a lower tier, merged into the previous event when that is of the same
// kind and medium.
func (p *pool) tierEvent(kind KVEventKind, medium string, h kvblock.Hash) {
	if p.events == nil {
		return
	}
	evs := *p.events
	if k := len(evs); k > 0 && evs[k-1].Kind == kind && evs[k-1].Medium == medium && !evs[k-1].HasParent {
		evs[k-1].BlockHashes = append(evs[k-1].BlockHashes, h)
		return
	}
	ev := KVEvent{Kind: kind, BlockHashes: []kvblock.Hash{h}, Medium: medium}
	if kind == BlockStored {
		ev.BlockSize = p.blockSize
	}
	*p.events = append(evs, ev)
}

// offload moves the hash of an evicted GPU block to the CPU tier as its
// most recently used entry (from the disk tier, if it was there). A full
// CPU tier first passes its least recently used hash to the disk tier, or
// drops it; a full disk tier drops its own. Offload writes are not priced:
// vLLM's offloading copies run asynchronously, off the step.
func (p *pool) offload(h kvblock.Hash) {
	cpu := p.cpu
	if id, ok := cpu.get(h); ok {
		cpu.touch(id)
		return
	}
	if p.disk != nil {
		if id, ok := p.disk.get(h); ok {
			p.disk.remove(id)
			p.tierEvent(BlockRemoved, MediumDisk, h)
		}
	}
	if cpu.len() >= cpu.cap {
		old := cpu.popLRU()
		p.tierEvent(BlockRemoved, MediumCPU, old)
		if d := p.disk; d != nil {
			if d.len() >= d.cap {
				p.tierEvent(BlockRemoved, MediumDisk, d.popLRU())
			}
			d.insert(old)
			p.tierEvent(BlockStored, MediumDisk, old)
		}
	}
	cpu.insert(h)
	p.tierEvent(BlockStored, MediumCPU, h)
}

// tierLookup continues a GPU prefix hit in the lower tiers: it counts the
// leading hashes held by the CPU or the disk tier, stopping at the first
// held by neither.
func (p *pool) tierLookup(hashes []kvblock.Hash) (cpuHits, diskHits int) {
	for _, h := range hashes {
		if _, ok := p.cpu.get(h); ok {
			cpuHits++
			continue
		}
		if p.disk == nil {
			break
		}
		if _, ok := p.disk.get(h); !ok {
			break
		}
		diskHits++
	}
	return cpuHits, diskHits
}

// tierTouch marks hashes, which tierLookup found, as the most recently
// used of their tiers: a load reads them.
func (p *pool) tierTouch(hashes []kvblock.Hash) {
	for _, h := range hashes {
		if id, ok := p.cpu.get(h); ok {
			p.cpu.touch(id)
		} else if id, ok := p.disk.get(h); ok {
			p.disk.touch(id)
		}
	}
}

// resetTiers empties the lower tiers, with an AllBlocksCleared event for
// each.
func (p *pool) resetTiers() {
	for _, t := range [...]*tier{p.cpu, p.disk} {
		if t == nil {
			continue
		}
		t.clear()
		if p.events != nil {
			*p.events = append(*p.events, KVEvent{Kind: AllBlocksCleared, Medium: t.medium})
		}
	}
}
