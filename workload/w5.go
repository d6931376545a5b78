package workload

import (
	"math/rand/v2"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// w5 generates few-shot evaluation batches: batch starts are the open-loop
// arrival process at Rate / batch_size; each batch's requests arrive
// uniformly within the burst window after its start, and share one few-shot
// prefix followed by a fresh question each. Batches may overlap, so Next
// merges their requests into arrival order: a batch is generated as soon as
// its start is not after the earliest pending request (its requests cannot
// arrive before its start), and requests are numbered as they are handed
// out.
type w5 struct {
	model     string
	maxTokens int
	limit     int           // Config.Requests; 0 = none
	duration  time.Duration // Config.Duration; 0 = none
	n         uint64        // requests handed out
	p         W5Params
	mix       mixer // Config.Mix, drawn per request as handed out

	arr      arrivals
	ids      idGen
	bench    []kvblock.Segment // reused prefixes; nil: fresh per batch
	lenR     *rand.Rand        // fresh prefix lengths
	benchR   *rand.Rand        // benchmark choice
	burstR   *rand.Rand        // arrival offsets within the window
	qr       *rand.Rand
	out      outputs
	start    time.Duration // the next batch's start
	more     bool          // start is valid: the arrival process goes on
	seq      uint64        // pending requests generated, for tie-breaks
	pending  pendingHeap   // generated, not yet handed out
	finished bool
}

func newW5(c *Config) *w5 {
	p := c.W5
	s := &w5{
		model:     c.Model,
		maxTokens: c.Output.MaxTokens,
		limit:     c.Requests,
		duration:  c.Duration,
		p:         p,
		mix:       newMixer(c),
		arr:       newArrivals(c, "w5/arrivals", c.Rate/float64(p.BatchSize)),
		ids:       newIDGen(c.Seed, "w5/segment-ids"),
		lenR:      newRand(c.Seed, "w5/prefix-lengths"),
		benchR:    newRand(c.Seed, "w5/benchmark-choice"),
		burstR:    newRand(c.Seed, "w5/burst"),
		qr:        newRand(c.Seed, "w5/questions"),
		out:       newShortOutputs(c, "w5/outputs", p.OutputMedianTokens, p.OutputSigma),
	}
	if p.Benchmarks > 0 {
		s.bench = make([]kvblock.Segment, p.Benchmarks)
		for i := range s.bench {
			s.bench[i] = s.ids.segment(uniform(s.lenR, p.PrefixMinTokens, p.PrefixMaxTokens))
		}
	}
	s.start, s.more = s.arr.next()
	return s
}

// batch generates the batch starting at s.start into s.pending, then draws
// the next start.
func (s *w5) batch() {
	var prefix kvblock.Segment
	if s.bench != nil {
		prefix = s.bench[s.benchR.IntN(len(s.bench))]
	} else {
		prefix = s.ids.segment(uniform(s.lenR, s.p.PrefixMinTokens, s.p.PrefixMaxTokens))
	}
	window := int64(s.p.BurstWindow)
	for range s.p.BatchSize {
		at := s.start
		if window > 0 {
			at += time.Duration(s.burstR.Int64N(window + 1))
		}
		a := &w5Alloc{}
		a.segs[0] = prefix
		a.segs[1] = s.ids.segment(uniform(s.qr, s.p.QuestionMinTokens, s.p.QuestionMaxTokens))
		o := s.out.sample(&s.ids)
		a.req = Request{
			Arrival:      at,
			Model:        s.model,
			Prompt:       a.segs[:],
			MaxTokens:    s.maxTokens,
			OutputTokens: o.Len,
			Output:       o,
		}
		s.seq++
		s.pending.push(pending{at: at, seq: s.seq, req: &a.req})
	}
	s.start, s.more = s.arr.next()
}

// w5Alloc holds a request and its prompt in one allocation.
type w5Alloc struct {
	req  Request
	segs [2]kvblock.Segment
}

func (s *w5) Next() (*Request, bool) {
	if s.finished || (s.limit > 0 && s.n >= uint64(s.limit)) {
		s.finished = true
		return nil, false
	}
	for s.more && (len(s.pending) == 0 || s.start <= s.pending[0].at) {
		s.batch()
	}
	if len(s.pending) == 0 {
		s.finished = true
		return nil, false
	}
	r := s.pending.pop().req
	if s.duration > 0 && r.Arrival > s.duration {
		// Every later request arrives no earlier.
		s.finished = true
		s.pending = nil
		return nil, false
	}
	s.n++
	r.ID = s.n
	s.mix.apply(r)
	return r, true
}

// Done never causes a follow-up: w5 is open loop.
func (s *w5) Done(*Request, time.Duration, bool) (*Request, bool) { return nil, false }

// TakesAhead is true: Next does not depend on Done (workload.TakesAhead).
func (s *w5) TakesAhead() bool { return true }

// pending is a generated request waiting for its turn.
type pending struct {
	at  time.Duration
	seq uint64
	req *Request
}

// pendingHeap is a binary min-heap by (at, seq).
type pendingHeap []pending

func (h pendingHeap) less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}

func (h *pendingHeap) push(p pending) {
	*h = append(*h, p)
	a := *h
	for i := len(a) - 1; i > 0; {
		parent := (i - 1) / 2
		if !a.less(i, parent) {
			break
		}
		a[i], a[parent] = a[parent], a[i]
		i = parent
	}
}

func (h *pendingHeap) pop() pending {
	a := *h
	top := a[0]
	last := len(a) - 1
	a[0] = a[last]
	a[last] = pending{}
	a = a[:last]
	for i := 0; ; {
		l, small := 2*i+1, i
		if l < len(a) && a.less(l, small) {
			small = l
		}
		if r := l + 1; r < len(a) && a.less(r, small) {
			small = r
		}
		if small == i {
			break
		}
		a[i], a[small] = a[small], a[i]
		i = small
	}
	*h = a
	return top
}
