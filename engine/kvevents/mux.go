package kvevents

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
)

// MuxConfig configures a Mux.
type MuxConfig struct {
	// Endpoint is bound (tcp://*:5557, tcp://127.0.0.1:0 for an ephemeral
	// port, ipc://...); the engines' publishers connect to it.
	Endpoint string
	// TopicPrefix is the subscription filter ("kv@"; "" every topic).
	TopicPrefix string
	// ReplayTimeout bounds one replay request (default 5s, as
	// Subscriber's).
	ReplayTimeout time.Duration
	// QueueLen bounds the batches held for one topic while its handler or
	// a replay is slow (default 1024); past it they are dropped and show
	// up as a gap.
	QueueLen int
	// Unrouted, optional, is called (from the Mux's reading goroutine, must
	// return quickly) for a message whose topic resolve did not take.
	Unrouted func(topic string)
}

// Route is where a Mux delivers one topic's batches: the publisher's replay
// endpoint ("" none) and the callbacks a Subscriber takes (handler, OnGap,
// OnReset), called from that topic's own goroutine, in order.
type Route struct {
	ReplayEndpoint string
	Handler        func(seq uint64, b Batch)
	OnGap          func(Gap)
	OnReset        func(Reset)
}

// MuxStats are a Mux's counters: every topic's counts summed (forgotten
// topics' included; Connects counts the bind as 1, and BadFrames also the
// live messages no topic could be read from), the messages left unrouted,
// and how many topics have a route now.
type MuxStats struct {
	SubscriberStats
	Unrouted uint64
	Topics   int
}

// Mux receives vLLM KV event batches from many engines on one bound SUB
// socket, as llm-d's central mode does: the router binds (tcp://*:5557,
// filter "kv@") and every engine's publisher connects to it, each on its
// own topic kv@<pod-ip>:<port>@<model>. Sequence numbers are per publisher,
// so each topic has its own sequence, gap, reset and replay handling, the
// same as a Subscriber's (the first batch sets the expected sequence, a
// lower one is a Reset, a higher one a Gap repaired from the topic's replay
// endpoint), and its own goroutine fed by a queue of QueueLen batches, so a
// slow handler or replay of one engine does not hold up the others.
//
// The Mux learns a topic's Route from resolve on the topic's first message;
// a topic keeps its route, its sequence and its goroutine until Forget or
// Close, so Forget the topics of pods that went away: memory is bounded by
// QueueLen batches per routed topic. The callbacks of one topic run in
// order on its goroutine, those of different topics concurrently.
type Mux struct {
	cfg     MuxConfig
	resolve func(topic string) (Route, bool)
	prefix  []byte
	sock    zmq4.Socket
	ctx     context.Context
	cancel  context.CancelFunc
	reader  sync.WaitGroup // the reading goroutine
	routes  sync.WaitGroup // the topics' goroutines
	closing sync.Once

	mu     sync.Mutex // guards topics and draining, and sends on and closes of the queues
	topics map[string]*muxTopic
	// draining holds, by topic, the done channel of a forgotten topic's
	// goroutine still delivering its queue: the topic's next goroutine
	// waits for it, so one topic's callbacks never overlap.
	draining map[string]chan struct{}

	counters
	unrouted atomic.Uint64
	dropped  atomic.Uint64 // batches dropped on a full queue (they show up as gaps)
}

// muxTopic is one routed topic: its queue and its goroutine's end.
type muxTopic struct {
	queue chan entry
	done  chan struct{}
}

// NewMux binds cfg.Endpoint (returning the error if it cannot) and starts
// reading. For each message whose topic it has no route for it calls
// resolve(topic) (from the reading goroutine; it must return quickly);
// false leaves the message unrouted (counted, Unrouted called), and the
// topic is resolved again on its next message (a pod may be registered
// later). A route without a Handler, or whose ReplayEndpoint is not a
// tcp://, ipc:// or inproc:// endpoint, does not take either. A resolved
// topic keeps its route, its sequence state and its own goroutine until
// Forget.
func NewMux(ctx context.Context, cfg MuxConfig, resolve func(topic string) (Route, bool)) (*Mux, error) {
	if resolve == nil {
		return nil, errors.New("kvevents: mux needs a resolve func")
	}
	if err := checkEndpoint("mux endpoint", cfg.Endpoint); err != nil {
		return nil, err
	}
	if cfg.ReplayTimeout < 0 || cfg.QueueLen < 0 {
		return nil, fmt.Errorf("kvevents: mux replay timeout %v and queue length %d must not be negative", cfg.ReplayTimeout, cfg.QueueLen)
	}
	if cfg.ReplayTimeout == 0 {
		cfg.ReplayTimeout = 5 * time.Second
	}
	if cfg.QueueLen == 0 {
		cfg.QueueLen = 1024
	}
	ctx, cancel := context.WithCancel(ctx)
	sock := zmq4.NewSub(ctx, quiet())
	err := sock.SetOption(zmq4.OptionSubscribe, cfg.TopicPrefix)
	if err == nil {
		err = sock.Listen(cfg.Endpoint)
	}
	if err != nil {
		cancel()
		_ = sock.Close()
		return nil, fmt.Errorf("kvevents: bind mux endpoint %q: %w", cfg.Endpoint, err)
	}
	m := &Mux{
		cfg: cfg, resolve: resolve, prefix: []byte(cfg.TopicPrefix), sock: sock, ctx: ctx, cancel: cancel,
		topics: map[string]*muxTopic{}, draining: map[string]chan struct{}{},
	}
	m.connects.Add(1)
	m.reader.Go(m.read)
	return m, nil
}

