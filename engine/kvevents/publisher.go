package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
)

// ErrClosed is returned by Publish after Close.
var ErrClosed = errors.New("kvevents: publisher closed")

// ErrQueueFull is returned by Publish when the send queue (max_queue_size)
// is full: the batch was dropped and counted, and the caller should go on.
// The batch gets no sequence number, so subscribers see no gap for it.
var ErrQueueFull = errors.New("kvevents: publisher queue full: batch dropped")

// endSeq is the replay terminator: -1 as an 8-byte signed big-endian int.
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// PublisherStats are a Publisher's counters.
type PublisherStats struct {
	Published      uint64 // batches handed to the PUB socket
	Dropped        uint64 // batches dropped because the queue was full
	SendErrors     uint64 // batches the PUB socket refused (they keep their seq: a gap)
	ReplayRequests uint64 // replay requests answered
	BadRequests    uint64 // malformed replay requests ignored
}

// Publisher publishes batches the way vLLM's ZmqEventPublisher does: PUB
// frames [topic, seq (8-byte big-endian), payload], seq counting from 0 per
// publisher, and, with a replay endpoint, a ROUTER that answers
// [identity, "", start_seq] with [identity, "", topic, seq, payload] for
// every buffered batch with seq >= start_seq, then the end marker
// [identity, "", "", -1, ""] (vLLM 0.26 and later; with
// Config.LegacyReplay, older vLLM's [identity, "", seq, payload] and
// [identity, "", -1, ""]).
//
// Publish encodes on the caller's goroutine and never blocks: batches wait in
// a bounded queue for one sending goroutine.
//
// Known upstream leak: zmq4 v0.17's PUB socket starts a writer goroutine
// ((*pubMWriter).run) that its Close never stops, so each Publisher leaves
// that one idle goroutine behind after Close.
type Publisher struct {
	cfg    Config
	topic  []byte
	cancel context.CancelFunc
	pub    zmq4.Socket // nil for the null publisher
	replay zmq4.Socket // nil without a replay endpoint

	mu     sync.RWMutex // guards closed against sends on queue
	closed bool
	queue  chan []byte

	ringMu sync.Mutex
	ring   []entry // circular, cap BufferSteps
	head   int     // index of the oldest entry
	n      int

	sender sync.WaitGroup // the sending goroutine
	others sync.WaitGroup // replay server, background dial

	published, dropped, sendErrors, replays, badRequests atomic.Uint64

	hooks publisherHooks
}

type entry struct {
	seq     uint64
	payload []byte
}

// publisherHooks are test hooks.
type publisherHooks struct {
	// skipSend, when it returns true, buffers a batch (with its seq) but does
	// not send it: a message lost on the wire.
	skipSend func(seq uint64) bool
	// firstSeq is the first sequence number (vLLM starts at 0).
	firstSeq uint64
}

// NewPublisher validates cfg and starts publishing. A config with events
// disabled or publisher "null" yields a Publisher that discards batches, as
// vLLM's NullEventPublisher does. Binding errors are returned; a connecting
// endpoint is dialled in the background, retrying until Close.
func NewPublisher(ctx context.Context, cfg Config) (*Publisher, error) {
	return newPublisher(ctx, cfg, publisherHooks{})
}

func newPublisher(ctx context.Context, cfg Config, hooks publisherHooks) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	p := &Publisher{cfg: cfg, topic: []byte(cfg.Topic), cancel: cancel, hooks: hooks}
	if !cfg.EnableKVCacheEvents || cfg.Publisher == PublisherNull {
		return p, nil
	}
	p.pub = zmq4.NewPub(ctx, quiet(), zmq4.WithDialerMaxRetries(-1), zmq4.WithDialerRetry(100*time.Millisecond))
	if cfg.HWM > 0 {
		if err := p.pub.SetOption(zmq4.OptionHWM, cfg.HWM); err != nil {
			p.abort()
			return nil, fmt.Errorf("kvevents: set hwm: %w", err)
		}
	}
	if cfg.ForceBind || Binds(cfg.Endpoint) {
		if err := p.pub.Listen(cfg.Endpoint); err != nil {
			p.abort()
			return nil, fmt.Errorf("kvevents: bind endpoint %q: %w", cfg.Endpoint, err)
		}
	} else {
		p.others.Go(func() { _ = p.pub.Dial(cfg.Endpoint) })
	}
	if cfg.ReplayEndpoint != "" {
		p.replay = zmq4.NewRouter(ctx, quiet())
		if err := p.replay.Listen(cfg.ReplayEndpoint); err != nil {
			p.abort()
			return nil, fmt.Errorf("kvevents: bind replay_endpoint %q: %w", cfg.ReplayEndpoint, err)
		}
		p.others.Go(func() { p.serveReplay(ctx) })
	}
	if cfg.BufferSteps > 0 {
		p.ring = make([]entry, cfg.BufferSteps)
	}
	p.queue = make(chan []byte, cfg.MaxQueueSize)
	p.sender.Go(func() { p.send(ctx) })
	return p, nil
}

func closeSocket(s zmq4.Socket) error {
	if s == nil {
		return nil
	}
	return s.Close()
}

// abort undoes a failed NewPublisher.
func (p *Publisher) abort() {
	p.cancel()
	if p.pub != nil {
		_ = p.pub.Close()
	}
	if p.replay != nil {
		_ = p.replay.Close()
	}
	p.others.Wait()
}

