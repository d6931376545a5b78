package router

import (
	"fmt"
	"strings"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/internal/lane"
	"github.com/inferrail/inferrail/router/kvindex"
)

// IndexMode selects what the KV index learns from.
type IndexMode string

// The index modes.
const (
	// IndexApproximate learns from the router's own decisions: a routed
	// prompt is recorded on its replica (and the whole exchange again when it
	// completes), in a shadow LRU as large as the replica's KV cache.
	IndexApproximate IndexMode = "approximate"
	// IndexEvents learns from the engines' KV events (BlockStored,
	// BlockRemoved, AllBlocksCleared); a decision is recorded speculatively
	// until the events confirm it or SpeculationTTL passes.
	IndexEvents IndexMode = "events"
)

// IndexModes lists the valid index modes.
func IndexModes() []string { return []string{string(IndexApproximate), string(IndexEvents)} }

// Config configures a Router.
type Config struct {
	// Policy names the routing policy (see Names).
	Policy string
	// Options configure the policy (seed, block size, engine profile).
	Options Options
	// Index picks the KV index's source of truth.
	Index IndexMode
	// SpeculationTTL bounds how long, in events mode, a decision stands in
	// for the BlockStored events it predicts.
	SpeculationTTL time.Duration
	// DefaultCapacityBlocks is the KV capacity assumed for a replica whose
	// capacity was never set.
	DefaultCapacityBlocks int
	// TierBlocks is the capacity of each replica's lower KV tiers (CPU and
	// disk together, in blocks; 0: none), for the tier index (tier.go).
	TierBlocks int
	// Lane, when set, lets the index update on the lane's worker after a
	// decision or a finished request while the caller goes on
	// (kvindex.Config.Lane): the same decisions, sooner. The simulator
	// sets it; it only pays with a core to spare, and the router is then
	// for the lane's caller only.
	Lane *lane.Lane
}

// Router makes routing decisions: it filters the eligible replicas, asks the
// KV index how much of the prompt each holds, lets the policy choose and
// records the choice. It is not safe for concurrent use.
type Router struct {
	cfg  Config
	pol  Policy
	idx  *kvindex.Index
	tier *kvindex.Index // the lower tiers (tier.go); nil without
	// tierIDs and tierDepth are predictTiers' scratch.
	tierIDs, tierDepth [1]int
	cands              []Candidate
	ids                []int
	depths             []int
}

// Decision is where a request goes and what the router expects there.
type Decision struct {
	Replica               int
	Name                  string
	PredictedCachedTokens int
	// PredictedTierTokens is what the index expects in the replica's lower
	// KV tiers right after PredictedCachedTokens (Candidate's).
	PredictedTierTokens int
	receipt             kvindex.Receipt
	tierReceipt         kvindex.Receipt
	promptBlocks        int
}

// New validates cfg and builds the router: its policy and index.
func New(cfg Config) (*Router, error) {
	cfg.Options = cfg.Options.withDefaults()
	if cfg.Index == "" {
		cfg.Index = IndexApproximate
	}
	if cfg.Index != IndexApproximate && cfg.Index != IndexEvents {
		return nil, fmt.Errorf("index: must be one of %s, got %q", strings.Join(IndexModes(), ", "), cfg.Index)
	}
	if cfg.SpeculationTTL < 0 {
		return nil, fmt.Errorf("speculation ttl: must be zero or positive, got %v", cfg.SpeculationTTL)
	}
	pol, err := NewPolicy(cfg.Policy, cfg.Options)
	if err != nil {
		return nil, err
	}
	if cfg.TierBlocks < 0 {
		return nil, fmt.Errorf("tier blocks: must be zero or positive, got %d", cfg.TierBlocks)
	}
	r := &Router{
		cfg: cfg,
		pol: pol,
		idx: kvindex.New(kvindex.Config{DefaultCapacityBlocks: cfg.DefaultCapacityBlocks, Lane: cfg.Lane}),
	}
	if cfg.TierBlocks > 0 {
		r.tier = kvindex.New(kvindex.Config{DefaultCapacityBlocks: r.tierCapacity(cfg.DefaultCapacityBlocks)})
	}
	return r, nil
}

// Policy returns the router's policy.
func (r *Router) Policy() Policy { return r.pol }

// Index returns the router's KV index.
func (r *Router) Index() *kvindex.Index { return r.idx }

// SetCapacity tells the index a replica's KV cache size in blocks.
func (r *Router) SetCapacity(replica, blocks int) {
	r.idx.SetCapacity(replica, blocks)
	if r.tier != nil {
		r.tier.SetCapacity(replica, r.tierCapacity(blocks))
	}
}

// Admit reports whether a candidate, with its prediction filled in, may
// take the request now (the gateway core's admission). It is called once per
// eligible candidate, before the policy sees them.
type Admit func(c *Candidate) bool

// Route picks a replica for req among reps at time now and records the
// decision in the index. req.BlockHashes are the prompt's full blocks.
func (r *Router) Route(now time.Duration, req *Request, reps []Replica) (Decision, error) {
	return r.RouteAdmitted(now, req, reps, nil)
}

// RouteAdmitted is Route where the policy chooses only among the eligible
// candidates admit accepts (all of them when admit is nil). It returns
// ErrNoCandidates when no replica is eligible or none is admitted.
func (r *Router) RouteAdmitted(now time.Duration, req *Request, reps []Replica, admit Admit) (Decision, error) {
	return r.RouteWith(now, req, reps, admit, r.pol)
}

