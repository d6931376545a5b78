package engine

import (
	"runtime"
	"sync/atomic"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// Handing a step's prefix-cache insertions to another goroutine
// (Group.HandOffStores). A step registers the full blocks its prefills
// reached (pool.store): a hash-table insertion per block, most of a long
// prompt's cost in the engine, that nothing reads until the engine's next
// call. So with hand-off on, store only notes the blocks and their hashes,
// and the step hands the list over at its end; another goroutine applies it
// (ApplyStores, as the simulator's second core does between its other
// work), and the engine's next call applies whatever is still unapplied
// before it reads anything (settle), waiting for a hand-over being applied.
// The engine then goes through the same states in the same order as
// without hand-off: nothing but store changes the prefix cache between the
// end of a step and the next call, and the insertions keep their order.
// Only the GPU cache without KV events or lower tiers hands off (their
// events and offloads are part of the step's result).
type handOff struct {
	on     bool
	ids    []int32 // the blocks to register, in order
	hashes []kvblock.Hash
	next   int // ids[:next] are registered
	// pending counts the lists handed over and not yet taken whole, over
	// every engine given the same counter (HandOffStores).
	pending *atomic.Int64
	// state: handNone (nothing handed over: ids and hashes are the
	// engine's), handReady (handed over: whoever swaps it to handBusy
	// applies them) or handBusy.
	state atomic.Int32
}

const (
	handNone int32 = iota
	handReady
	handBusy
)

// note sets aside the registration of blocks ids[from:to] under
// hashes[from:to] (pool.store).
func (h *handOff) note(ids []int32, hashes []kvblock.Hash, from, to int) {
	h.ids = append(h.ids, ids[from:to]...)
	h.hashes = append(h.hashes, hashes[from:to]...)
}

// applyNoted registers up to n of the blocks set aside, in order, as store
// would have, and reports whether none is left.
func (p *pool) applyNoted(n int) bool {
	h := &p.hand
	end := min(len(h.ids), h.next+n)
	for k := h.next; k < end; k++ {
		id := h.ids[k]
		b := &p.blocks[id]
		if b.hashed {
			continue
		}
		hash := h.hashes[k]
		if !p.cached.insert(hash, id, p.blocks) {
			continue // another block already caches this content
		}
		b.hashed, b.hash = true, hash
		p.ncached++
	}
	h.next = end
	if end < len(h.ids) {
		return false
	}
	h.ids, h.hashes, h.next = h.ids[:0], h.hashes[:0], 0
	return true
}

// handPiece is the most blocks ApplyStores registers at a time, so that
// the second core's spare work stays short (lane.Lane.SetSpare).
const handPiece = 128

// settle applies the insertions set aside that are still unapplied, or
// waits for the goroutine applying them: the engine's calls begin with it.
func (p *pool) settle() {
	h := &p.hand
	if !h.on {
		return
	}
	if h.state.Load() != handNone {
		if h.state.CompareAndSwap(handReady, handBusy) {
			p.applyNoted(len(h.ids))
			h.state.Store(handNone)
			h.pending.Add(-1)
		} else {
			for i := 1; h.state.Load() != handNone; i++ {
				if i%1024 == 0 {
					runtime.Gosched()
				}
			}
		}
	}
	if len(h.ids) > 0 {
		p.applyNoted(len(h.ids))
	}
}

// handOver hands the insertions set aside over to ApplyStores, at the end
// of a step.
func (p *pool) handOver() {
	if h := &p.hand; h.on && len(h.ids) > 0 {
		h.pending.Add(1)
		h.state.Store(handReady)
	}
}

// applyHanded applies a handed-over list, if there is one no other
// goroutine has taken, and reports whether it did.
func (p *pool) applyHanded() bool {
	h := &p.hand
	if h.state.Load() != handReady || !h.state.CompareAndSwap(handReady, handBusy) {
		return false
	}
	if p.applyNoted(handPiece) {
		h.pending.Add(-1) // before the state, so that settle sees both
		h.state.Store(handNone)
	} else {
		h.state.Store(handReady) // the rest for the next piece
	}
	return true
}

// handOffStores turns hand-off on, where the engine's configuration allows
// it (no KV events, no lower tiers).
func (e *Engine) handOffStores(pending *atomic.Int64) {
	p := e.pool
	p.hand.on = p.caching && p.events == nil && p.cpu == nil
	p.hand.pending = pending
}

// HandOffStores makes each step of the group's engines leave its
// prefix-cache insertions for ApplyStores, called from another goroutine,
// or for the engine's next call (see handoff.go); the results are the same.
// pending counts the lists handed over and not yet applied, over every
// group given the same counter, so that a goroutine looking after many
// groups calls ApplyStores only while it is above zero. It has no effect
// with KV events or lower tiers. Call it before the first call that adds a
// request. A nil pending gives the group a counter of its own.
func (g *Group) HandOffStores(pending *atomic.Int64) {
	if pending == nil {
		pending = new(atomic.Int64)
	}
	for _, e := range g.ranks {
		e.handOffStores(pending)
	}
}

// ApplyStores applies one engine's insertions that a step handed over
// (HandOffStores), if one has some that no other goroutine is applying,
// and reports whether it did. Unlike the group's other methods it may be
// called from another goroutine while the group is in use.
func (g *Group) ApplyStores() bool {
	for _, e := range g.ranks {
		if e.pool.applyHanded() {
			return true
		}
	}
	return false
}
