package live

import (
	"context"
	"runtime"
	"time"

	"github.com/inferrail/inferrail/live/config"
)

// tokOutcome is how edge tokenization of one request went.
type tokOutcome string

const (
	tokOK        tokOutcome = "ok"
	tokTimeout   tokOutcome = "timeout"
	tokQueueFull tokOutcome = "queue_full"
	tokError     tokOutcome = "error"
	tokSkipped   tokOutcome = "skipped" // no encoder, or a prompt given as token ids
	// tokTooLong: the prompt is longer than tokenize.max_prompt_bytes, so
	// longer than the engine takes (or than is worth predicting).
	tokTooLong tokOutcome = "too_long"
)

// tokPool bounds edge tokenization: at most Workers prompts are tokenized
// at once (on the requests' own goroutines, so a free slot costs no
// hand-off), at most Queue more wait for a slot, and a request that waits
// past Timeout is routed without a prediction. A burst of long prompts
// therefore cannot take every core from the proxy.
type tokPool struct {
	slots   chan struct{}
	waiting chan struct{}
	timeout time.Duration
}

func newTokPool(o config.Tokenize) *tokPool {
	workers := o.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	return &tokPool{slots: make(chan struct{}, workers), waiting: make(chan struct{}, max(o.Queue, 1)), timeout: o.Timeout}
}

// do runs fn once a slot is free, waiting for one up to the pool's timeout.
func (p *tokPool) do(ctx context.Context, fn func() ([]uint32, error)) ([]uint32, tokOutcome) {
	select {
	case p.slots <- struct{}{}:
	default:
		select {
		case p.waiting <- struct{}{}:
		default:
			return nil, tokQueueFull
		}
		var timeout <-chan time.Time
		if p.timeout > 0 {
			t := time.NewTimer(p.timeout)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case p.slots <- struct{}{}:
			<-p.waiting
		case <-timeout:
			<-p.waiting
			return nil, tokTimeout
		case <-ctx.Done():
			<-p.waiting
			return nil, tokTimeout
		}
	}
	if ctx.Err() != nil {
		<-p.slots
		return nil, tokTimeout // the request's deadline passed meanwhile
	}
	ids, err := fn()
	<-p.slots
	if err != nil {
		return nil, tokError
	}
	return ids, tokOK
}