// Publish encodes b in the configured format and queues it for sending. It
// never blocks: with the queue full it drops b and returns ErrQueueFull.
// Encoding errors are returned and nothing is queued.
func (p *Publisher) Publish(b Batch) error {
	if p.pub == nil {
		p.mu.RLock()
		defer p.mu.RUnlock()
		if p.closed {
			return ErrClosed
		}
		return nil
	}
	payload, err := EncodeBatch(b, p.cfg.Format)
	if err != nil {
		return err
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return ErrClosed
	}
	select {
	case p.queue <- payload:
		return nil
	default:
		p.dropped.Add(1)
		return ErrQueueFull
	}
}

// send is the sending goroutine: it numbers batches, buffers them for replay
// and hands them to the PUB socket. It ends when the queue is closed and
// drained, or when ctx ends.
func (p *Publisher) send(ctx context.Context) {
	seq := p.hooks.firstSeq
	for {
		var payload []byte
		var ok bool
		select {
		case <-ctx.Done():
			return
		case payload, ok = <-p.queue:
			if !ok {
				return
			}
		}
		p.buffer(seq, payload)
		if p.hooks.skipSend == nil || !p.hooks.skipSend(seq) {
			var sb [8]byte
			binary.BigEndian.PutUint64(sb[:], seq)
			if err := p.pub.SendMulti(zmq4.NewMsgFrom(p.topic, sb[:], payload)); err != nil {
				p.sendErrors.Add(1)
			} else {
				p.published.Add(1)
			}
		}
		seq++
	}
}

func (p *Publisher) buffer(seq uint64, payload []byte) {
	if len(p.ring) == 0 {
		return
	}
	p.ringMu.Lock()
	defer p.ringMu.Unlock()
	i := (p.head + p.n) % len(p.ring)
	p.ring[i] = entry{seq: seq, payload: payload}
	if p.n < len(p.ring) {
		p.n++
	} else {
		p.head = (p.head + 1) % len(p.ring)
	}
}

// since returns the buffered batches with seq >= start, oldest first.
func (p *Publisher) since(start uint64) []entry {
	p.ringMu.Lock()
	defer p.ringMu.Unlock()
	var out []entry
	for k := range p.n {
		e := p.ring[(p.head+k)%len(p.ring)]
		if e.seq >= start {
			out = append(out, e)
		}
	}
	return out
}

// serveReplay answers replay requests until ctx ends.
func (p *Publisher) serveReplay(ctx context.Context) {
	for {
		msg, err := p.replay.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		// vLLM expects exactly [identity, "", start_seq].
		if len(msg.Frames) != 3 || len(msg.Frames[2]) == 0 || len(msg.Frames[2]) > 8 {
			p.badRequests.Add(1)
			continue
		}
		id := msg.Frames[0]
		start := tailUint64(msg.Frames[2])
		for _, e := range p.since(start) {
			var sb [8]byte
			binary.BigEndian.PutUint64(sb[:], e.seq)
			if err := p.replay.Send(p.replyMsg(id, p.topic, sb[:], e.payload)); err != nil {
				break
			}
		}
		// The end marker's topic frame is empty, as in vLLM.
		_ = p.replay.Send(p.replyMsg(id, nil, endSeq, nil))
		p.replays.Add(1)
	}
}

// replyMsg frames one replay reply to the DEALER with identity id in the
// configured shape: with the topic frame, or without it (LegacyReplay).
func (p *Publisher) replyMsg(id, topic, seq, payload []byte) zmq4.Msg {
	if p.cfg.LegacyReplay {
		return zmq4.NewMsgFrom(id, nil, seq, payload)
	}
	return zmq4.NewMsgFrom(id, nil, topic, seq, payload)
}

// Addr is the endpoint the PUB socket is bound to, with the port the system
// chose for port 0 (e.g. "tcp://127.0.0.1:40123"); "" when it connects or
// for the null publisher.
func (p *Publisher) Addr() string { return boundAddr(p.pub, p.cfg.Endpoint) }

// ReplayAddr is the endpoint the replay ROUTER is bound to; "" without one.
func (p *Publisher) ReplayAddr() string { return boundAddr(p.replay, p.cfg.ReplayEndpoint) }

func boundAddr(s zmq4.Socket, ep string) string {
	if s == nil || s.Addr() == nil {
		return ""
	}
	if scheme, _, ok := strings.Cut(ep, "://"); ok && scheme == "tcp" {
		return "tcp://" + s.Addr().String()
	}
	return ep
}

// Stats returns the publisher's counters.
func (p *Publisher) Stats() PublisherStats {
	return PublisherStats{
		Published:      p.published.Load(),
		Dropped:        p.dropped.Load(),
		SendErrors:     p.sendErrors.Load(),
		ReplayRequests: p.replays.Load(),
		BadRequests:    p.badRequests.Load(),
	}
}

// Close hands the queued batches to the PUB socket, then closes the sockets
// and waits for the goroutines it started (messages the socket has not yet
// written are lost, as with vLLM's linger=0). It is safe to call more than
// once; Publish returns ErrClosed afterwards.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	if p.queue != nil {
		close(p.queue)
	}
	p.mu.Unlock()
	p.sender.Wait()
	p.cancel()
	var errs []error
	for _, sock := range []zmq4.Socket{p.pub, p.replay} {
		// zmq4 reports connections its reaper already closed; not an error.
		if err := closeSocket(sock); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	p.others.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("kvevents: close publisher: %w", err)
	}
	return nil
}