// read is the reading goroutine: it hands each message to its topic's
// queue until ctx ends. The bound socket outlives its connections: a
// publisher going away fails one Recv.
func (m *Mux) read() {
	defer closeAndDrain(m.sock)
	for {
		msg, err := m.sock.Recv()
		if m.ctx.Err() != nil {
			return
		}
		if err != nil {
			continue
		}
		seq, ok := liveFrame(msg.Frames, m.prefix)
		if !ok {
			m.badFrames.Add(1)
			continue
		}
		m.route(string(msg.Frames[0]), entry{seq: seq, payload: msg.Frames[2]})
	}
}

// route queues e for topic, resolving the topic first if it has no route.
// A full queue drops e (the topic's goroutine then sees a gap).
func (m *Mux) route(topic string, e entry) {
	m.mu.Lock()
	if t := m.topics[topic]; t != nil {
		m.enqueue(t, e)
		m.mu.Unlock()
		return
	}
	m.mu.Unlock()
	// resolve and Unrouted run unlocked: they may call Stats or Forget.
	// Only this goroutine adds topics, so none appears meanwhile.
	r, ok := m.resolve(topic)
	if ok && (r.Handler == nil || r.ReplayEndpoint != "" && checkEndpoint("replay endpoint", r.ReplayEndpoint) != nil) {
		ok = false
	}
	if !ok {
		m.unrouted.Add(1)
		if m.cfg.Unrouted != nil {
			m.cfg.Unrouted(topic)
		}
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.enqueue(m.start(topic, r), e)
}

// enqueue queues e on t without blocking; m.mu is held (so the queue is
// not closed meanwhile).
func (m *Mux) enqueue(t *muxTopic, e entry) {
	select {
	case t.queue <- e:
	default:
		m.dropped.Add(1)
	}
}

// start gives topic its route and starts its goroutine; m.mu is held.
func (m *Mux) start(topic string, r Route) *muxTopic {
	t := &muxTopic{queue: make(chan entry, m.cfg.QueueLen), done: make(chan struct{})}
	s := &stream{
		replayEndpoint: r.ReplayEndpoint, replayTimeout: m.cfg.ReplayTimeout, retryInterval: defaultRetryInterval,
		handler: r.Handler, onGap: r.OnGap, onReset: r.OnReset, c: &m.counters,
	}
	prev := m.draining[topic]
	delete(m.draining, topic)
	m.topics[topic] = t
	m.routes.Go(func() { m.serve(topic, t, s, prev) })
	return t
}

// serve is a topic's goroutine: once the topic's previous goroutine (prev,
// nil if none) has ended, it processes the queue in order until the queue
// is closed and drained (Forget) or the Mux closes.
func (m *Mux) serve(topic string, t *muxTopic, s *stream, prev chan struct{}) {
	defer func() {
		m.mu.Lock()
		if m.draining[topic] == t.done {
			delete(m.draining, topic)
		}
		m.mu.Unlock()
		close(t.done)
	}()
	if prev != nil {
		select {
		case <-prev:
		case <-m.ctx.Done():
			return
		}
	}
	for {
		select {
		case <-m.ctx.Done():
			return
		case e, ok := <-t.queue:
			if !ok || m.ctx.Err() != nil {
				return
			}
			s.process(m.ctx, e.seq, e.payload)
		}
	}
}

// Forget drops topic's route (its goroutine ends once it has drained);
// its next message is resolved again, starting a fresh sequence. The
// batches already queued are still delivered to the old route, and the new
// route's callbacks start after the last of them.
func (m *Mux) Forget(topic string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.topics[topic]
	if t == nil {
		return
	}
	delete(m.topics, topic)
	close(t.queue)
	m.draining[topic] = t.done
}

// Addr is the bound address (the port chosen for :0), e.g.
// "tcp://127.0.0.1:40123": where publishers connect.
func (m *Mux) Addr() string { return boundAddr(m.sock, m.cfg.Endpoint) }

// Stats sums every topic's counts (SubscriberStats' fields; Connects counts
// the bind as 1) and adds how many messages were unrouted.
func (m *Mux) Stats() MuxStats {
	m.mu.Lock()
	n := len(m.topics)
	m.mu.Unlock()
	return MuxStats{SubscriberStats: m.counters.stats(), Unrouted: m.unrouted.Load(), Topics: n}
}

// Close stops reading, ends every topic's goroutine and waits for them
// (a callback still running is waited for, so do not call Close from one);
// queued batches are not delivered. It is safe to call twice.
func (m *Mux) Close() error {
	m.closing.Do(func() {
		m.cancel()
		m.reader.Wait()
		m.mu.Lock()
		for topic, t := range m.topics {
			delete(m.topics, topic)
			close(t.queue)
		}
		m.mu.Unlock()
		m.routes.Wait()
	})
	return nil
}