// RouteWith is RouteAdmitted with policy pol instead of the router's own,
// over the same index: the gateway core picks a disaggregated request's
// prefill replica this way (its decode replica with the router's policy).
func (r *Router) RouteWith(now time.Duration, req *Request, reps []Replica, admit Admit, pol Policy) (Decision, error) {
	if !r.predict(now, req, reps) {
		return Decision{}, ErrNoCandidates
	}
	if admit != nil {
		n := 0
		for i := range r.cands {
			if admit(&r.cands[i]) {
				r.cands[n] = r.cands[i]
				n++
			}
		}
		r.cands = r.cands[:n]
		if n == 0 {
			return Decision{}, ErrNoCandidates
		}
	}
	i, err := Pick(pol, req, r.cands)
	if err != nil {
		return Decision{}, err
	}
	c := r.cands[i]
	d := Decision{Replica: c.Replica, Name: c.Name, PredictedCachedTokens: c.PredictedCachedTokens,
		PredictedTierTokens: c.PredictedTierTokens, promptBlocks: len(req.BlockHashes)}
	if r.cfg.Index == IndexEvents {
		d.receipt = r.idx.RecordSpeculative(c.Replica, req.BlockHashes, now+r.cfg.SpeculationTTL)
	} else {
		// The engine holds a running request's blocks: pin them until it ends.
		d.receipt = r.idx.RecordPinned(c.Replica, req.BlockHashes)
		if r.tier != nil {
			d.tierReceipt = r.tier.Record(c.Replica, req.BlockHashes)
		}
	}
	return d, nil
}

// predict fills r.cands with the candidates eligible for req among reps and
// the index's predictions for each; it reports whether there is one.
// Route and Explain (explain_router.go) offer the policy what it finds.
func (r *Router) predict(now time.Duration, req *Request, reps []Replica) bool {
	r.cands = Eligible(req.Model, reps, r.cands[:0])
	if len(r.cands) == 0 {
		return false
	}
	if r.cfg.Index == IndexEvents {
		r.idx.Expire(now)
	}
	r.ids = r.ids[:0]
	for _, c := range r.cands {
		r.ids = append(r.ids, c.Replica)
	}
	if cap(r.depths) < len(r.ids) {
		r.depths = make([]int, len(r.ids))
	}
	r.depths = r.depths[:len(r.ids)]
	r.idx.Lookup(req.BlockHashes, r.ids, r.depths)
	// Engines always compute a prompt's last token: predictions stop one
	// block short of a fully cached prompt.
	bs := r.cfg.Options.BlockSize
	maxPred := max(0, (req.PromptTokens-1)/bs)
	for i := range r.cands {
		c := &r.cands[i]
		c.PredictedCachedTokens = min(r.depths[i], maxPred) * bs
		c.IndexedBlocks = r.idx.Blocks(c.Replica)
		c.ActiveBlocks = r.idx.PinnedBlocks(c.Replica)
	}
	if r.tier != nil {
		r.predictTiers(req, maxPred)
	}
	return true
}

// BlockSize is the block size the router hashes and predicts with.
func (r *Router) BlockSize() int { return r.cfg.Options.BlockSize }

// IndexMode is the router's index mode.
func (r *Router) IndexMode() IndexMode { return r.cfg.Index }

// Abandon takes a decision back: the attempt failed before the engine
// computed the prompt, so the index must not believe it cached it.
func (r *Router) Abandon(d Decision) {
	r.idx.TakeBack(d.receipt)
	if r.tier != nil {
		r.tier.TakeBack(d.tierReceipt)
	}
}

// Finished tells the router the request of decision d completed; held names
// the blocks the engine now holds for it (prompt and answer, full blocks
// only). In approximate mode the whole exchange becomes the replica's most
// recently used blocks, as the engine freed them just now, tail first: the
// answer's blocks are recorded, then the prompt's pins released (which makes
// the prompt, block 0 last, the most recent), so under pressure the answer's
// tail goes first and the prompt's head last.
func (r *Router) Finished(d Decision, held []kvblock.Hash) {
	if r.cfg.Index == IndexApproximate {
		var answer []kvblock.Hash
		if d.promptBlocks < len(held) {
			answer = held[d.promptBlocks:]
			if r.tier != nil {
				r.tier.Record(d.Replica, answer)
			}
		}
		r.idx.Finish(d.Replica, answer, d.receipt)
	}
}

// KVEvents feeds a replica's KV events to the index (events mode; in
// approximate mode they are ignored).
func (r *Router) KVEvents(replica int, evs []engine.KVEvent) {
	if r.cfg.Index != IndexEvents {
		return
	}
	for _, ev := range evs {
		x := r.idx
		if lowerTier(ev.Medium) {
			if x = r.tier; x == nil {
				continue // a tier the router does not track
			}
		}
		switch ev.Kind {
		case engine.BlockStored:
			x.Stored(replica, ev.BlockHashes)
		case engine.BlockRemoved:
			x.Removed(replica, ev.BlockHashes)
		case engine.AllBlocksCleared:
			r.idx.Clear(replica)
			if r.tier != nil {
				r.tier.Clear(replica)
			}
		}
	}
}

// Restarted tells the router a replica's engine restarted with an empty cache
// (its prefix-cache counters went backwards).
func (r *Router) Restarted(replica int) {
	r.idx.Clear(replica)
	if r.tier != nil {
		r.tier.Clear(replica)
	}
}

// Forget drops everything known about a replica that left the fleet.
func (r *Router) Forget(replica int) {
	r.idx.Forget(replica)
	if r.tier != nil {
		r.tier.Forget(replica)
	}
}

// SetPolicy replaces the router's policy, e.g. to wrap it with
// instrumentation or to reload it.
func (r *Router) SetPolicy(p Policy) { r.pol = p }
