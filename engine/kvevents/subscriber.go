package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
)

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	// Endpoint is the engine's PUB endpoint to connect to, e.g.
	// "tcp://10.0.0.7:5557"; with Bind, the endpoint to listen on for
	// engines to connect to, e.g. "tcp://*:5557" or "tcp://127.0.0.1:0".
	Endpoint string
	// Bind makes the SUB socket listen on Endpoint for publishers to
	// connect to, rather than dial it. vLLM's publisher connects when its
	// endpoint has no "*" (see Binds), as in llm-d's deployments, where the
	// router binds and the engines connect. NewSubscriber binds before it
	// returns and returns a bind error; Addr reports the bound address. The
	// socket stays bound until Close: a publisher that goes away and comes
	// back connects to it again (a restarted one is seen as a Reset). Bind
	// for one publisher at a time: the Subscriber follows one sequence, so
	// two publishers' batches look like gaps and resets. Replay still
	// dials ReplayEndpoint.
	Bind bool
	// ReplayEndpoint is the engine's replay ROUTER endpoint; "" disables
	// gap repair (gaps are still detected and reported).
	ReplayEndpoint string
	// Topic is the subscription prefix ("" receives every topic).
	Topic string
	// OnGap, if set, is told about every run of missed sequence numbers and
	// whether replay repaired it. An unrepaired gap means the caller's view
	// of the engine's cache is out of sync (fall back to an approximate
	// index until it has rebuilt).
	OnGap func(Gap)
	// OnReset, if set, is told when the sequence goes backwards: the
	// publisher restarted, so its cache started empty.
	OnReset func(Reset)
	// ReplayTimeout bounds one replay request (default 5 s).
	ReplayTimeout time.Duration
	// RetryInterval is the wait between connection attempts (default 100 ms).
	RetryInterval time.Duration
}

// Gap is a run of sequence numbers [First, Last] that did not arrive live.
// Repaired says every one of them was delivered from replay, in order,
// before the batch that revealed the gap. A batch that arrived but could not
// be decoded is reported as an unrepaired gap of one.
type Gap struct {
	First, Last uint64
	Repaired    bool
}

// Reset reports a publisher restart: Seq arrived after Prev with Seq <= Prev.
// After a reset the Subscriber treats 0..Seq-1 as a gap (replayed when it
// can), as llm-d does, so the new engine's history is complete.
type Reset struct {
	Prev, Seq uint64
}

// SubscriberStats are a Subscriber's counters.
type SubscriberStats struct {
	Received     uint64 // batches delivered as they arrived
	Replayed     uint64 // batches delivered from replay
	Gaps         uint64 // runs of missed sequence numbers
	Missed       uint64 // sequence numbers neither received nor replayed
	Resets       uint64 // publisher restarts
	DecodeErrors uint64 // payloads that were not valid batches
	BadFrames    uint64 // live messages not shaped [topic, seq, payload], and malformed replay replies
	// Connects counts the times the subscriber became ready to receive:
	// successful dials of the PUB endpoint or, with Bind, the one
	// successful bind. Publishers connecting to a bound socket are not
	// counted (zmq4 does not report them); a publisher that restarted
	// shows up as a Reset.
	Connects uint64
}

// Subscriber receives vLLM KV event batches from one engine and hands them
// to a handler in sequence order, repairing gaps by replay where it can.
// The handler and callbacks run on the Subscriber's one goroutine, so they
// need no locking but should return quickly.
//
// The first batch after start sets the expected sequence; nothing before it
// is requested. When the connection fails the Subscriber redials every
// RetryInterval (its own loop: zmq4's automatic reconnect redials from inside
// its reader goroutine); with Bind it keeps its socket and the publisher
// reconnects to it. Either way, batches the same publisher sent meanwhile
// show up as a gap and are replayed when possible.
type Subscriber struct {
	cfg    SubscriberConfig
	topic  []byte
	cancel context.CancelFunc
	wg     sync.WaitGroup
	bound  zmq4.Socket // the listening SUB socket with Bind; nil when dialling
	stream stream      // the publisher's sequence, owned by the run goroutine

	counters
}

// defaultRetryInterval is SubscriberConfig.RetryInterval's default, and the
// replay DEALER's redial interval in a Mux.
const defaultRetryInterval = 100 * time.Millisecond

// counters are a Subscriber's or a Mux's counts (see SubscriberStats); the
// streams of a Mux share its one set.
type counters struct {
	received, replayed, gaps, missed, resets, decodeErrors, badFrames, connects atomic.Uint64
}

func (c *counters) stats() SubscriberStats {
	return SubscriberStats{
		Received:     c.received.Load(),
		Replayed:     c.replayed.Load(),
		Gaps:         c.gaps.Load(),
		Missed:       c.missed.Load(),
		Resets:       c.resets.Load(),
		DecodeErrors: c.decodeErrors.Load(),
		BadFrames:    c.badFrames.Load(),
		Connects:     c.connects.Load(),
	}
}

