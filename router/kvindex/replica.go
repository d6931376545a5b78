package kvindex

import "github.com/inferrail/inferrail/engine/kvblock"

// node is one block held by one replica. An unpinned node is a link in the
// replica's LRU list; a pinned node is in no list (as vLLM keeps blocks that
// running requests reference out of its free queue) and reuses its links
// for its pin count.
type node struct {
	h kvblock.Hash
	// prev, next: towards the MRU head and towards the LRU tail while the
	// node is in the LRU list; next links the free list while the node is
	// free (prev is freeNode then). While the node is pinned, next is
	// pinnedNode and prev its pin count (at least 1).
	prev, next int32
	// stamp, for a node in the LRU list: the generation of the Record,
	// RecordPinned or RecordSpeculative that owns the node (inserted it and
	// nothing touched it since), 0 when none, with specBit set while the
	// node is speculative. For a pinned node: the generation at which its
	// current pinned period began (the RecordPinned that took its first
	// pin), with ownedBit set when that record also owns the node. A pinned
	// node is never speculative, and its owner can only be that record: any
	// later touch ends ownership.
	stamp uint64
}

const (
	nilNode    = -1
	pinnedNode = -2 // next of a pinned node
	freeNode   = -3 // prev of a free node
	specBit    = 1 << 63
	ownedBit   = 1 << 62 // generations stay far below 2^62
)

func (nd *node) pinned() bool { return nd.next == pinnedNode }

// owner returns the stamp the node would have in the LRU list: the owning
// record's generation (with specBit when speculative), or 0.
func (nd *node) owner() uint64 {
	if !nd.pinned() {
		return nd.stamp
	}
	if nd.stamp&ownedBit != 0 {
		return nd.stamp &^ ownedBit
	}
	return 0
}

// rslot is one slot of a replica's table from block hash to node: the low 32
// bits of the hash's Lo (the home index and a tag) and the node's index plus
// one (0 when the slot is empty). A slot matches a hash only while its node
// is in use and holds that hash, so a removed node's slot stays behind,
// stale, until the table is rebuilt (replica.drop).
type rslot struct {
	lo  uint32
	ref uint32
}

// replica is one replica's shadow LRU: its nodes in a slab, the unpinned
// ones linked from the most recently used (head) to the least (tail), all
// found by hash through an open-addressing table at most a quarter full
// (short probes and deletion shifts: measured faster than half full, for
// twice the 8-byte slots). It holds at most capacity nodes, except that
// pinned nodes are never evicted: when it holds more, every node is pinned
// (the LRU list is empty).
type replica struct {
	capacity   int
	n          int // nodes, pinned ones included
	npinned    int
	head, tail int32
	free       int32
	nodes      []node
	slots      []rslot
	mask       uint32
	stale      int // slots left behind by removed nodes
	// pins holds the replica's live pinned receipts: slot i holds the
	// generation of the RecordPinned whose Receipt.pin is i+1, or 0 when
	// the slot is free (its index then on pinFree). A receipt's pins are
	// held exactly while its slot holds its generation.
	pins    []uint64
	pinFree []int32
	// pinNodes[i] holds, for the receipt of pins[i], the node that each of
	// its hashes was pinned in (by index in the hashes), so that its release
	// finds them without the table. A node removed since is found by its
	// hash no longer matching (or being reused by a later record, which its
	// stamp tells); compact renumbers them with the slab.
	pinNodes [][]int32
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
		if s.lo == lo {
			if nd := &p.nodes[s.ref-1]; nd.h == h && nd.prev != freeNode {
				return int32(s.ref - 1)
			}
		}
	}
}

