package gateway

import (
	"fmt"
	"time"

	"github.com/inferrail/inferrail/router"
)

// Shadow mode (Config.ShadowPolicy): every dispatch also asks a second
// policy, an instance of its own seeded like the real one, which candidate
// it would pick among the same candidates, in the same state (the ones the
// real policy was offered, with the same predictions), after the real pick
// and without any effect on routing: nothing it picks is reserved,
// recorded in the index or dispatched. Both picks are priced with
// cost_model's estimator (router.Estimator, the same for every policy, so
// estimates compare), and the real pick's measured time to first byte is
// attached when its first byte arrives. The shadow advances its own state
// as if it routed (its cursor, its draws, its sessions), so a shadow equal
// to the real policy agrees on every decision.
//
// Its cost is one more policy evaluation over the candidates already
// gathered and two estimates, on the decision path and bounded by the
// candidate count (BenchmarkCoreShadow measures it).

// ShadowPick is what the shadow policy would have done with one dispatch.
type ShadowPick struct {
	// Policy names the shadow policy, "" when there is none.
	Policy string
	// Replica and Name are the shadow's pick.
	Replica int
	Name    string
	// Agree says the shadow picked the replica the request went to.
	Agree bool
	// EstimatedTTFTMs is cost_model's estimate of the time to first token
	// on the real pick, ShadowEstimatedTTFTMs on the shadow's, in
	// milliseconds.
	EstimatedTTFTMs, ShadowEstimatedTTFTMs float64
}

// shadowNote is what an entry keeps of its dispatch's shadow pick until
// its first byte.
type shadowNote struct {
	on    bool
	agree bool
	at    time.Duration // when it was dispatched
	estMs float64       // the real pick's estimate
}

type shadow struct {
	pol   router.Policy
	est   router.Estimator
	stats ShadowStats
}

// shadowBounds are the histograms' bucket bounds, in seconds.
var shadowBounds = [...]float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}

// ShadowBuckets returns the upper bounds, in seconds, of the buckets of
// ShadowStats' histograms (the last bucket, past them, is +Inf).
func ShadowBuckets() []float64 { return append([]float64(nil), shadowBounds[:]...) }

// Histogram counts observations, in seconds, in the ShadowBuckets.
type Histogram struct {
	// Buckets counts the observations of each bucket (not cumulative):
	// Buckets[i] those at most ShadowBuckets()[i] and above the bound
	// before; the last those above every bound.
	Buckets [len(shadowBounds) + 1]uint64
	Count   uint64
	Sum     float64
}

func (h *Histogram) observe(s float64) {
	i := 0
	for i < len(shadowBounds) && s > shadowBounds[i] {
		i++
	}
	h.Buckets[i]++
	h.Count++
	h.Sum += s
}

// ShadowStats is shadow mode's tally since the shadow policy was set.
type ShadowStats struct {
	// Primary and Shadow name the real policy and the shadow one.
	Primary, Shadow string
	// Decisions counts the dispatches the shadow was asked about, Agreed
	// those where it picked the same replica.
	Decisions, Agreed uint64
	// EstimatedPrimary and EstimatedShadow hold, per decision, cost_model's
	// estimate of the time to first token on the real pick and on the
	// shadow's (equal when they agree).
	EstimatedPrimary, EstimatedShadow Histogram
	// Measured holds the real pick's measured time to first byte (from
	// its dispatch), by agreement: [0] the shadow disagreed, [1] agreed;
	// MeasuredEstimateSum the sum of the real pick's estimates, in
	// seconds, over the same decisions (measured over estimated is the
	// estimator's calibration).
	Measured            [2]Histogram
	MeasuredEstimateSum [2]float64
}

// Agreement is the share of decisions the shadow agreed with (0 without any).
func (s *ShadowStats) Agreement() float64 {
	if s.Decisions == 0 {
		return 0
	}
	return float64(s.Agreed) / float64(s.Decisions)
}

// SetShadow makes name the shadow policy (router.Names), built with the
// router's options (its seed among them), or turns shadow mode off for "".
// The tally starts over.
func (c *Core) SetShadow(name string) error {
	if name == "" {
		c.shadow = nil
		return nil
	}
	p, err := router.NewPolicy(name, c.rt.Options())
	if err != nil {
		return fmt.Errorf("shadow_policy: %w", err)
	}
	c.shadow = &shadow{pol: p, est: c.rt.Estimator(), stats: ShadowStats{Primary: c.rt.Policy().Name(), Shadow: name}}
	return nil
}

// ShadowStats returns shadow mode's tally; ok is false without a shadow
// policy.
func (c *Core) ShadowStats() (ShadowStats, bool) {
	if c.shadow == nil {
		return ShadowStats{}, false
	}
	return c.shadow.stats, true
}

// shadowPick asks the shadow policy about the dispatch of e to replica real
// at now, over the candidates the router just offered the real policy, and
// tallies it.
func (c *Core) shadowPick(now time.Duration, e *entry, real int) ShadowPick {
	sh := c.shadow
	cands := c.rt.Offered()
	pi := -1
	for i := range cands {
		if cands[i].Replica == real {
			pi = i
			break
		}
	}
	if pi < 0 {
		return ShadowPick{} // the router offered what it picked from: not reached
	}
	si, err := router.Pick(sh.pol, &c.rreq, cands)
	if err != nil {
		return ShadowPick{}
	}
	prompt := c.rreq.PromptTokens
	pe := sh.est.TTFTMs(prompt, &cands[pi])
	se := pe
	if si != pi {
		se = sh.est.TTFTMs(prompt, &cands[si])
	}
	agree := si == pi
	st := &sh.stats
	st.Decisions++
	if agree {
		st.Agreed++
	}
	st.EstimatedPrimary.observe(pe / 1e3)
	st.EstimatedShadow.observe(se / 1e3)
	e.shadow = shadowNote{on: true, agree: agree, at: now, estMs: pe}
	return ShadowPick{Policy: sh.stats.Shadow, Replica: cands[si].Replica, Name: c.reps[cands[si].Replica].cfg.Name, Agree: agree,
		EstimatedTTFTMs: pe, ShadowEstimatedTTFTMs: se}
}

// shadowMeasured attaches the first byte's time at now to e's shadow note.
func (c *Core) shadowMeasured(now time.Duration, e *entry) {
	n := e.shadow
	e.shadow.on = false
	if c.shadow == nil {
		return // shadow mode was turned off since the dispatch
	}
	k := 0
	if n.agree {
		k = 1
	}
	st := &c.shadow.stats
	st.Measured[k].observe((now - n.at).Seconds())
	st.MeasuredEstimateSum[k] += n.estMs / 1e3
}