// stream follows one publisher's sequence, for a Subscriber or for one
// topic of a Mux: the first batch sets the expected sequence, a lower one is
// a reset and a higher one a gap, repaired from the replay endpoint where it
// can; batches are decoded and handed to handler in sequence order. Its
// methods run on one goroutine at a time; it counts into c.
type stream struct {
	replayEndpoint string // "" no replay
	replayTimeout  time.Duration
	retryInterval  time.Duration // the replay DEALER's redial interval
	handler        func(seq uint64, b Batch)
	onGap          func(Gap)   // optional
	onReset        func(Reset) // optional
	c              *counters

	have bool   // a batch has arrived
	next uint64 // the seq expected next, once have
}

// NewSubscriber validates cfg and starts receiving in the background; it
// returns at once and keeps trying to connect (and reconnect) until Close.
// With cfg.Bind it binds Endpoint first and returns the error if it cannot.
func NewSubscriber(ctx context.Context, cfg SubscriberConfig, handler func(seq uint64, b Batch)) (*Subscriber, error) {
	if handler == nil {
		return nil, errors.New("kvevents: subscriber needs a handler")
	}
	if err := checkEndpoint("subscriber endpoint", cfg.Endpoint); err != nil {
		return nil, err
	}
	if cfg.ReplayEndpoint != "" {
		if err := checkEndpoint("subscriber replay endpoint", cfg.ReplayEndpoint); err != nil {
			return nil, err
		}
	}
	if cfg.ReplayTimeout < 0 || cfg.RetryInterval < 0 {
		return nil, fmt.Errorf("kvevents: subscriber timeouts must not be negative (replay %v, retry %v)", cfg.ReplayTimeout, cfg.RetryInterval)
	}
	if cfg.ReplayTimeout == 0 {
		cfg.ReplayTimeout = 5 * time.Second
	}
	if cfg.RetryInterval == 0 {
		cfg.RetryInterval = defaultRetryInterval
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &Subscriber{cfg: cfg, topic: []byte(cfg.Topic), cancel: cancel}
	s.stream = stream{
		replayEndpoint: cfg.ReplayEndpoint, replayTimeout: cfg.ReplayTimeout, retryInterval: cfg.RetryInterval,
		handler: handler, onGap: cfg.OnGap, onReset: cfg.OnReset, c: &s.counters,
	}
	if cfg.Bind {
		sock := zmq4.NewSub(ctx, quiet())
		err := sock.SetOption(zmq4.OptionSubscribe, cfg.Topic)
		if err == nil {
			err = sock.Listen(cfg.Endpoint)
		}
		if err != nil {
			cancel()
			_ = sock.Close()
			return nil, fmt.Errorf("kvevents: bind subscriber endpoint %q: %w", cfg.Endpoint, err)
		}
		s.bound = sock
		s.connects.Add(1)
	}
	s.wg.Go(func() { s.run(ctx) })
	return s, nil
}

// quiet keeps zmq4 from logging to stderr.
func quiet() zmq4.Option { return zmq4.WithLogger(log.New(io.Discard, "", 0)) }

// run connects, reads until the connection fails, and reconnects; with Bind
// it reads from the bound socket until ctx ends.
func (s *Subscriber) run(ctx context.Context) {
	if s.bound != nil {
		s.read(ctx, s.bound)
		closeAndDrain(s.bound)
		return
	}
	for ctx.Err() == nil {
		sock := zmq4.NewSub(ctx, quiet(), zmq4.WithDialerMaxRetries(-1), zmq4.WithDialerRetry(s.cfg.RetryInterval))
		if err := sock.SetOption(zmq4.OptionSubscribe, s.cfg.Topic); err == nil {
			if err := sock.Dial(s.cfg.Endpoint); err == nil {
				s.connects.Add(1)
				s.read(ctx, sock)
			}
		}
		closeAndDrain(sock)
		select {
		case <-ctx.Done():
		case <-time.After(s.cfg.RetryInterval):
		}
	}
}

// closeAndDrain closes a zmq4 socket and then receives a few times: zmq4
// v0.17's per-connection reader goroutine blocks forever on a full internal
// channel once nobody reads, and each Recv after Close takes a queued
// message with probability 1/2, which unblocks it.
func closeAndDrain(sock zmq4.Socket) {
	_ = sock.Close()
	for range 64 {
		_, _ = sock.Recv()
	}
}

// read processes messages until ctx ends or, for a dialled socket, the
// connection fails. A bound socket outlives its connections: a publisher
// going away fails one Recv, and the socket goes on receiving from the
// publishers that connect.
func (s *Subscriber) read(ctx context.Context, sock zmq4.Socket) {
	for {
		msg, err := sock.Recv()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if s.bound != nil {
				continue
			}
			return
		}
		seq, ok := liveFrame(msg.Frames, s.topic)
		if !ok {
			s.badFrames.Add(1)
			continue
		}
		s.stream.process(ctx, seq, msg.Frames[2])
	}
}

