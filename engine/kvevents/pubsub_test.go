package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/inferrail/inferrail/engine"
)

const deadline = 20 * time.Second

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return port
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(deadline)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// goroutineIDs returns the live goroutines by id, with their stacks.
func goroutineIDs() map[string]string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	out := map[string]string{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		id, _, _ := strings.Cut(strings.TrimPrefix(g, "goroutine "), " ")
		out[id] = g
	}
	return out
}

// knownLeak is zmq4 v0.17's PUB writer goroutine, which its Close never
// stops (see Publisher).
const knownLeak = "zmq4.(*pubMWriter).run"

// noLeaks fails the test if goroutines started after it was called are still
// running (other than knownLeak) once the returned func is called.
func noLeaks(t *testing.T) func() {
	before := goroutineIDs()
	return func() {
		t.Helper()
		var extra []string
		end := time.Now().Add(5 * time.Second)
		for {
			extra = extra[:0]
			for id, g := range goroutineIDs() {
				if _, ok := before[id]; !ok && !strings.Contains(g, knownLeak) && !strings.Contains(g, "noLeaks") {
					extra = append(extra, g)
				}
			}
			if len(extra) == 0 || time.Now().After(end) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if len(extra) > 0 {
			t.Fatalf("%d goroutines left after Close:\n%s", len(extra), strings.Join(extra, "\n\n"))
		}
	}
}

// sink records what a Subscriber delivers.
type sink struct {
	mu      sync.Mutex
	seqs    []uint64
	batches []Batch
	gaps    []Gap
	resets  []Reset
}

func (s *sink) handle(seq uint64, b Batch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seqs = append(s.seqs, seq)
	s.batches = append(s.batches, b)
}

func (s *sink) config(ep, replay string) SubscriberConfig {
	return SubscriberConfig{
		Endpoint: ep, ReplayEndpoint: replay, RetryInterval: 20 * time.Millisecond,
		OnGap:   func(g Gap) { s.mu.Lock(); s.gaps = append(s.gaps, g); s.mu.Unlock() },
		OnReset: func(r Reset) { s.mu.Lock(); s.resets = append(s.resets, r); s.mu.Unlock() },
	}
}

func (s *sink) count(pred func(seq uint64, b Batch) bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for i, b := range s.batches {
		if pred(s.seqs[i], b) {
			n++
		}
	}
	return n
}

const probeTS = -1

func anyBatch(uint64, Batch) bool { return true }

// probe publishes probe batches until the subscriber has received one: a
// SUB receives nothing until its subscription reaches the PUB (slow joiner).
func probe(t *testing.T, p *Publisher, s *sink, pred func(seq uint64, b Batch) bool) {
	t.Helper()
	end := time.Now().Add(deadline)
	for s.count(pred) == 0 {
		if time.Now().After(end) {
			t.Fatal("subscriber never received a probe batch")
		}
		if err := p.Publish(Batch{TS: probeTS}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func localConfig(replay bool) Config {
	c := DefaultConfig()
	c.Endpoint = "tcp://127.0.0.1:0"
	c.ForceBind = true
	if replay {
		c.ReplayEndpoint = "tcp://127.0.0.1:0"
	}
	return c
}

func storedBatch(i int) Batch {
	return Batch{TS: float64(i), DataParallelRank: ptr(0), Events: []Event{{
		Kind: engine.BlockStored, BlockHashes: []BlockHash{IntHash(uint64(i)), IntHash(uint64(i) << 40)},
		TokenIDs: []uint32{uint32(i), 2, 3, 4}, BlockSize: 2, Medium: "GPU",
	}}}
}

// contiguous checks that seqs increase by one.
func contiguous(t *testing.T, seqs []uint64) {
	t.Helper()
	for i := 1; i < len(seqs); i++ {
		if seqs[i] != seqs[i-1]+1 {
			t.Fatalf("sequence not contiguous at %d: %d then %d", i, seqs[i-1], seqs[i])
		}
	}
}

func TestPubSubDelivery(t *testing.T) {
	for _, f := range []Format{FormatMap, FormatArray} {
		t.Run(f.String(), func(t *testing.T) {
			check := noLeaks(t)
			cfg := localConfig(false)
			cfg.Format = f
			p, err := NewPublisher(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			s := &sink{}
			sub, err := NewSubscriber(t.Context(), s.config(p.Addr(), ""), s.handle)
			if err != nil {
				t.Fatal(err)
			}
			probe(t, p, s, anyBatch)
			const n = 200
			for i := 1; i <= n; i++ {
				if err := p.Publish(storedBatch(i)); err != nil {
					t.Fatal(err)
				}
			}
			real := func(_ uint64, b Batch) bool { return b.TS > 0 }
			waitFor(t, "all batches", func() bool { return s.count(real) == n })
			if err := sub.Close(); err != nil {
				t.Fatal(err)
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			contiguous(t, s.seqs)
			i := 0
			for _, b := range s.batches {
				if b.TS < 0 {
					continue
				}
				i++
				if !reflect.DeepEqual(b, storedBatch(i)) {
					t.Fatalf("batch %d: got %+v want %+v", i, b, storedBatch(i))
				}
			}
			st := sub.Stats()
			if st.Gaps != 0 || st.Resets != 0 || st.DecodeErrors != 0 || st.Received != uint64(len(s.seqs)) {
				t.Fatalf("stats %+v", st)
			}
			if ps := p.Stats(); ps.Published < n || ps.Dropped != 0 {
				t.Fatalf("publisher stats %+v", ps)
			}
			if err := p.Publish(Batch{}); !errors.Is(err, ErrClosed) {
				t.Fatalf("Publish after Close: %v", err)
			}
			check()
		})
	}
}

// TestWireFrames reads the PUB stream with a bare zmq4 SUB: three frames,
// the topic, the 8-byte big-endian seq and the payload.
func TestWireFrames(t *testing.T) {
	check := noLeaks(t)
	cfg := localConfig(false)
	cfg.Topic = "kv@10.0.0.1:5557@model"
	p, err := NewPublisher(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	sub := zmq4.NewSub(t.Context(), quiet())
	if err := sub.SetOption(zmq4.OptionSubscribe, "kv@"); err != nil {
		t.Fatal(err)
	}
	if err := sub.Dial(p.Addr()); err != nil {
		t.Fatal(err)
	}
	msgs := make(chan zmq4.Msg, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		m, err := sub.Recv()
		if err == nil {
			msgs <- m
		}
		close(msgs)
	})
	var got zmq4.Msg
	end := time.Now().Add(deadline)
loop:
	for {
		if err := p.Publish(storedBatch(7)); err != nil {
			t.Fatal(err)
		}
		select {
		case got = <-msgs:
			break loop
		case <-time.After(10 * time.Millisecond):
			if time.Now().After(end) {
				t.Fatal("no message")
			}
		}
	}
	closeAndDrain(sub)
	wg.Wait()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	want, _ := EncodeBatch(storedBatch(7), FormatMap)
	if len(got.Frames) != 3 || string(got.Frames[0]) != cfg.Topic || len(got.Frames[1]) != 8 || !bytes.Equal(got.Frames[2], want) {
		t.Fatalf("frames %q", got.Frames)
	}
	check()
}

// TestReplayProtocol talks to the replay ROUTER with a bare DEALER, as llm-d
// does: ["", start] in; ["", topic, seq, payload]... then ["", "", -1, ""]
// out (vLLM 0.26 and later), or with LegacyReplay ["", seq, payload]... then
// ["", -1, ""] (older vLLM). Only the last buffer_steps batches are kept.
func TestReplayProtocol(t *testing.T) {
	const topic = "kv@10.0.0.1:5557@model"
	be := func(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }
	p2, _ := EncodeBatch(storedBatch(2), FormatMap)
	p3, _ := EncodeBatch(storedBatch(3), FormatMap)
	for _, c := range []struct {
		legacy bool
		want   [][][]byte
	}{
		{false, [][][]byte{{{}, []byte(topic), be(1), p2}, {{}, []byte(topic), be(2), p3}, {{}, {}, endSeq, {}}}},
		{true, [][][]byte{{{}, be(1), p2}, {{}, be(2), p3}, {{}, endSeq, {}}}},
	} {
		t.Run(fmt.Sprintf("legacy=%v", c.legacy), func(t *testing.T) {
			check := noLeaks(t)
			cfg := localConfig(true)
			cfg.BufferSteps = 2
			cfg.Topic = topic
			cfg.LegacyReplay = c.legacy
			p, err := NewPublisher(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			for i := 1; i <= 3; i++ {
				if err := p.Publish(storedBatch(i)); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, "3 batches sent", func() bool { return p.Stats().Published == 3 })

			ask := func(start []byte) [][][]byte {
				d := zmq4.NewDealer(t.Context(), quiet())
				defer closeAndDrain(d)
				if err := d.Dial(p.ReplayAddr()); err != nil {
					t.Fatal(err)
				}
				if err := d.Send(zmq4.NewMsgFrom(nil, start)); err != nil {
					t.Fatal(err)
				}
				var out [][][]byte
				for {
					m, err := d.Recv()
					if err != nil {
						t.Fatal(err)
					}
					out = append(out, m.Frames)
					if f := m.Frames; len(f) >= 3 && bytes.Equal(f[len(f)-2], endSeq) {
						return out
					}
				}
			}
			seqAt := len(c.want[0]) - 2
			if got := ask(be(0)); fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Fatalf("replay from 0 (seq 0 evicted)\n got %x\nwant %x", got, c.want)
			}
			if got := ask(be(2)); len(got) != 2 || !bytes.Equal(got[0][seqAt], be(2)) {
				t.Fatalf("replay from 2: %x", got)
			}
			if got := ask(be(9)); len(got) != 1 {
				t.Fatalf("replay from 9: %x, want only the terminator", got)
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			if st := p.Stats(); st.ReplayRequests != 3 {
				t.Fatalf("stats %+v", st)
			}
			check()
		})
	}
}

// TestGapRepairedByReplay loses one batch on the wire (it stays in the
// replay buffer): the subscriber sees the gap, replays it and delivers every
// batch exactly once, in sequence order.
func TestGapRepairedByReplay(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		t.Run(fmt.Sprintf("legacy=%v", legacy), func(t *testing.T) { testGapRepairedByReplay(t, legacy, false) })
	}
}

func testGapRepairedByReplay(t *testing.T, legacy, bind bool) {
	check := noLeaks(t)
	var dropNext atomic.Bool
	cfg := localConfig(true)
	cfg.LegacyReplay = legacy
	s := &sink{}
	var sub *Subscriber
	if bind {
		// The subscriber comes first (the publisher connects to it), so
		// the replay endpoint is chosen up front.
		cfg.ReplayEndpoint = fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
		var err error
		if sub, err = NewSubscriber(t.Context(), bindConfig(s, cfg.ReplayEndpoint), s.handle); err != nil {
			t.Fatal(err)
		}
		cfg.Endpoint, cfg.ForceBind = sub.Addr(), false
	}
	p, err := newPublisher(t.Context(), cfg, publisherHooks{
		skipSend: func(uint64) bool { return dropNext.CompareAndSwap(true, false) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if !bind {
		if sub, err = NewSubscriber(t.Context(), s.config(p.Addr(), p.ReplayAddr()), s.handle); err != nil {
			t.Fatal(err)
		}
	}
	probe(t, p, s, anyBatch)
	dropNext.Store(true)
	for i := 1; i <= 3; i++ {
		if err := p.Publish(storedBatch(i)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "batch 3", func() bool { return s.count(func(_ uint64, b Batch) bool { return b.TS == 3 }) == 1 })
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	contiguous(t, s.seqs)
	var ts []float64
	for _, b := range s.batches {
		if b.TS > 0 {
			ts = append(ts, b.TS)
		}
	}
	if fmt.Sprint(ts) != "[1 2 3]" {
		t.Fatalf("delivered %v, want [1 2 3]", ts)
	}
	st := sub.Stats()
	if len(s.gaps) != 1 || !s.gaps[0].Repaired || s.gaps[0].First != s.gaps[0].Last || st.Replayed != 1 || st.Gaps != 1 || st.Missed != 0 {
		t.Fatalf("gaps %+v stats %+v", s.gaps, st)
	}
	check()
}

// TestGapWithoutReplay reports the gap as unrepaired.
func TestGapWithoutReplay(t *testing.T) {
	check := noLeaks(t)
	var dropNext atomic.Bool
	p, err := newPublisher(t.Context(), localConfig(false), publisherHooks{
		skipSend: func(uint64) bool { return dropNext.CompareAndSwap(true, false) },
	})
	if err != nil {
		t.Fatal(err)
	}
	s := &sink{}
	sub, err := NewSubscriber(t.Context(), s.config(p.Addr(), ""), s.handle)
	if err != nil {
		t.Fatal(err)
	}
	probe(t, p, s, anyBatch)
	dropNext.Store(true)
	for i := 1; i <= 2; i++ {
		if err := p.Publish(storedBatch(i)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "batch 2", func() bool { return s.count(func(_ uint64, b Batch) bool { return b.TS == 2 }) == 1 })
	_ = sub.Close()
	_ = p.Close()
	if st := sub.Stats(); len(s.gaps) != 1 || s.gaps[0].Repaired || st.Missed != 1 {
		t.Fatalf("gaps %+v stats %+v", s.gaps, st)
	}
	check()
}

// TestPublisherRestartIsReset restarts the publisher on the same port: its
// sequence starts again at 0, and the subscriber reports a reset.
func TestPublisherRestartIsReset(t *testing.T) {
	check := noLeaks(t)
	cfg := localConfig(false)
	cfg.Endpoint = fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	const first = 1 << 20
	p1, err := newPublisher(t.Context(), cfg, publisherHooks{firstSeq: first})
	if err != nil {
		t.Fatal(err)
	}
	s := &sink{}
	sub, err := NewSubscriber(t.Context(), s.config(cfg.Endpoint, ""), s.handle)
	if err != nil {
		t.Fatal(err)
	}
	probe(t, p1, s, anyBatch)
	if err := p1.Close(); err != nil {
		t.Fatal(err)
	}
	var p2 *Publisher
	waitFor(t, "rebinding the port", func() bool {
		p2, err = NewPublisher(t.Context(), cfg)
		return err == nil
	})
	probe(t, p2, s, func(seq uint64, _ Batch) bool { return seq < first })
	_ = sub.Close()
	_ = p2.Close()
	if len(s.resets) != 1 || s.resets[0].Prev < first || s.resets[0].Seq >= first {
		t.Fatalf("resets %+v", s.resets)
	}
	if st := sub.Stats(); st.Resets != 1 || st.Connects < 2 {
		t.Fatalf("stats %+v", st)
	}
	// Batches 0..Seq-1 of the new publisher went by before the subscriber
	// reconnected: without replay they are one unrepaired gap.
	if seq := s.resets[0].Seq; seq > 0 && (len(s.gaps) != 1 || s.gaps[0] != (Gap{First: 0, Last: seq - 1})) {
		t.Fatalf("gaps %+v after reset at %d", s.gaps, seq)
	}
	check()
}

func TestQueueFullDrops(t *testing.T) {
	check := noLeaks(t)
	release := make(chan struct{})
	cfg := localConfig(false)
	cfg.MaxQueueSize = 1
	p, err := newPublisher(t.Context(), cfg, publisherHooks{skipSend: func(uint64) bool { <-release; return false }})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(storedBatch(1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the sender to take batch 1", func() bool { return len(p.queue) == 0 })
	if err := p.Publish(storedBatch(2)); err != nil { // waits in the queue
		t.Fatal(err)
	}
	if err := p.Publish(storedBatch(3)); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("third Publish: %v, want ErrQueueFull", err)
	}
	close(release)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Dropped != 1 || st.Published != 2 {
		t.Fatalf("stats %+v", st)
	}
	check()
}

func TestNullPublisher(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Publisher = PublisherNull
	p, err := NewPublisher(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(storedBatch(1)); err != nil {
		t.Fatal(err)
	}
	if p.Addr() != "" {
		t.Fatalf("null publisher has address %q", p.Addr())
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(storedBatch(1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

func TestConstructorsReject(t *testing.T) {
	ctx := context.Background()
	bad := DefaultConfig()
	bad.MaxQueueSize = 0
	if _, err := NewPublisher(ctx, bad); err == nil {
		t.Error("NewPublisher accepted max_queue_size 0")
	}
	h := func(uint64, Batch) {}
	for _, c := range []SubscriberConfig{
		{Endpoint: "127.0.0.1:5557"},
		{Endpoint: "tcp://127.0.0.1:5557", ReplayEndpoint: "5558"},
		{Endpoint: "tcp://127.0.0.1:5557", ReplayTimeout: -1},
	} {
		if _, err := NewSubscriber(ctx, c, h); err == nil {
			t.Errorf("NewSubscriber accepted %+v", c)
		}
	}
	if _, err := NewSubscriber(ctx, SubscriberConfig{Endpoint: "tcp://127.0.0.1:5557"}, nil); err == nil {
		t.Error("NewSubscriber accepted a nil handler")
	}
	// A taken port is a bind error, not a hang.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := localConfig(false)
	taken.Endpoint = "tcp://" + l.Addr().String()
	if _, err := NewPublisher(ctx, taken); err == nil || !strings.Contains(err.Error(), "bind endpoint") {
		t.Errorf("bind on a taken port: %v", err)
	}
}

// TestSubscriberCloseWhileConnecting closes a subscriber whose publisher
// never came up.
func TestSubscriberCloseWhileConnecting(t *testing.T) {
	check := noLeaks(t)
	s := &sink{}
	sub, err := NewSubscriber(t.Context(), s.config(fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t)), ""), s.handle)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if st := sub.Stats(); st.Connects != 0 || st.Received != 0 {
		t.Fatalf("stats %+v", st)
	}
	check()
}
