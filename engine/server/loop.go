package server

import (
	"context"
	"sync"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
)

// active is one request inside the engine, shared by the engine goroutine
// (which writes its progress) and its HTTP handler (which reads it).
type active struct {
	id        engine.RequestID
	promptLen int
	outLen    int
	tokens    []uint32 // prompt then output
	hashes    []kvblock.Hash
	maxTok    int // the request's max_tokens
	arrival   time.Time
	// stallAt stops the stream after that many tokens (0: never).
	stallAt int

	// notify is signalled (without blocking) whenever progress changes.
	notify chan struct{}

	mu       sync.Mutex
	emitted  int
	cached   int
	finished bool
	failed   error
}

func (a *active) progress() (emitted, cached int, finished bool, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.emitted, a.cached, a.finished, a.failed
}

func (a *active) signal() {
	select {
	case a.notify <- struct{}{}:
	default:
	}
}

type cmdKind uint8

const (
	cmdAdd cmdKind = iota
	cmdAbort
	cmdReset
)

type command struct {
	kind  cmdKind
	req   *active
	id    engine.RequestID
	reply chan error
	ok    chan bool
}

// loop is the engine goroutine's state. Only Run touches it.
type loop struct {
	s        *Server
	eng      *engine.Engine
	start    time.Time
	reqs     map[engine.RequestID]*active
	pending  []engine.Emission
	events   []engine.KVEvent
	stepping bool
	stepEnd  time.Duration
	// blockTokens maps the hash of a block of a live request to its tokens,
	// for the token_ids of BlockStored events; refs counts the live
	// requests that hold it.
	blockTokens map[kvblock.Hash]blockRef
	lastToken   map[engine.RequestID]time.Time
}

type blockRef struct {
	tokens []uint32
	refs   int
}

// maxLateStep is how far behind the model's schedule the engine goroutine
// may fall before a step starts at the wall clock instead of at the end of
// the previous step. Within it the model keeps its own schedule, so timer
// lateness does not accumulate over a long decode.
const maxLateStep = 2 * time.Millisecond

// maxEmptySteps bounds consecutive steps that schedule nothing.
const maxEmptySteps = 1000

func (l *loop) now() time.Duration { return time.Since(l.start) }

func (l *loop) run(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer func() {
		timer.Stop()
		for _, a := range l.reqs {
			a.mu.Lock()
			a.failed = errShutdown
			a.mu.Unlock()
			a.signal()
		}
	}()
	for {
		if !l.stepping {
			if err := l.startStep(timer); err != nil {
				return err
			}
		}
		var tick <-chan time.Time
		if l.stepping {
			tick = timer.C
		}
		select {
		case c := <-l.s.cmds:
			l.handle(c)
			l.drain()
		case <-tick:
			l.finishStep()
		case <-ctx.Done():
			return nil
		}
	}
}

// drain handles every command already queued (up to the queue's size), so
// that requests arriving together start in the same step, as vLLM's engine
// core drains its input queue before it schedules.
func (l *loop) drain() {
	for range cap(l.s.cmds) {
		select {
		case c := <-l.s.cmds:
			l.handle(c)
		default:
			return
		}
	}
}

// startStep runs the engine's next step, if it has work, and arms the timer
// for the step's end.
func (l *loop) startStep(timer *time.Timer) error {
	for range maxEmptySteps {
		if _, ok := l.eng.NextStep(); !ok {
			return nil
		}
		now := l.now()
		at := now
		if l.stepEnd > 0 && now-l.stepEnd < maxLateStep {
			at = l.stepEnd
		}
		res := l.eng.Step(at)
		if res.Scheduled == 0 {
			continue
		}
		l.pending = append(l.pending[:0], res.Emitted...)
		l.events = append(l.events[:0], res.Events...)
		l.stepEnd = res.End()
		l.stepping = true
		timer.Reset(l.stepEnd - l.now())
		return nil
	}
	return errStuck
}

// finishStep delivers the outputs of the step that just ended.
func (l *loop) finishStep() {
	l.stepping = false
	wall := l.start.Add(l.stepEnd)
	if len(l.events) > 0 && l.s.cfg.KVEvents != nil {
		l.s.cfg.KVEvents(wall, l.events, l.tokensOf)
	}
	now := time.Now()
	for _, em := range l.pending {
		a := l.reqs[em.ID]
		if a == nil {
			continue // aborted while the step ran
		}
		l.s.met.observeToken(a, em, now, l.lastToken)
		a.mu.Lock()
		a.emitted = em.Output
		a.cached = em.CachedTokens
		a.finished = em.Finished
		a.mu.Unlock()
		a.signal()
		if em.Finished {
			l.forget(a)
			l.s.met.finished(a, a.finishReason(), now)
		}
	}
	l.pending = l.pending[:0]
	l.s.publishSnapshot(l.eng.Metrics())
}

// finishReason is "length" when the request ran to max_tokens, "stop" when
// the mock model ended it earlier.
func (a *active) finishReason() string {
	if a.outLen < a.maxTok {
		return "stop"
	}
	return "length"
}

func (l *loop) tokensOf(h kvblock.Hash) []uint32 { return l.blockTokens[h].tokens }

func (l *loop) handle(c command) {
	switch c.kind {
	case cmdAdd:
		a := c.req
		err := l.eng.Add(l.now(), engine.Request{
			ID:           a.id,
			PromptTokens: a.promptLen,
			OutputTokens: a.outLen,
			MaxTokens:    a.outLen,
			BlockHashes:  a.hashes,
		})
		if err == nil {
			l.reqs[a.id] = a
			l.remember(a)
		}
		c.reply <- err
	case cmdAbort:
		a := l.reqs[c.id]
		if a == nil {
			return
		}
		if err := l.eng.Abort(l.now(), c.id); err == nil {
			l.forget(a)
			l.s.met.aborted()
		}
	case cmdReset:
		ok, evs := l.eng.ResetPrefixCache()
		if ok && len(evs) > 0 && l.s.cfg.KVEvents != nil {
			l.s.cfg.KVEvents(time.Now(), evs, l.tokensOf)
		}
		c.ok <- ok
	}
	l.s.publishSnapshot(l.eng.Metrics())
}

func (l *loop) remember(a *active) {
	if l.blockTokens == nil {
		return
	}
	bs := l.eng.Config().BlockSize
	for i, h := range a.hashes {
		r := l.blockTokens[h]
		if r.refs == 0 {
			r.tokens = a.tokens[i*bs : (i+1)*bs : (i+1)*bs]
		}
		r.refs++
		l.blockTokens[h] = r
	}
}

func (l *loop) forget(a *active) {
	delete(l.reqs, a.id)
	delete(l.lastToken, a.id)
	if l.blockTokens == nil {
		return
	}
	for _, h := range a.hashes {
		r := l.blockTokens[h]
		if r.refs <= 1 {
			delete(l.blockTokens, h)
			continue
		}
		r.refs--
		l.blockTokens[h] = r
	}
}