// liveFrame checks that a live message is shaped [topic, seq (8 bytes),
// payload] with topic starting with prefix, and returns its seq.
func liveFrame(f [][]byte, prefix []byte) (seq uint64, ok bool) {
	if len(f) != 3 || len(f[1]) != 8 || !bytes.HasPrefix(f[0], prefix) {
		return 0, false
	}
	return binary.BigEndian.Uint64(f[1]), true
}

// process handles one live batch: gap and reset detection, replay, delivery.
func (s *stream) process(ctx context.Context, seq uint64, payload []byte) {
	if s.have {
		if seq < s.next {
			s.c.resets.Add(1)
			if s.onReset != nil {
				s.onReset(Reset{Prev: s.next - 1, Seq: seq})
			}
			s.next = 0
		}
		if seq > s.next {
			s.fill(ctx, s.next, seq-1)
		}
	}
	s.have, s.next = true, seq+1
	if s.deliver(seq, payload) {
		s.c.received.Add(1)
		return
	}
	s.reportGap(Gap{First: seq, Last: seq})
}

// fill repairs the gap [first, last] from replay where it can and reports it.
func (s *stream) fill(ctx context.Context, first, last uint64) {
	var delivered uint64
	if s.replayEndpoint != "" {
		entries, _ := s.fetchReplay(ctx, first)
		want := first
		for _, e := range entries {
			if e.seq < want || e.seq > last {
				continue
			}
			want = e.seq + 1
			if s.deliver(e.seq, e.payload) {
				s.c.replayed.Add(1)
				delivered++
			}
		}
	}
	s.reportGap(Gap{First: first, Last: last, Repaired: delivered == last-first+1})
}

func (s *stream) reportGap(g Gap) {
	s.c.gaps.Add(1)
	if !g.Repaired {
		s.c.missed.Add(g.Last - g.First + 1)
	}
	if s.onGap != nil {
		s.onGap(g)
	}
}

func (s *stream) deliver(seq uint64, payload []byte) bool {
	b, err := DecodeBatch(payload)
	if err != nil {
		s.c.decodeErrors.Add(1)
		return false
	}
	s.handler(seq, b)
	return true
}

// fetchReplay asks the replay ROUTER for every buffered batch with seq >=
// start, over a DEALER that sends ["", start] and reads replies (see
// replayFrame) until seq is -1.
func (s *stream) fetchReplay(ctx context.Context, start uint64) ([]entry, error) {
	ctx, cancel := context.WithTimeout(ctx, s.replayTimeout)
	defer cancel()
	d := zmq4.NewDealer(ctx, quiet(), zmq4.WithDialerMaxRetries(-1), zmq4.WithDialerRetry(s.retryInterval))
	defer closeAndDrain(d)
	if err := d.Dial(s.replayEndpoint); err != nil {
		return nil, fmt.Errorf("kvevents: dial replay endpoint %q: %w", s.replayEndpoint, err)
	}
	var sb [8]byte
	binary.BigEndian.PutUint64(sb[:], start)
	if err := d.Send(zmq4.NewMsgFrom(nil, sb[:])); err != nil {
		return nil, fmt.Errorf("kvevents: send replay request: %w", err)
	}
	var out []entry
	for {
		msg, err := d.Recv()
		if err != nil {
			return out, fmt.Errorf("kvevents: replay from %d: %w", start, err)
		}
		seq, payload, ok := replayFrame(msg.Frames)
		if !ok {
			s.c.badFrames.Add(1)
			continue
		}
		if bytes.Equal(seq, endSeq) {
			return out, nil
		}
		out = append(out, entry{seq: binary.BigEndian.Uint64(seq), payload: payload})
	}
}

// replayFrame splits a replay reply as the DEALER receives it, in either of
// vLLM's shapes: ["", topic, seq, payload] (vLLM 0.26 and later, after PR
// #45177, and llm-d-inference-sim) or ["", seq, payload] (older vLLM). The
// end marker is the same with seq -1 and an empty payload (and an empty
// topic). The topic is not checked: the replay endpoint serves one engine,
// and the end marker's topic is empty whatever the subscription.
func replayFrame(f [][]byte) (seq, payload []byte, ok bool) {
	switch {
	case len(f) == 4 && len(f[0]) == 0 && len(f[2]) == 8:
		return f[2], f[3], true
	case len(f) == 3 && len(f[0]) == 0 && len(f[1]) == 8:
		return f[1], f[2], true
	}
	return nil, nil, false
}

// Addr is the endpoint the SUB socket is bound to with Bind, with the port
// the system chose for port 0 (e.g. "tcp://127.0.0.1:40123"): where
// publishers connect. It is "" when the subscriber dials.
func (s *Subscriber) Addr() string { return boundAddr(s.bound, s.cfg.Endpoint) }

// Stats returns the subscriber's counters.
func (s *Subscriber) Stats() SubscriberStats { return s.counters.stats() }

// Close stops receiving and waits for the Subscriber's goroutine (and the
// zmq4 goroutines it started) to finish.
func (s *Subscriber) Close() error {
	s.cancel()
	s.wg.Wait()
	return nil
}
