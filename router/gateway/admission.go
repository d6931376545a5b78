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

// admit reports whether candidate cand may take the request being routed
// (c.cur).
func (c *Core) admit(cand *router.Candidate) bool {
	r := c.reps[cand.Replica]
	switch c.cfg.Admission {
	case AdmitKV, AdmitTokenFlow:
		capb := c.capacity(r)
		if capb <= 0 {
			return true // unknown capacity: nothing to weigh against
		}
		reserved := c.ledger.Reserved(cand.Replica)
		if reserved == 0 {
			return true // an empty replica always takes its next request
		}
		w := c.weight(c.cur, cand.PredictedCachedTokens)
		if c.cfg.Admission == AdmitTokenFlow {
			return reserved+w <= capb
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
		if el := cand.Load.Engine; el.Valid {
			used = max(used, int(math.Ceil(el.KVCacheUsage*float64(capb)))+w)
		}
		if float64(used) > limit {
			return false
		}
		if c.rt.IndexMode() != router.IndexApproximate {
			return true
		}
		e := c.cur
		pinned := cand.ActiveBlocks + r.tail + c.fullBlocks(e) + c.tailBlocks(e)
		if float64(pinned) <= limit {
			return true // even with none of its prompt held already
		}
		if e.req.BlockHashes != nil {
			pinned -= c.rt.Index().PinnedDepth(cand.Replica, e.req.BlockHashes)
		}
		return float64(pinned) <= limit
	case AdmitLLMDUtilization:
		return !c.gate.llmdAny || c.gate.scores[cand.Replica] < 1
	case AdmitLLMDConcurrency:
		return r.load.InFlight < c.cfg.Peers.LLMDMaxConcurrency
	case AdmitDynamo:
		return float64(r.load.PendingPrefillTokens) <= c.cfg.Peers.DynamoQueueThreshold*float64(c.cfg.Router.Options.MaxNumBatchedTokens)
	}
	return true
}
