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
	i := min(k-1, int(o.q*float64(k)))
	o.value, o.valid, o.sinceFit = int(selectNth(s, i)), true, 0
}

// selectNth returns the value at index i of s sorted (s is reordered): a
// quickselect, linear on average, where sorting the 512 samples every 16
// answers took a few percent of a simulation.
func selectNth(s []int32, i int) int32 {
	lo, hi := 0, len(s)-1
	for hi-lo > 16 {
		// Median of three as the pivot, then a three-way partition:
		// [lo, lt) < p, [lt, gt] == p, (gt, hi] > p.
		mid := lo + (hi-lo)/2
		a, b, c := s[lo], s[mid], s[hi]
		p := max(min(a, b), min(max(a, b), c))
		lt, gt := lo, hi
		for j := lo; j <= gt; {
			switch v := s[j]; {
			case v < p:
				s[lt], s[j] = v, s[lt]
				lt++
				j++
			case v > p:
				s[gt], s[j] = v, s[gt]
				gt--
			default:
				j++
			}
		}
		switch {
		case i < lt:
			hi = lt - 1
		case i > gt:
			lo = gt + 1
		default:
			return p
		}
	}
	slices.Sort(s[lo : hi+1])
	return s[i]
}

// get returns the estimate, if there is one yet.
func (o *outputEstimate) get() (int, bool) { return o.value, o.valid }
