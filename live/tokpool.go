package live

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// tokOutcome is how edge tokenization of one request went.
type tokOutcome string

const (
	tokOK        tokOutcome = "ok"
	tokTimeout   tokOutcome = "timeout"
	tokQueueFull tokOutcome = "queue_full"
	tokError     tokOutcome = "error"
	tokSkipped   tokOutcome = "skipped" // no encoder, or a prompt given as token ids
)

// tokPool tokenizes on a bounded number of workers with a bounded queue, so
// a burst of long prompts cannot take every core from the proxy; a request
// whose prompt is not tokenized in time is routed without a prediction.
type tokPool struct {
	jobs    chan *tokJob
	timeout time.Duration
	wg      sync.WaitGroup
}

type tokJob struct {
	fn        func() ([]uint32, error)
	abandoned atomic.Bool
	ids       []uint32
	err       error
	done      chan struct{}
}

func newTokPool(o TokenizeOptions) *tokPool {
	workers := o.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	queue := max(o.Queue, 1)
	p := &tokPool{jobs: make(chan *tokJob, queue), timeout: o.Timeout}
	for range workers {
		p.wg.Add(1)
		go p.work()
	}
	return p
}

func (p *tokPool) work() {
	defer p.wg.Done()
	for j := range p.jobs {
		if !j.abandoned.Load() {
			j.ids, j.err = j.fn()
		}
		close(j.done)
	}
}

// do runs fn on the pool and waits for it up to the pool's timeout.
func (p *tokPool) do(ctx context.Context, fn func() ([]uint32, error)) ([]uint32, tokOutcome) {
	j := &tokJob{fn: fn, done: make(chan struct{})}
	select {
	case p.jobs <- j:
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
	case <-j.done:
		if j.err != nil {
			return nil, tokError
		}
		return j.ids, tokOK
	case <-timeout:
	case <-ctx.Done():
	}
	j.abandoned.Store(true)
	return nil, tokTimeout
}

func (p *tokPool) close() {
	close(p.jobs)
	p.wg.Wait()
}