// add inserts h, known to be absent, as the most recently used node with
// the given stamp, or as a node pinned once when pinned (stamp is then the
// pinning record's generation, and the node is owned by it). Eviction is the
// caller's business: add never evicts, and grows the slab past the capacity
// if it must. It returns the new node.
func (p *replica) add(h kvblock.Hash, stamp uint64, pinned bool) int32 {
	if 4*(p.n+1) > len(p.slots) {
		p.rebuild(max(minTableSize, 2*len(p.slots)))
	}
	id := p.free
	if id != nilNode {
		p.free = p.nodes[id].next
	} else {
		if len(p.nodes) == cap(p.nodes) {
			// Grow the slab by doubling, but never past the capacity, so
			// that a full replica's slab is exactly its capacity; past it
			// (pinned blocks over capacity) by a quarter.
			l := len(p.nodes)
			c := min(max(16, 2*l), p.capacity)
			if l >= p.capacity {
				c = l + max(16, l/4)
			}
			nodes := make([]node, l, c)
			copy(nodes, p.nodes)
			p.nodes = nodes
		}
		p.nodes = p.nodes[:len(p.nodes)+1]
		id = int32(len(p.nodes) - 1)
	}
	if pinned {
		p.nodes[id] = node{h: h, prev: 1, next: pinnedNode, stamp: stamp | ownedBit}
		p.npinned++
	} else {
		p.nodes[id] = node{h: h, prev: nilNode, next: nilNode, stamp: stamp}
		p.pushFront(id)
	}
	p.tabInsert(h, id)
	p.n++
	return id
}

// drop removes node id, pinned or not. Its table slot stays, stale: a
// probe and backward shift per eviction, at a random place in a table that
// outgrows the cache, cost more than rebuilding the table, in order, once
// the stale slots fill a quarter of it (it stays at most half full).
func (p *replica) drop(id int32) {
	if p.nodes[id].pinned() {
		p.npinned--
	} else {
		p.unlink(id)
	}
	p.nodes[id] = node{prev: freeNode, next: p.free}
	p.free = id
	p.n--
	if p.stale++; 4*p.stale >= len(p.slots) {
		p.rebuild(len(p.slots))
	}
}

// touch makes node id, which must be unpinned, the most recently used.
func (p *replica) touch(id int32) {
	if p.head == id {
		return
	}
	p.unlink(id)
	p.pushFront(id)
}

// pin takes node id, which must be unpinned, out of the LRU list with one
// pin, starting a pinned period at generation gen. The node must not be
// owned (a record that pins a node it did not insert has just touched it).
func (p *replica) pin(id int32, gen uint64) {
	p.unlink(id)
	nd := &p.nodes[id]
	nd.prev, nd.next, nd.stamp = 1, pinnedNode, gen
	p.npinned++
}

// unpin releases the pins that the receipt of generation gen took on hashes,
// from the last block to the first: a block whose count reaches zero becomes
// the most recently used, so block 0 ends the most recent. ids are the nodes
// the receipt pinned (replica.pinNodes). A block holds that receipt's pin
// only if it has been pinned since before (or at) gen: a block removed and
// inserted again since is another block, and a node that no longer holds
// its hash was removed (the hash, if present again, is in a node inserted
// since).
func (p *replica) unpin(hashes []kvblock.Hash, gen uint64, ids []int32) {
	for i := len(hashes) - 1; i >= 0; i-- {
		id := ids[i]
		if id < 0 || int(id) >= len(p.nodes) {
			continue
		}
		nd := &p.nodes[id]
		if nd.h != hashes[i] || !nd.pinned() || nd.stamp&^ownedBit > gen {
			continue
		}
		if nd.prev--; nd.prev > 0 {
			continue
		}
		nd.stamp = nd.owner()
		p.npinned--
		p.pushFront(id)
	}
}

// newPins records a live pinned receipt of generation gen for n hashes and
// returns its Receipt.pin and the slice to fill with the nodes it pins
// (pinNodes), of length n.
func (p *replica) newPins(gen uint64, n int) (int32, []int32) {
	var i int32
	if k := len(p.pinFree); k > 0 {
		i = p.pinFree[k-1]
		p.pinFree = p.pinFree[:k-1]
		p.pins[i] = gen
	} else {
		p.pins = append(p.pins, gen)
		p.pinNodes = append(p.pinNodes, nil)
		i = int32(len(p.pins) - 1)
	}
	ids := p.pinNodes[i][:0]
	if cap(ids) < n {
		ids = make([]int32, 0, n)
	}
	ids = ids[:n]
	p.pinNodes[i] = ids
	return i + 1, ids
}

