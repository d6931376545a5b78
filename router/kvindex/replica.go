package kvindex

import "github.com/inferrail/inferrail/engine/kvblock"

// node is one block held by one replica: a link in the replica's LRU list.
type node struct {
	h          kvblock.Hash
	prev, next int32 // towards the MRU head, towards the LRU tail; next links the free list
	// stamp is the generation of the Record or RecordSpeculative that owns
	// the node (inserted it and nothing touched it since), 0 when none, with
	// specBit set while the node is speculative.
	stamp uint64
}

const (
	nilNode = -1
	specBit = 1 << 63
)

// rslot is one slot of a replica's table from block hash to node: the low 32
// bits of the hash's Lo (the home index and a tag) and the node's index plus
// one (0 when the slot is empty).
type rslot struct {
	lo  uint32
	ref uint32
}

// replica is one replica's shadow LRU: at most capacity nodes in a slab,
// linked from the most recently used (head) to the least (tail), found by
// hash through an open-addressing table at most half full.
type replica struct {
	capacity   int
	n          int
	head, tail int32
	free       int32
	nodes      []node
	slots      []rslot
	mask       uint32
}

func newReplica(capacity int) *replica {
	return &replica{capacity: capacity, head: nilNode, tail: nilNode, free: nilNode}
}

// lookup returns the node holding h, or nilNode.
func (p *replica) lookup(h kvblock.Hash) int32 {
	if p.n == 0 {
		return nilNode
	}
	lo := uint32(h.Lo)
	slots, mask := p.slots, p.mask
	for i := lo & mask; ; i = (i + 1) & mask {
		s := slots[i]
		if s.ref == 0 {
			return nilNode
		}
		if s.lo == lo && p.nodes[s.ref-1].h == h {
			return int32(s.ref - 1)
		}
	}
}

// add inserts h, known to be absent, as the most recently used node with
// the given stamp. The replica must have room (n < capacity).
func (p *replica) add(h kvblock.Hash, stamp uint64) {
	if 2*(p.n+1) > len(p.slots) {
		size := max(minTableSize, 2*len(p.slots))
		p.rehash(size)
	}
	id := p.free
	if id != nilNode {
		p.free = p.nodes[id].next
	} else {
		if len(p.nodes) == cap(p.nodes) {
			// Grow the slab by doubling, but never past the capacity, so
			// that a full replica's slab is exactly its capacity.
			nodes := make([]node, len(p.nodes), min(max(16, 2*len(p.nodes)), p.capacity))
			copy(nodes, p.nodes)
			p.nodes = nodes
		}
		p.nodes = p.nodes[:len(p.nodes)+1]
		id = int32(len(p.nodes) - 1)
	}
	p.nodes[id] = node{h: h, prev: nilNode, next: nilNode, stamp: stamp}
	p.pushFront(id)
	p.tabInsert(h, id)
	p.n++
}

// drop removes node id.
func (p *replica) drop(id int32) {
	p.tabDelete(p.nodes[id].h, id)
	p.unlink(id)
	p.nodes[id] = node{next: p.free}
	p.free = id
	p.n--
}

// touch makes node id the most recently used.
func (p *replica) touch(id int32) {
	if p.head == id {
		return
	}
	p.unlink(id)
	p.pushFront(id)
}

func (p *replica) pushFront(id int32) {
	nd := &p.nodes[id]
	nd.prev, nd.next = nilNode, p.head
	if p.head != nilNode {
		p.nodes[p.head].prev = id
	} else {
		p.tail = id
	}
	p.head = id
}

func (p *replica) unlink(id int32) {
	nd := &p.nodes[id]
	if nd.prev != nilNode {
		p.nodes[nd.prev].next = nd.next
	} else {
		p.head = nd.next
	}
	if nd.next != nilNode {
		p.nodes[nd.next].prev = nd.prev
	} else {
		p.tail = nd.prev
	}
	nd.prev, nd.next = nilNode, nilNode
}

// tabInsert maps h to id; h must be absent and the table must have room.
func (p *replica) tabInsert(h kvblock.Hash, id int32) {
	lo := uint32(h.Lo)
	slots, mask := p.slots, p.mask
	for i := lo & mask; ; i = (i + 1) & mask {
		if slots[i].ref == 0 {
			slots[i] = rslot{lo: lo, ref: uint32(id) + 1}
			return
		}
	}
}

// tabDelete removes the mapping of h to id, with backward-shift deletion.
func (p *replica) tabDelete(h kvblock.Hash, id int32) {
	ref := uint32(id) + 1
	slots, mask := p.slots, p.mask
	i := uint32(h.Lo) & mask
	for slots[i].ref != ref {
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := slots[j]
		if s.ref == 0 {
			break
		}
		if (j-s.lo)&mask >= (j-i)&mask {
			slots[i] = s
			i = j
		}
	}
	slots[i] = rslot{}
}

// rehash rebuilds the table with size slots.
func (p *replica) rehash(size int) {
	p.slots = make([]rslot, size)
	p.mask = uint32(size - 1)
	for id := p.head; id != nilNode; id = p.nodes[id].next {
		p.tabInsert(p.nodes[id].h, id)
	}
}

// reset drops every node but keeps the slab and table for reuse.
func (p *replica) reset() {
	p.nodes = p.nodes[:0]
	clear(p.slots)
	p.head, p.tail, p.free, p.n = nilNode, nilNode, nilNode, 0
}

// compact moves the nodes into a slab and table sized for the current
// count, after a capacity shrink left them much larger than needed.
func (p *replica) compact() {
	if cap(p.nodes) <= 2*max(16, p.capacity) && len(p.slots) <= max(minTableSize, 4*p.n) {
		return
	}
	nodes := make([]node, p.n, min(max(16, p.n), max(p.capacity, p.n)))
	k := int32(0)
	for id := p.head; id != nilNode; id = p.nodes[id].next {
		nodes[k] = p.nodes[id]
		nodes[k].prev, nodes[k].next = k-1, k+1
		k++
	}
	if k > 0 {
		nodes[k-1].next = nilNode
		p.head, p.tail = 0, k-1
	}
	p.nodes, p.free = nodes, nilNode
	size := minTableSize
	for size < 2*p.n {
		size *= 2
	}
	p.rehash(size)
}
