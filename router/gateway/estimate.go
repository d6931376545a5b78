package gateway

import "slices"

// outputEstimate learns how long the model's answers are, from the engines'
// usage of finished requests, so kv admission reserves what answers really
// take instead of every request's whole max_tokens (which most never use:
// reserving it holds the fleet back at a fraction of what it serves). It
// keeps the last len(ring) answer lengths and serves a high quantile of
// them, recomputed every few samples, without allocating.
type outputEstimate struct {
	q        float64 // the quantile served, in (0, 1]; 0: no estimate
	min      int     // samples needed before estimating
	ring     [512]int32
	n        int // samples seen
	sorted   [512]int32
	value    int
	valid    bool
	sinceFit int
}

func (o *outputEstimate) add(tokens int) {
	if o.q == 0 || tokens <= 0 {
		return
	}
	o.ring[o.n%len(o.ring)] = int32(min(tokens, 1<<30))
	o.n++
	o.sinceFit++
	if o.n >= o.min && (!o.valid || o.sinceFit >= 16) {
		o.fit()
	}
}

func (o *outputEstimate) fit() {
	k := min(o.n, len(o.ring))
	s := o.sorted[:k]
	copy(s, o.ring[:k])
	slices.Sort(s)
	i := min(k-1, int(o.q*float64(k)))
	o.value, o.valid, o.sinceFit = int(s[i]), true, 0
}

// get returns the estimate, if there is one yet.
func (o *outputEstimate) get() (int, bool) { return o.value, o.valid }
