package fleet

import "time"

type eventKind uint8

const (
	evArrival  eventKind = iota // a request reaches the router
	evStepEnd                   // a replica's step ends (or an idle replica is kicked)
	evScrape                    // the gateway scrapes a replica's metrics
	evKVEvents                  // a replica's oldest batch of KV events reaches the router
	evGateway                   // a gateway's queue deadline (or an ejection's end)
)

// event is one entry of the heap, ordered by (at, seq).
type event struct {
	at      time.Duration
	seq     uint64
	kind    eventKind
	replica int32
	gateway int32
	req     *reqState
}

// eventHeap is a binary min-heap by hand: container/heap's interface
// boxing costs an allocation per push.
type eventHeap struct {
	items []event
	seq   uint64
}

func (h *eventHeap) len() int { return len(h.items) }

func less(a, b *event) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

func (h *eventHeap) push(e event) {
	h.seq++
	e.seq = h.seq
	h.items = append(h.items, e)
	i := len(h.items) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !less(&h.items[i], &h.items[p]) {
			break
		}
		h.items[i], h.items[p] = h.items[p], h.items[i]
		i = p
	}
}

func (h *eventHeap) pop() event {
	top := h.items[0]
	last := len(h.items) - 1
	h.items[0] = h.items[last]
	h.items = h.items[:last]
	i, n := 0, last
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && less(&h.items[r], &h.items[l]) {
			m = r
		}
		if !less(&h.items[m], &h.items[i]) {
			break
		}
		h.items[i], h.items[m] = h.items[m], h.items[i]
		i = m
	}
	return top
}
