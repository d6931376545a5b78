package gateway

import (
	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
)

// KVEvent is one KV cache event of an engine, as it arrives: the engine's
// own block ids and, for stored blocks, their tokens. Engines hash blocks
// their own way (vLLM: sha256 or xxhash with a per-deployment seed), so the
// core recomputes its own hashes from each stored block's tokens, chained
// from a parent it already placed, and keeps an engine-id to own-hash map
// per replica for removals (llm-d's "dual key"). A block whose parent it
// never saw (events from before it subscribed) cannot be placed and is
// skipped; decisions recorded speculatively stand in meanwhile.
type KVEvent struct {
	Kind engine.KVEventKind
	// Blocks are the engine's ids of the stored or removed blocks.
	Blocks []uint64
	// Parent is the engine's id of the block before the first stored one,
	// if HasParent.
	Parent    uint64
	HasParent bool
	// TokenIDs are the stored blocks' tokens, BlockSize per block.
	TokenIDs []uint32
	// Own, when set, gives the core's hashes of the stored blocks directly
	// (an engine that hashes as the core does: the simulated one); TokenIDs
	// are then not needed.
	Own []kvblock.Hash
	// BlockSize is the engine's block size (0: the core's).
	BlockSize int
	// Medium is where the blocks are (vLLM's medium: GPU, CPU, DISK; ""
	// is GPU).
	Medium string
	// LoRA and CacheSalt are the LoRA adapter and the cache_salt the
	// engine mixed into a stored prefix's first block (vLLM's lora_name
	// and its first block's extra keys): without a parent, its chain
	// starts from kvblock.Salt(model, LoRA, CacheSalt), as the core's own
	// hashes of such a request do, so an adapter's or a salted prompt's
	// blocks are never taken for the plain model's.
	LoRA, CacheSalt string
}

// FromEngine converts a simulated engine's event, which carries the
// core's own hashes, keyed by their low 64 bits as vLLM's ids are.
func FromEngine(ev engine.KVEvent) KVEvent {
	out := KVEvent{Kind: ev.Kind, Own: ev.BlockHashes, BlockSize: ev.BlockSize, HasParent: ev.HasParent, Parent: ev.ParentBlockHash.Lo, Medium: ev.Medium}
	if len(ev.BlockHashes) > 0 {
		out.Blocks = make([]uint64, len(ev.BlockHashes))
		for i, h := range ev.BlockHashes {
			out.Blocks[i] = h.Lo
		}
	}
	return out
}

// kvTranslator maps one replica's engine block ids to the core's hashes:
// own for the GPU's blocks, tier for the lower tiers' (a block may be in
// both, and leaves each on its own).
//
// A block stored in a lower tier is one the GPU held (an engine offloads
// what it computed; vLLM's hashes name content, the same in every medium),
// and offloading events carry no parent (vLLM's carry no tokens either): it
// takes the hash its engine id has on the GPU or in another tier, or had
// until a removal earlier in the same batch (an engine that offloads a
// block as it evicts it sends the removal first); an id never placed is
// skipped. A lower tier's event that names a parent is placed from its
// tokens, as a GPU block is.
type kvTranslator struct {
	own  map[uint64]kvblock.Hash
	tier map[uint64]kvblock.Hash
	gone map[uint64]kvblock.Hash // removed earlier in this batch
}

// translate turns events into engine events keyed by the core's hashes,
// appended to out; buf is scratch for the hashes.
func (k *kvTranslator) translate(evs []KVEvent, model string, salt kvblock.Hash, bs int, out []engine.KVEvent) []engine.KVEvent {
	if k.own == nil {
		k.own = make(map[uint64]kvblock.Hash)
		k.tier = make(map[uint64]kvblock.Hash)
		k.gone = make(map[uint64]kvblock.Hash)
	}
	defer func() {
		if len(k.gone) > 0 {
			clear(k.gone)
		}
	}()
	for i := range evs {
		e := &evs[i]
		ids, medium := k.own, engine.MediumGPU
		lower := e.Medium == engine.MediumCPU || e.Medium == engine.MediumDisk
		if lower {
			ids, medium = k.tier, e.Medium
		}
		switch e.Kind {
		case engine.BlockStored:
			if e.BlockSize != 0 && e.BlockSize != bs {
				continue // a block size the model is not configured for
			}
			if lower && e.Own == nil && !e.HasParent {
				if ours := k.known(e.Blocks); len(ours) > 0 {
					out = append(out, engine.KVEvent{Kind: engine.BlockStored, BlockHashes: ours, BlockSize: bs, Medium: medium})
				}
				continue
			}
			if e.Own == nil && len(e.TokenIDs) != bs*len(e.Blocks) {
				continue // cannot recompute
			}
			if e.Own != nil && len(e.Own) != len(e.Blocks) {
				continue
			}
			parent := salt
			if e.LoRA != "" || e.CacheSalt != "" {
				parent = kvblock.Salt(model, e.LoRA, e.CacheSalt)
			}
			if e.HasParent {
				p, ok := ids[e.Parent]
				if !ok {
					p, ok = k.own[e.Parent] // an offloaded block's parent may still be on the GPU
				}
				if !ok {
					continue
				}
				parent = p
			}
			ours := make([]kvblock.Hash, 0, len(e.Blocks))
			for j, id := range e.Blocks {
				if e.Own != nil {
					parent = e.Own[j]
				} else {
					parent = kvblock.HashBlock(parent, e.TokenIDs[j*bs:(j+1)*bs])
				}
				ids[id] = parent
				ours = append(ours, parent)
			}
			out = append(out, engine.KVEvent{Kind: engine.BlockStored, BlockHashes: ours, BlockSize: bs, Medium: medium})
		case engine.BlockRemoved:
			var ours []kvblock.Hash
			for _, id := range e.Blocks {
				if o, ok := ids[id]; ok {
					ours = append(ours, o)
					delete(ids, id)
					if len(k.gone) < maxGone {
						k.gone[id] = o
					}
				}
			}
			if len(ours) > 0 {
				out = append(out, engine.KVEvent{Kind: engine.BlockRemoved, BlockHashes: ours, Medium: medium})
			}
		case engine.AllBlocksCleared:
			clear(k.own)
			clear(k.tier)
			out = append(out, engine.KVEvent{Kind: engine.AllBlocksCleared})
		}
	}
	return out
}

// maxGone bounds the removals of one batch a lower tier's store may refer
// back to.
const maxGone = 1 << 16

// known places a lower tier's stored blocks by the hashes their engine ids
// have already (on the GPU, in a tier, or until a removal earlier in the
// batch), records them in the tier's map and returns them; an id never
// placed is skipped (without a parent it cannot be).
func (k *kvTranslator) known(blocks []uint64) []kvblock.Hash {
	var ours []kvblock.Hash
	for _, id := range blocks {
		h, ok := k.own[id]
		if !ok {
			h, ok = k.tier[id]
		}
		if !ok {
			h, ok = k.gone[id]
		}
		if ok {
			k.tier[id] = h
			ours = append(ours, h)
		}
	}
	return ours
}

func (k *kvTranslator) reset() {
	clear(k.own)
	clear(k.tier)
	clear(k.gone)
}
