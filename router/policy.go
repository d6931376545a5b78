package router

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
)

// Request is what the router knows of a request when it picks a replica.
type Request struct {
	ID           uint64
	Model        string
	Session      uint64
	Priority     int
	PromptTokens int
	// BlockHashes names the prompt's full blocks (may be nil when the router
	// could not tokenize the prompt).
	BlockHashes []kvblock.Hash
}

// EngineLoad is the engine's own view of its load, as of its last scrape.
type EngineLoad struct {
	Valid        bool          // false until the first scrape
	Age          time.Duration // how old the numbers are
	Running      int           // vllm:num_requests_running
	Waiting      int           // vllm:num_requests_waiting
	KVCacheUsage float64       // vllm:kv_cache_usage_perc
}

// Load is a replica's load as the gateway sees it: its own counters exact and
// current, the engine's as of the last scrape.
type Load struct {
	InFlight            int // requests dispatched and not finished
	Pending             int // dispatched, first token not yet seen
	PendingPromptTokens int // prompt tokens of the pending requests
	// PendingPrefillTokens is the prefill work queued at the replica as the
	// gateway estimates it: the prompt tokens of pending requests minus the
	// cached tokens predicted for each when it was routed.
	PendingPrefillTokens int
	// InFlightPromptTokens is the prompt tokens of all requests in flight
	// (their KV footprint before any output).
	InFlightPromptTokens int
	Engine               EngineLoad
}

// Candidate is a replica that can serve the request: healthy, serving the
// model, with room.
type Candidate struct {
	Replica int // index of the replica in the fleet
	Name    string
	Load    Load
	// PredictedCachedTokens is the KV index's prediction of the prompt tokens
	// this replica holds (0 without an index). It never covers the whole
	// prompt: engines always compute the last token, so it stops one block short.
	PredictedCachedTokens int
	// PredictedTierTokens is the prompt tokens right after
	// PredictedCachedTokens that the index expects in the replica's lower
	// KV tiers (CPU, disk: tier.go), which the engine would load back
	// rather than compute; 0 without tiers.
	PredictedTierTokens int
	// KVCapacityBlocks is the replica's KV cache size in blocks (0 if unknown).
	KVCapacityBlocks int
	// IndexedBlocks is how many blocks the KV index holds for the replica
	// (the size of its "tree", in SGLang's terms).
	IndexedBlocks int
	// ActiveBlocks is the distinct KV blocks of the replica's requests in
	// flight, a prefix they share counted once (0 when the index does not
	// track them: in events mode).
	ActiveBlocks int
}

// Policy picks one of the candidates (by index into cands) for req. cands is
// never empty. Policies are not safe for concurrent use; the caller serialises.
type Policy interface {
	Name() string
	Pick(req *Request, cands []Candidate) int
}

// ErrNoCandidates is returned when no replica can take a request.
var ErrNoCandidates = errors.New("router: no replica can serve the request")

// Options configure policy construction.
type Options struct {
	// Seed seeds every randomised policy; the same seed replays the same choices.
	Seed uint64
	// BlockSize is the engines' KV block size in tokens (default 16).
	BlockSize int
	// Profile is the engines' latency model, for policies that estimate
	// prefill time (default engine.DefaultConfig().Latency).
	Profile engine.Profile
	// MaxNumBatchedTokens is the engines' step token budget (default 2048).
	MaxNumBatchedTokens int
	// SessionAffinity makes cost_model keep a session on the replica of its
	// previous turn unless that costs more than SessionSlack over the best.
	SessionAffinity bool
	// TierLoadNsPerToken is the time to load one token's KV back from the
	// engines' lower tiers (kv_bytes_per_token over the CPU tier's
	// bandwidth), for cost_model's credit of tier hits (0: not credited).
	TierLoadNsPerToken float64
}

// withDefaults fills unset options.
func (o Options) withDefaults() Options {
	if o.BlockSize <= 0 {
		o.BlockSize = 16
	}
	if o.MaxNumBatchedTokens <= 0 {
		o.MaxNumBatchedTokens = engine.DefaultConfig().MaxNumBatchedTokens
	}
	if o.Profile == (engine.Profile{}) {
		o.Profile = engine.DefaultConfig().Latency
	}
	return o
}

