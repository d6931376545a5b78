package fleet

import (
	"time"

	"github.com/inferrail/inferrail/internal/timeheap"
)

type eventKind uint8

const (
	evArrival  eventKind = iota // a request reaches the router
	evStepEnd                   // a replica's step ends (or an idle replica is kicked)
	evScrape                    // the gateway scrapes a replica's metrics
	evKVEvents                  // a replica's oldest batch of KV events reaches the router
	evGateway                   // a gateway's queue deadline (or an ejection's end)
)

// event is one entry of the heap, ordered by (at, the order of pushes).
type event struct {
	at      time.Duration
	kind    eventKind
	replica int32
	gateway int32
	req     *reqState
}

// eventHeap is the run's events by time (internal/timeheap: no allocation
// per push, as container/heap's boxing would cost).
type eventHeap struct{ h timeheap.Heap[event] }

func (h *eventHeap) len() int     { return h.h.Len() }
func (h *eventHeap) push(e event) { h.h.Push(e.at, e) }
func (h *eventHeap) pop() event   { return h.h.Pop().V }
