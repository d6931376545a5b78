package workload

import (
	"math/rand/v2"
	"slices"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// maxArrival is the latest arrival any process produces (maxArrivalSeconds).
const maxArrival = time.Duration(maxArrivalSeconds * 1e9)

// w7 generates overload bursts over a light background (see W7Params). The
// heavy requests of one burst are generated as sorted arrival times when the
// previous burst is used up (bursts never overlap, so the burst stream is in
// order); their prompts and outputs are drawn as they are handed out. Next
// merges that stream with the background's arrival process, and numbers
// requests as they are handed out.
type w7 struct {
	model    string
	limit    int           // Config.Requests; 0 = none
	duration time.Duration // Config.Duration; 0 = none
	n        uint64        // requests handed out
	p        W7Params
	lightMax int // max_tokens of background requests
	mix      mixer

	ids      idGen
	sys      kvblock.Segment // the heavy prompts' shared system prompt; Len 0 = none
	bg       arrivals        // background arrivals
	bgAt     time.Duration   // the next background arrival
	bgMore   bool            // bgAt is valid
	burstR   *rand.Rand      // arrival offsets within a burst
	heavyR   *rand.Rand      // heavy prompt lengths
	lightR   *rand.Rand      // background prompt lengths
	heavyOut outputs
	lightOut outputs

	burst     []time.Duration // the current burst's arrivals, sorted
	next      int             // burst[next] is the next heavy arrival
	start     time.Duration   // the next burst's start
	moreBurst bool            // start is valid: there is another burst
	finished  bool
}

func newW7(c *Config) *w7 {
	p := c.W7
	s := &w7{
		model:     c.Model,
		limit:     c.Requests,
		duration:  c.Duration,
		p:         p,
		lightMax:  c.Output.MaxTokens,
		mix:       newMixer(c),
		ids:       newIDGen(c.Seed, "w7/segment-ids"),
		bg:        newArrivals(c, "w7/arrivals", c.Rate),
		burstR:    newRand(c.Seed, "w7/burst"),
		heavyR:    newRand(c.Seed, "w7/heavy-lengths"),
		lightR:    newRand(c.Seed, "w7/light-lengths"),
		heavyOut:  outputs{r: newRand(c.Seed, "w7/heavy-outputs"), dist: newLengthDist(c.Output.Median, c.Output.Sigma, c.Output.Min, p.HeavyMaxTokens)},
		lightOut:  newOutputs(c, "w7/light-outputs"),
		start:     p.FirstBurst,
		moreBurst: c.Duration == 0 || p.FirstBurst <= c.Duration,
	}
	if p.HeavySharedTokens > 0 {
		s.sys = s.ids.segment(p.HeavySharedTokens)
	}
	s.bgAt, s.bgMore = s.bg.next()
	return s
}

// nextBurst generates the burst starting at s.start into s.burst and moves
// s.start to the following one.
func (s *w7) nextBurst() {
	if s.burst == nil {
		s.burst = make([]time.Duration, s.p.BurstRequests)
	}
	b := s.burst[:s.p.BurstRequests]
	window := int64(s.p.BurstWindow)
	for i := range b {
		b[i] = s.start
		if window > 0 {
			b[i] += time.Duration(s.burstR.Int64N(window + 1))
		}
	}
	slices.Sort(b)
	if s.duration > 0 && b[len(b)-1] > s.duration {
		// Keep the arrivals up to the duration; no later burst follows.
		n := len(b) - 1
		for n > 0 && b[n-1] > s.duration {
			n--
		}
		b = b[:n]
		s.moreBurst = false
	}
	s.burst, s.next = b, 0
	// Validate bounds burst_every and burst_window by 24h each.
	if s.start > maxArrival-s.p.BurstEvery-s.p.BurstWindow {
		s.moreBurst = false
		return
	}
	s.start += s.p.BurstEvery
	if s.duration > 0 && s.start > s.duration {
		s.moreBurst = false
	}
}

// w7Alloc holds a request and its prompt in one allocation.
type w7Alloc struct {
	req  Request
	segs [2]kvblock.Segment
}

func (s *w7) Next() (*Request, bool) {
	if s.finished || (s.limit > 0 && s.n >= uint64(s.limit)) {
		s.finished = true
		return nil, false
	}
	if s.next == len(s.burst) && s.moreBurst {
		s.nextBurst()
	}
	heavy := s.next < len(s.burst)
	if heavy && s.bgMore && s.bgAt < s.burst[s.next] {
		heavy = false
	}
	if !heavy && !s.bgMore {
		s.finished = true
		return nil, false
	}
	s.n++
	a := &w7Alloc{}
	var o kvblock.Segment
	if heavy {
		at := s.burst[s.next]
		s.next++
		n := uniform(s.heavyR, s.p.HeavyPromptMinTokens, s.p.HeavyPromptMaxTokens)
		prompt := a.segs[:0]
		if s.sys.Len > 0 {
			prompt = append(prompt, s.sys)
		}
		// Validate keeps heavy_shared_tokens below heavy_prompt_min_tokens.
		prompt = append(prompt, s.ids.segment(n-s.sys.Len))
		o = s.heavyOut.sample(&s.ids)
		a.req = Request{Arrival: at, Prompt: prompt, MaxTokens: s.p.HeavyMaxTokens}
	} else {
		at := s.bgAt
		s.bgAt, s.bgMore = s.bg.next()
		a.segs[0] = s.ids.segment(uniform(s.lightR, s.p.LightPromptMinTokens, s.p.LightPromptMaxTokens))
		o = s.lightOut.sample(&s.ids)
		a.req = Request{Arrival: at, Prompt: a.segs[:1], MaxTokens: s.lightMax}
	}
	a.req.ID = s.n
	a.req.Model = s.model
	a.req.OutputTokens = o.Len
	a.req.Output = o
	s.mix.apply(&a.req)
	return &a.req, true
}

// Done never causes a follow-up: w7 is open loop.
func (s *w7) Done(*Request, time.Duration, bool) (*Request, bool) { return nil, false }

// TakesAhead is true: Next does not depend on Done (workload.TakesAhead).
func (s *w7) TakesAhead() bool { return true }