type factory func(Options) Policy

// registry lists the policies by name. It is a function, not a package
// variable, so there is no global mutable state.
func registry() map[string]factory {
	return map[string]factory{
		"round_robin":   func(Options) Policy { return &RoundRobin{} },
		"random":        func(o Options) Policy { return &Random{rng: subRNG(o.Seed, "random")} },
		"least_request": func(o Options) Policy { return &LeastRequest{rng: subRNG(o.Seed, "least_request")} },
		"p2c":           func(o Options) Policy { return &P2C{rng: subRNG(o.Seed, "p2c")} },
		"prefix_hash":   func(o Options) Policy { return NewPrefixHash(o) },
		"kv_aware":      func(o Options) Policy { return NewKVAware(o) },
		"cost_model":    func(o Options) Policy { return NewCostModel(o) },
		"llmd":          func(o Options) Policy { return NewLLMD(o) },
		"dynamo":        func(o Options) Policy { return NewDynamo(o) },
		"sglang":        func(o Options) Policy { return NewSGLang(o) },
		"aibrix": func(o Options) Policy {
			p := NewAIBrix(o)
			p.UseGatewayCount = true // AIBrix counts its own in-flight requests
			return p
		},
		"preble": func(o Options) Policy { return NewPreble(o) },
	}
}

// Family says where a policy comes from and whether it reads caches.
type Family int

// The families, in the order reports list them.
const (
	// Baseline policies route without looking at any cache (cache-blind):
	// the bar a cache-aware policy must beat.
	Baseline Family = iota
	// Ours are this project's cache-aware policies.
	Ours
	// Peer policies reimplement other routers' rules.
	Peer
)

// families sorts the registry's policies; a policy not listed is a peer.
func families() map[string]Family {
	return map[string]Family{
		"round_robin": Baseline, "random": Baseline, "least_request": Baseline, "p2c": Baseline,
		"prefix_hash": Ours, "kv_aware": Ours, "cost_model": Ours,
	}
}

// FamilyOf returns the family of a policy, or of a variant label such as
// cost_model+kv (its policy before the first "+"); ok is false for an
// unknown name.
func FamilyOf(name string) (f Family, ok bool) {
	name, _, _ = strings.Cut(name, "+")
	if _, known := registry()[name]; !known {
		return 0, false
	}
	if f, listed := families()[name]; listed {
		return f, true
	}
	return Peer, true
}

// CacheBlind reports whether a policy (or a variant label) routes without
// looking at caches: the baselines round_robin, random, least_request, p2c.
func CacheBlind(name string) bool {
	f, ok := FamilyOf(name)
	return ok && f == Baseline
}

// Ordered lists every policy the way reports list them: the baselines,
// ours, then the peers', each group in a fixed order.
func Ordered() []string {
	order := []string{"round_robin", "random", "least_request", "p2c", "prefix_hash", "kv_aware", "cost_model", "llmd", "dynamo", "sglang", "aibrix", "preble"}
	var out []string
	for _, n := range order {
		if _, ok := registry()[n]; ok {
			out = append(out, n)
		}
	}
	for _, n := range Names() {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// Names lists the policies NewPolicy accepts, sorted.
func Names() []string {
	names := make([]string, 0, 8)
	for n := range registry() {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// NewPolicy builds the policy called name.
func NewPolicy(name string, o Options) (Policy, error) {
	f, ok := registry()[name]
	if !ok {
		return nil, fmt.Errorf("unknown policy %q (allowed: %s)", name, strings.Join(Names(), ", "))
	}
	return f(o.withDefaults()), nil
}

// Pick runs p over cands and checks the answer.
func Pick(p Policy, req *Request, cands []Candidate) (int, error) {
	if len(cands) == 0 {
		return -1, ErrNoCandidates
	}
	i := p.Pick(req, cands)
	if i < 0 || i >= len(cands) {
		return -1, fmt.Errorf("router: policy %s picked candidate %d of %d", p.Name(), i, len(cands))
	}
	return i, nil
}
