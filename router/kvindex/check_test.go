package kvindex

import (
	"fmt"
	"math/bits"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// check verifies the index's internal consistency: every replica's list,
// slab, free list and table agree; and the shared table holds exactly the
// union of the replicas' blocks, each with exactly the replicas holding it.
func (x *Index) check() error {
	x.rlock()
	defer x.runlock()
	total := 0
	for r, p := range x.reps {
		if p == nil {
			continue
		}
		if err := p.check(); err != nil {
			return fmt.Errorf("replica %d: %w", r, err)
		}
		total += p.n
		for _, g := range p.pins {
			if g > x.gen {
				return fmt.Errorf("replica %d: pinned receipt of generation %d, index at %d", r, g, x.gen)
			}
		}
	}
	if x.bg.perReplica {
		// Lookups walk the replicas' own tables: no shared table is kept.
		if x.shared.n != 0 {
			return fmt.Errorf("shared: %d entries kept while Lookup walks each replica", x.shared.n)
		}
		return nil
	}
	t := &x.shared
	live, pairs := 0, 0
	for i := range t.slots {
		s := &t.slots[i]
		if s.live == 0 {
			continue
		}
		live++
		if t.find(s.h) != i {
			return fmt.Errorf("shared: %v in slot %d not found by probing", s.h, i)
		}
		if s.bits == 0 && s.ext == nilExt {
			return fmt.Errorf("shared: %v has no replicas", s.h)
		}
		holds := func(r int) error {
			if p := x.get(r); p == nil || p.lookup(s.h) == nilNode {
				return fmt.Errorf("shared: %v lists replica %d, which does not hold it", s.h, r)
			}
			pairs++
			return nil
		}
		for b := s.bits; b != 0; b &= b - 1 {
			if err := holds(bits.TrailingZeros64(b)); err != nil {
				return err
			}
		}
		seen := map[int32]bool{}
		steps := 0
		for e := s.ext; e != nilExt; e = t.ext[e].next {
			if steps++; steps > len(t.ext) {
				return fmt.Errorf("shared: %v: ext list loops", s.h)
			}
			w := t.ext[e]
			if w.bits == 0 || w.word < 1 || seen[w.word] {
				return fmt.Errorf("shared: %v: bad ext word %+v", s.h, w)
			}
			seen[w.word] = true
			for b := w.bits; b != 0; b &= b - 1 {
				if err := holds(64*int(w.word) + bits.TrailingZeros64(b)); err != nil {
					return err
				}
			}
		}
	}
	if live != t.n {
		return fmt.Errorf("shared: %d live slots, count says %d", live, t.n)
	}
	if 4*t.n > 3*len(t.slots) {
		return fmt.Errorf("shared: %d entries in %d slots", t.n, len(t.slots))
	}
	// Every listed pair is held and the counts match, so the shared table is
	// exactly the union of the replicas' blocks.
	if pairs != total {
		return fmt.Errorf("shared: lists %d (block, replica) pairs, replicas hold %d", pairs, total)
	}
	return nil
}

func (p *replica) check() error {
	// Over capacity only with every block pinned.
	if p.n > p.capacity && p.head != nilNode {
		return fmt.Errorf("%d blocks over capacity %d with unpinned ones", p.n, p.capacity)
	}
	inList := make([]bool, len(p.nodes))
	count := 0
	prev := int32(nilNode)
	for id := p.head; id != nilNode; id = p.nodes[id].next {
		if id < 0 || int(id) >= len(p.nodes) || inList[id] {
			return fmt.Errorf("list: bad or repeated node %d", id)
		}
		inList[id] = true
		nd := &p.nodes[id]
		if nd.prev != prev {
			return fmt.Errorf("list: node %d prev %d, want %d", id, nd.prev, prev)
		}
		if got := p.lookup(nd.h); got != id {
			return fmt.Errorf("table: %v maps to %d, want %d", nd.h, got, id)
		}
		if nd.stamp&ownedBit != 0 {
			return fmt.Errorf("list: node %d has a pinned node's stamp %x", id, nd.stamp)
		}
		prev = id
		count++
	}
	if p.tail != prev {
		return fmt.Errorf("list: tail %d, want %d", p.tail, prev)
	}
	free := 0
	for id := p.free; id != nilNode; id = p.nodes[id].next {
		if id < 0 || int(id) >= len(p.nodes) || inList[id] {
			return fmt.Errorf("free list: bad node %d", id)
		}
		inList[id] = true
		if p.nodes[id].prev != freeNode {
			return fmt.Errorf("free list: node %d not marked free (prev %d)", id, p.nodes[id].prev)
		}
		free++
	}
	// Every other node of the slab is pinned, and found by its hash.
	pinned := 0
	var maxSince uint64
	for id := range p.nodes {
		if inList[id] {
			continue
		}
		nd := &p.nodes[id]
		if !nd.pinned() || nd.prev < 1 {
			return fmt.Errorf("node %d in no list but not pinned (prev %d, next %d)", id, nd.prev, nd.next)
		}
		if nd.stamp&specBit != 0 || nd.stamp&^ownedBit == 0 {
			return fmt.Errorf("pinned node %d: bad stamp %x", id, nd.stamp)
		}
		if got := p.lookup(nd.h); got != int32(id) {
			return fmt.Errorf("table: pinned %v maps to %d, want %d", nd.h, got, id)
		}
		maxSince = max(maxSince, nd.stamp&^ownedBit)
		pinned++
	}
	if pinned != p.npinned {
		return fmt.Errorf("%d pinned nodes, count says %d", pinned, p.npinned)
	}
	if count+pinned != p.n {
		return fmt.Errorf("list holds %d nodes and %d are pinned, count says %d", count, pinned, p.n)
	}
	// The table: a slot per node in use (found by its hash above) and one
	// per node removed since the last rebuild (stale, matching nothing),
	// at most half full.
	used := 0
	for _, s := range p.slots {
		if s.ref == 0 {
			continue
		}
		used++
		if int(s.ref-1) >= len(p.nodes) {
			return fmt.Errorf("table: slot names node %d of %d", s.ref-1, len(p.nodes))
		}
	}
	if used != p.n+p.stale {
		return fmt.Errorf("table holds %d, count says %d and %d stale", used, p.n, p.stale)
	}
	if p.n > 0 && (4*p.n > len(p.slots) || 4*p.stale >= len(p.slots)) {
		return fmt.Errorf("table: %d and %d stale in %d slots", p.n, p.stale, len(p.slots))
	}
	// Pinned receipts: free slots are zero and listed once; a pinned node's
	// pins belong to live receipts at or after the start of its pinned
	// period.
	isFree := make([]bool, len(p.pins))
	for _, i := range p.pinFree {
		if i < 0 || int(i) >= len(p.pins) || isFree[i] || p.pins[i] != 0 {
			return fmt.Errorf("pins: bad free slot %d", i)
		}
		isFree[i] = true
	}
	var maxLive uint64
	for i, g := range p.pins {
		if !isFree[i] && g == 0 {
			return fmt.Errorf("pins: slot %d neither live nor free", i)
		}
		maxLive = max(maxLive, g)
	}
	if maxSince > maxLive {
		return fmt.Errorf("pins: a node pinned since generation %d, newest live pinned receipt %d", maxSince, maxLive)
	}
	return nil
}

// pinState returns, for replica r, its unpinned blocks from most to least
// recent with their owners (as stamps), and its pinned blocks with their pin
// counts and owners.
func (x *Index) pinState(r int) (lru []nodeState, pinned map[kvblock.Hash]nodeState) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	pinned = map[kvblock.Hash]nodeState{}
	p := x.get(r)
	if p == nil {
		return nil, pinned
	}
	for id := p.head; id != nilNode; id = p.nodes[id].next {
		lru = append(lru, nodeState{h: p.nodes[id].h, owner: p.nodes[id].owner()})
	}
	for id := range p.nodes {
		if nd := &p.nodes[id]; nd.pinned() {
			pinned[nd.h] = nodeState{h: nd.h, pins: int(nd.prev), owner: nd.owner()}
		}
	}
	return lru, pinned
}

type nodeState struct {
	h     kvblock.Hash
	pins  int
	owner uint64 // generation, with specBit when speculative; 0 when none
}