// endPins ends the pinned receipt r and returns the nodes it pinned, ok
// whether it was live (its pins held): false when it was released, taken
// back, or its replica cleared or forgotten since. The nodes stay valid
// until the next newPins.
func (p *replica) endPins(r Receipt) (ids []int32, ok bool) {
	i := int(r.pin) - 1
	if i < 0 || i >= len(p.pins) || p.pins[i] != r.gen {
		return nil, false
	}
	p.pins[i] = 0
	p.pinFree = append(p.pinFree, int32(i))
	return p.pinNodes[i], true
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
	p.tabPut(rslot{lo: uint32(h.Lo), ref: uint32(id) + 1})
}

func (p *replica) tabPut(s rslot) {
	slots, mask := p.slots, p.mask
	for i := s.lo & mask; ; i = (i + 1) & mask {
		if slots[i].ref == 0 {
			slots[i] = s
			return
		}
	}
}

// rebuild refills the table, with size slots, from the nodes in use: no
// stale slots.
func (p *replica) rebuild(size int) {
	if size == len(p.slots) {
		clear(p.slots)
	} else {
		p.slots = make([]rslot, size)
		p.mask = uint32(size - 1)
	}
	for id := range p.nodes {
		if nd := &p.nodes[id]; nd.prev != freeNode {
			p.tabInsert(nd.h, int32(id))
		}
	}
	p.stale = 0
}

// reset drops every node and every pinned receipt but keeps the slab and
// tables for reuse.
func (p *replica) reset() {
	p.nodes = p.nodes[:0]
	clear(p.slots)
	p.head, p.tail, p.free, p.n, p.npinned, p.stale = nilNode, nilNode, nilNode, 0, 0, 0
	p.pins, p.pinFree, p.pinNodes = p.pins[:0], p.pinFree[:0], p.pinNodes[:0]
}

// compact moves the nodes into a slab and table sized for the current
// count, after a capacity shrink left them much larger than needed.
func (p *replica) compact() {
	if cap(p.nodes) <= 2*max(16, p.capacity) && len(p.slots) <= max(minTableSize, 8*p.n) {
		return
	}
	nodes := make([]node, p.n, min(max(16, p.n), max(p.capacity, p.n)))
	// moved maps old node ids to new ones (nilNode for free nodes), for the
	// live receipts' pinNodes.
	moved := make([]int32, len(p.nodes))
	for i := range moved {
		moved[i] = nilNode
	}
	k := int32(0)
	for id := p.head; id != nilNode; id = p.nodes[id].next {
		nodes[k] = p.nodes[id]
		nodes[k].prev, nodes[k].next = k-1, k+1
		moved[id] = k
		k++
	}
	p.head, p.tail = nilNode, nilNode
	if k > 0 {
		nodes[k-1].next = nilNode
		p.head, p.tail = 0, k-1
	}
	// The pinned nodes, in no list.
	for id := range p.nodes {
		if p.nodes[id].pinned() {
			nodes[k] = p.nodes[id]
			moved[id] = int32(k)
			k++
		}
	}
	for i, gen := range p.pins {
		if gen == 0 {
			continue
		}
		for j, id := range p.pinNodes[i] {
			if id >= 0 && int(id) < len(moved) {
				p.pinNodes[i][j] = moved[id]
			}
		}
	}
	p.nodes, p.free = nodes, nilNode
	size := minTableSize
	for size < 4*p.n {
		size *= 2
	}
	p.slots = make([]rslot, size)
	p.mask = uint32(size - 1)
	p.stale = 0
	for id := range p.nodes {
		p.tabInsert(p.nodes[id].h, int32(id))
	}
}
