package router

import "github.com/inferrail/inferrail/engine"

// The tier index: what each replica holds in its lower KV tiers (CPU and
// disk, engine.Config.KVTiers), so that a prompt whose next blocks after its
// GPU prefix were offloaded is credited for them (Candidate.
// PredictedTierTokens): cost_model prices their load back, the peers weight
// them as they publish (Dynamo 0.75 a host-tier block, llm-d 0.8 a CPU-tier
// block).
//
// Events mode: the engines' BlockStored and BlockRemoved events of medium
// CPU or DISK feed it, GPU ones the main index. Approximate mode: an
// engine offloads the blocks its GPU cache evicts, so the blocks of its GPU
// cache and its tiers together are the most recent Config.TierBlocks +
// capacity blocks it was given, one LRU; the tier index records every
// prompt and answer the main index records, at that capacity, and the part
// of a prompt found there past the GPU prefix is the tiers'.

// lowerTier says whether a KV event's medium is a tier below the GPU.
func lowerTier(medium string) bool {
	return medium == engine.MediumCPU || medium == engine.MediumDisk
}

// tierCapacity is the tier index's capacity for a replica of gpu blocks.
func (r *Router) tierCapacity(gpu int) int {
	if r.cfg.Index == IndexEvents {
		return r.cfg.TierBlocks
	}
	return gpu + r.cfg.TierBlocks
}

// predictTiers sets each candidate's PredictedTierTokens: the blocks of the
// prompt right after its predicted GPU prefix that the tier index holds,
// up to maxPred blocks in all.
func (r *Router) predictTiers(req *Request, maxPred int) {
	bs := r.cfg.Options.BlockSize
	one, depth := r.tierIDs[:], r.tierDepth[:]
	for i := range r.cands {
		c := &r.cands[i]
		from := c.PredictedCachedTokens / bs
		if from >= maxPred || from >= len(req.BlockHashes) {
			c.PredictedTierTokens = 0
			continue
		}
		one[0] = c.Replica
		r.tier.Lookup(req.BlockHashes[from:min(maxPred, len(req.BlockHashes))], one, depth)
		c.PredictedTierTokens = depth[0] * bs
	}
}
