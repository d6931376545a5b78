package kvindex

import (
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// expiry is a speculative record waiting to expire.
type expiry struct {
	at      time.Duration
	gen     uint64
	replica int
	hashes  []kvblock.Hash
}

// expiryQueue is a binary min-heap of expiries ordered by (at, gen).
type expiryQueue []expiry

func (q expiryQueue) less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].gen < q[j].gen
}

func (q *expiryQueue) push(e expiry) {
	*q = append(*q, e)
	h := *q
	for i := len(h) - 1; i > 0; {
		parent := (i - 1) / 2
		if !h.less(i, parent) {
			break
		}
		h[i], h[parent] = h[parent], h[i]
		i = parent
	}
}

func (q *expiryQueue) pop() expiry {
	h := *q
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h[last] = expiry{} // release the hash slice
	h = h[:last]
	for i := 0; ; {
		l, small := 2*i+1, i
		if l < len(h) && h.less(l, small) {
			small = l
		}
		if r := l + 1; r < len(h) && h.less(r, small) {
			small = r
		}
		if small == i {
			break
		}
		h[i], h[small] = h[small], h[i]
		i = small
	}
	*q = h
	return top
}
