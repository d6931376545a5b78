package server

import (
	"net/http"
	"sync"
)

// eventLog is a background stream's events as they were written, kept
// with its stored response (vLLM's event store) so that GET
// /v1/responses/{id}?stream=true can replay them from any point and follow
// the rest. Its size is the generation's: one event per engine step.
type eventLog struct {
	mu     sync.Mutex
	events [][]byte // each a whole SSE event
	ended  bool
	wake   chan struct{} // closed at each change, then replaced
}

func newEventLog() *eventLog { return &eventLog{wake: make(chan struct{})} }

// add keeps one more event.
func (l *eventLog) add(ev []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	l.events = append(l.events, ev)
	close(l.wake)
	l.wake = make(chan struct{})
}

// end marks the stream over (finished, failed, cancelled, or the engine
// stopped): followers leave once they have its last event.
func (l *eventLog) end() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.ended {
		l.ended = true
		close(l.wake)
	}
}

// from returns the events from index i on, whether the stream is over,
// and a channel closed at the next change.
func (l *eventLog) from(i int) (evs [][]byte, ended bool, wake <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i < len(l.events) {
		evs = l.events[i:len(l.events):len(l.events)]
	}
	return evs, l.ended, l.wake
}

// followEvents answers with log's events from index next on, as they come,
// until the stream is over, the client leaves or the engine stops.
func (s *Server) followEvents(w http.ResponseWriter, r *http.Request, log *eventLog, next int) {
	rc := http.NewResponseController(w)
	sseHeaders(w)
	if rc.Flush() != nil {
		return
	}
	for {
		evs, ended, wake := log.from(next)
		for _, ev := range evs {
			if _, err := w.Write(ev); err != nil {
				return
			}
		}
		next += len(evs)
		if len(evs) > 0 && rc.Flush() != nil {
			return
		}
		if ended {
			return // evs held the last of them
		}
		select {
		case <-wake:
		case <-r.Context().Done():
			return
		case <-s.done:
			return
		}
	}
}
