package gateway

import (
	"math"
	"time"

	"github.com/inferrail/inferrail/router"
)

// poolGate is the pool-level part of the peers' admission rules, evaluated
// once per routing attempt.
type poolGate struct {
	// llmdAny: some replica scores below 1 on llm-d's utilization detector
	// (its filter keeps those; with none it keeps all).
	llmdAny bool
	scores  []float64
}

// open reports whether the pool takes a request now at all.
func (g *poolGate) open(c *Core, now time.Duration) bool {
	switch c.cfg.Admission {
	case AdmitLLMDUtilization:
		// Saturation = unweighted mean over replicas of max(waiting/qt,
		// kv/kvt); a stale or missing report counts as fully saturated.
		g.scores = g.scores[:0]
		sum, n := 0.0, 0
		g.llmdAny = false
		for _, r := range c.reps {
			if r.gone {
				g.scores = append(g.scores, math.Inf(1))
				continue
			}
			s := 1.0
			if r.reported && now-r.reportAt <= c.cfg.Peers.LLMDStaleness {
				s = max(float64(r.report.Waiting)/c.cfg.Peers.LLMDQueueThreshold, r.report.KVUsage/c.cfg.Peers.LLMDKVThreshold)
			}
			g.scores = append(g.scores, s)
			if s < 1 {
				g.llmdAny = true
			}
			sum += s
			n++
		}
		return n > 0 && sum/float64(n) < 1
	case AdmitLLMDConcurrency:
		inflight, n := 0, 0
		for _, r := range c.reps {
			if !r.gone {
				inflight += r.load.InFlight
				n++
			}
		}
		return inflight < c.cfg.Peers.LLMDMaxConcurrency*n
	}
	return true
}

// admitWhy says which of admit's checks decided (explain.go names them);
// admit leaves it in Core.why for the explanation of a decision.
type admitWhy uint8

// The checks of admit, in its order.
const (
	whyNoRule          admitWhy = iota // admission none: every eligible replica
	whyUnknownCapacity                 // kv, tokenflow: no capacity to weigh against
	whyEmpty                           // kv, tokenflow: nothing reserved, it takes its next request
	whyFits                            // tokenflow: reserved + weight fit the capacity
	whyOverCapacity                    // tokenflow: they do not
	whyOverReserved                    // kv: reservations + weight over capacity x overcommit
	whyOverEngine                      // kv: the engine's scraped usage + weight over it
	whyFitsReserved                    // kv, events mode: the reservations and usage fit
	whyFitsPinned                      // kv, approximate mode: the exact footprint fits
	whyOverPinned                      // kv, approximate mode: the exact footprint does not
	whyLLMDUnsaturated                 // llmd-utilization: below 1, or no replica is
	whyLLMDSaturated                   // llmd-utilization: saturated while others are not
	whyLLMDUnder                       // llmd-concurrency: under the cap
	whyLLMDAtCap                       // llmd-concurrency: at the cap
	whyDynamoFree                      // dynamo: active prefill under the threshold
	whyDynamoBusy                      // dynamo: over it
)

// admit reports whether candidate cand may take the request being routed
// (c.cur), and leaves in c.why the check that decided.
func (c *Core) admit(cand *router.Candidate) bool {
	r := c.reps[cand.Replica]
	switch c.cfg.Admission {
	case AdmitKV, AdmitTokenFlow:
		capb := c.capacity(r)
		if capb <= 0 {
			return c.verdict(true, whyUnknownCapacity) // unknown capacity: nothing to weigh against
		}
		reserved := c.ledger.Reserved(cand.Replica)
		if reserved == 0 {
			return c.verdict(true, whyEmpty) // an empty replica always takes its next request
		}
		w := c.weight(c.cur, cand.PredictedCachedTokens)
		if c.cfg.Admission == AdmitTokenFlow {
			if reserved+w <= capb {
				return c.verdict(true, whyFits)
			}
			return c.verdict(false, whyOverCapacity)
		}
		limit := float64(capb) * c.cfg.Overcommit
		// Three views of the replica's demand with this request, the
		// largest wins: the ledger's reservations (every gateway's, each
		// request's uncached prompt and max_tokens), the engine's own
		// usage as last scraped (it also holds what other gateways sent),
		// and, where the index pins prompts in flight (approximate mode),
		// their exact footprint: distinct pinned blocks, a prefix shared
		// by requests in flight counted once, plus every request's tail.
		used := reserved + w
		why := whyOverReserved
		if el := cand.Load.Engine; el.Valid {
			if e := int(math.Ceil(el.KVCacheUsage*float64(capb))) + w; e > used {
				used, why = e, whyOverEngine
			}
		}
		if float64(used) > limit {
			return c.verdict(false, why)
		}
		if c.rt.IndexMode() != router.IndexApproximate {
			return c.verdict(true, whyFitsReserved)
		}
		e := c.cur
		pinned := cand.ActiveBlocks + r.tail + c.fullBlocks(e) + c.tailBlocks(e)
		if float64(pinned) <= limit {
			return c.verdict(true, whyFitsPinned) // even with none of its prompt held already
		}
		if e.req.BlockHashes != nil {
			pinned -= c.rt.Index().PinnedDepth(cand.Replica, e.req.BlockHashes)
		}
		if float64(pinned) <= limit {
			return c.verdict(true, whyFitsPinned)
		}
		return c.verdict(false, whyOverPinned)
	case AdmitLLMDUtilization:
		if !c.gate.llmdAny || c.gate.scores[cand.Replica] < 1 {
			return c.verdict(true, whyLLMDUnsaturated)
		}
		return c.verdict(false, whyLLMDSaturated)
	case AdmitLLMDConcurrency:
		if r.load.InFlight < c.cfg.Peers.LLMDMaxConcurrency {
			return c.verdict(true, whyLLMDUnder)
		}
		return c.verdict(false, whyLLMDAtCap)
	case AdmitDynamo:
		if float64(r.load.PendingPrefillTokens) <= c.cfg.Peers.DynamoQueueThreshold*float64(c.cfg.Router.Options.MaxNumBatchedTokens) {
			return c.verdict(true, whyDynamoFree)
		}
		return c.verdict(false, whyDynamoBusy)
	}
	return c.verdict(true, whyNoRule)
}

// verdict leaves why in c.why and returns ok.
func (c *Core) verdict(ok bool, why admitWhy) bool {
	c.why = why
	return ok
}
