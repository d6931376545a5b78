package server

import (
	"context"
	"sync"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/internal/timeheap"
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
	// rank is the data-parallel rank serving the request (engine goroutine
	// only: it labels the request's metrics).
	rank int
	// remote: the prompt's KV arrived from a producer (kvtransfer.go); the
	// engine computes its last token only.
	remote bool

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
	cmdCached
)

type command struct {
	kind cmdKind
	req  *active
	// reqs, for cmdAdd, are an n > 1 request's children, added together
	// (req is nil then).
	reqs  []*active
	id    engine.RequestID
	reply chan error
	ok    chan bool
	// n answers cmdCached: the leading prompt tokens of req held in the
	// prefix cache.
	n chan int
}

// loop is the engine goroutine's state. Only Run touches it.
type loop struct {
	s     *Server
	eng   *engine.Group
	start time.Time
	reqs  map[engine.RequestID]*active
	// outs are the emissions of steps, due at their OutputAt; kvs the KV
	// events of steps, due at their ends (times since start).
	outs  timeheap.Heap[[]engine.Emission]
	kvs   timeheap.Heap[[]engine.KVEvent]
	spare [][]engine.Emission
	// blockTokens maps the hash of a block of a live request to its tokens,
	// for the token_ids of BlockStored events; refs counts the live
	// requests that hold it.
	blockTokens map[kvblock.Hash]blockRef
	lastToken   map[engine.RequestID]time.Time
	// cached counts, for a KV consumer, the ranks whose prefix cache holds
	// each block (from the engine's KV events), so that a remote prefill
	// moves only the blocks the engine lacks (nil: not a consumer).
	cached map[kvblock.Hash]int
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
		if err := l.advance(timer); err != nil {
			return err
		}
		select {
		case c := <-l.s.cmds:
			l.handle(c)
			l.drain()
		case <-timer.C:
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

// advance does what is due by now: the KV events of steps that ended, the
// tokens that reached the API server (OutputAt), then every step due (one
// per free data-parallel rank, one for the group in lockstep); it arms the
// timer for the next of these.
func (l *loop) advance(timer *time.Timer) error {
	now := l.now()
	for {
		it, ok := l.kvs.Top()
		if !ok || it.At > now {
			break
		}
		l.kvs.Pop()
		if l.s.cfg.KVEvents != nil {
			l.s.cfg.KVEvents(l.start.Add(it.At), it.V, l.tokensOf)
		}
	}
	// Published before the tokens are delivered: a client that has read
	// its request's end finds the engine's count of it in /metrics.
	l.s.publishSnapshot(l.eng)
	for {
		it, ok := l.outs.Top()
		if !ok || it.At > now {
			break
		}
		l.outs.Pop()
		l.deliver(it.V)
		l.spare = append(l.spare, it.V[:0])
	}
	for empty := 0; ; {
		at, ok := l.eng.NextStep()
		if !ok || at > now {
			break
		}
		// Within maxLateStep the step starts when the model says, so timer
		// lateness does not add up over a long decode.
		if now-at >= maxLateStep {
			at = now
		}
		res := l.eng.Step(at)
		if l.cached != nil {
			l.track(res.Events)
		}
		if res.Scheduled == 0 {
			if empty++; empty == maxEmptySteps {
				return errStuck
			}
			continue
		}
		if len(res.Events) > 0 && l.s.cfg.KVEvents != nil {
			// The group reuses its event slice; the hash slices inside are fresh.
			l.kvs.Push(res.End(), append([]engine.KVEvent(nil), res.Events...))
		}
		if len(res.Emitted) > 0 {
			var buf []engine.Emission
			if n := len(l.spare); n > 0 {
				buf, l.spare = l.spare[n-1], l.spare[:n-1]
			}
			l.outs.Push(res.OutputAt, append(buf, res.Emitted...))
		}
	}
	next, ok := l.eng.NextStep()
	if it, has := l.outs.Top(); has && (!ok || it.At < next) {
		next, ok = it.At, true
	}
	if it, has := l.kvs.Top(); has && (!ok || it.At < next) {
		next, ok = it.At, true
	}
	if ok {
		timer.Reset(next - l.now())
	} else {
		timer.Stop()
	}
	return nil
}

// deliver hands one step's tokens to their requests' handlers.
func (l *loop) deliver(ems []engine.Emission) {
	now := time.Now()
	for _, em := range ems {
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
		if em.Finished {
			// Counted before its handler is woken: a client that has read
			// the end finds the request in /metrics.
			l.forget(a)
			l.s.met.finished(a, a.finishReason(), now)
		}
		a.signal()
	}
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
		if c.reqs != nil {
			c.reply <- l.addAll(c.reqs)
			return
		}
		c.reply <- l.add(c.req)
	case cmdAbort:
		l.abort(c.id)
	case cmdReset:
		ok, evs := l.eng.ResetPrefixCache()
		if l.cached != nil {
			l.track(evs)
		}
		if ok && len(evs) > 0 && l.s.cfg.KVEvents != nil {
			l.s.cfg.KVEvents(time.Now(), evs, l.tokensOf)
		}
		c.ok <- ok
	case cmdCached:
		n := 0
		for _, h := range c.req.hashes {
			if l.cached[h] == 0 || (n+1)*l.eng.Config().BlockSize > c.req.promptLen {
				break
			}
			n++
		}
		c.n <- n * l.eng.Config().BlockSize
	}
}

func (l *loop) add(a *active) error {
	err := l.eng.Add(l.now(), engine.Request{
		ID:           a.id,
		PromptTokens: a.promptLen,
		OutputTokens: a.outLen,
		MaxTokens:    a.outLen,
		BlockHashes:  a.hashes,
		// The prompt's KV came from a producer (kvtransfer.go).
		RemotePrefill: a.remote,
	})
	if err == nil {
		a.rank, _ = l.eng.RankOf(a.id)
		l.reqs[a.id] = a
		l.remember(a)
	}
	return err
}

// addAll adds the children of an n > 1 request (choices.go) together, so
// that they start in the same step, all or none: when the engine refuses
// one, those added before it are aborted.
func (l *loop) addAll(kids []*active) error {
	for i, a := range kids {
		if err := l.add(a); err != nil {
			for _, b := range kids[:i] {
				l.abort(b.id)
			}
			return err
		}
	}
	return nil
}

func (l *loop) abort(id engine.RequestID) {
	a := l.reqs[id]
	if a == nil {
		return
	}
	if err := l.eng.Abort(l.now(), id); err == nil {
		l.forget(a)
		l.s.met.aborted(a)
	}
}

// track applies KV events to the consumer's view of its prefix cache.
func (l *loop) track(evs []engine.KVEvent) {
	for _, ev := range evs {
		switch ev.Kind {
		case engine.BlockStored:
			for _, h := range ev.BlockHashes {
				l.cached[h]++
			}
		case engine.BlockRemoved:
			for _, h := range ev.BlockHashes {
				if l.cached[h] <= 1 {
					delete(l.cached, h)
				} else {
					l.cached[h]--
				}
			}
		case engine.AllBlocksCleared:
			clear(l.cached)
		}
	}
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
