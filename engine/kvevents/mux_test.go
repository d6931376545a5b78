package kvevents

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Two pods' topics, as llm-d's vLLM pods publish them.
const (
	topicA = "kv@10.0.0.1:8000@m"
	topicB = "kv@10.0.0.2:8000@m"
)

// routeTable is a Mux's resolve func over a table of routes by topic; it
// records every topic it was asked about and every unrouted message.
type routeTable struct {
	mu       sync.Mutex
	routes   map[string]Route
	asked    []string
	unrouted []string
}

func newRouteTable() *routeTable { return &routeTable{routes: map[string]Route{}} }

func (rt *routeTable) resolve(topic string) (Route, bool) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.asked = append(rt.asked, topic)
	r, ok := rt.routes[topic]
	return r, ok
}

func (rt *routeTable) set(topic string, r Route) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.routes[topic] = r
}

func (rt *routeTable) noteUnrouted(topic string) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.unrouted = append(rt.unrouted, topic)
}

// asks is how many times topic was resolved.
func (rt *routeTable) asks(topic string) int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	n := 0
	for _, a := range rt.asked {
		if a == topic {
			n++
		}
	}
	return n
}

// route is a Route delivering to s.
func (s *sink) route(replay string) Route {
	return Route{
		ReplayEndpoint: replay, Handler: s.handle,
		OnGap:   func(g Gap) { s.mu.Lock(); s.gaps = append(s.gaps, g); s.mu.Unlock() },
		OnReset: func(r Reset) { s.mu.Lock(); s.resets = append(s.resets, r); s.mu.Unlock() },
	}
}

// snapshot copies what s received, for checks while it may still receive.
func (s *sink) snapshot() (seqs []uint64, ts []float64, gaps []Gap, resets []Reset) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, b := range s.batches {
		seqs = append(seqs, s.seqs[i])
		if b.TS > 0 {
			ts = append(ts, b.TS)
		}
	}
	return seqs, ts, append([]Gap(nil), s.gaps...), append([]Reset(nil), s.resets...)
}

// hasTS matches the batch storedBatch(i).
func hasTS(i int) func(uint64, Batch) bool {
	return func(_ uint64, b Batch) bool { return b.TS == float64(i) }
}

// newTestMux binds a Mux on a port of 127.0.0.1, filter "kv@", resolving
// through rt.
func newTestMux(t *testing.T, rt *routeTable, mod func(*MuxConfig)) *Mux {
	t.Helper()
	cfg := MuxConfig{Endpoint: "tcp://127.0.0.1:0", TopicPrefix: "kv@", Unrouted: rt.noteUnrouted}
	if mod != nil {
		mod(&cfg)
	}
	m, err := NewMux(t.Context(), cfg, rt.resolve)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	if !strings.HasPrefix(m.Addr(), "tcp://127.0.0.1:") || strings.HasSuffix(m.Addr(), ":0") {
		t.Fatalf("Addr %q, want the bound port", m.Addr())
	}
	return m
}

// topicPublisher is a pod's publisher: it connects to addr and publishes on
// topic, with a replay ROUTER on a port of 127.0.0.1 if replay.
func topicPublisher(t *testing.T, addr, topic string, replay bool, hooks publisherHooks) *Publisher {
	t.Helper()
	cfg := connectConfig(addr)
	cfg.Topic = topic
	if replay {
		cfg.ReplayEndpoint = "tcp://127.0.0.1:0"
	}
	p, err := newPublisher(t.Context(), cfg, hooks)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// publish publishes storedBatch(i) for i in [from, to].
func publish(t *testing.T, p *Publisher, from, to int) {
	t.Helper()
	for i := from; i <= to; i++ {
		if err := p.Publish(storedBatch(i)); err != nil {
			t.Fatal(err)
		}
	}
}

// waitChan waits for c to be closed or to deliver.
func waitChan(t *testing.T, what string, c <-chan struct{}) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(deadline):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// blockOn is a handler for s that, on storedBatch(ts), signals blocked and
// waits for release before delivering it.
func blockOn(s *sink, ts int) (h func(uint64, Batch), blocked <-chan struct{}, release func()) {
	b, r := make(chan struct{}), make(chan struct{})
	var once sync.Once
	return func(seq uint64, batch Batch) {
		if batch.TS == float64(ts) {
			close(b)
			<-r
		}
		s.handle(seq, batch)
	}, b, func() { once.Do(func() { close(r) }) }
}

func closeAll(t *testing.T, m *Mux, ps ...*Publisher) {
	t.Helper()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func seqRange(from, to int) string {
	var out []string
	for i := from; i <= to; i++ {
		out = append(out, fmt.Sprint(i))
	}
	return "[" + strings.Join(out, " ") + "]"
}

// TestMuxTwoPublishers: two pods' publishers connect to one bound Mux, each
// on its own topic with its own sequence (B's starts at 1<<20); each
// topic's batches reach its own route, in order, with no gap or reset.
func TestMuxTwoPublishers(t *testing.T) {
	check := noLeaks(t)
	rt := newRouteTable()
	sa, sb := &sink{}, &sink{}
	rt.set(topicA, sa.route(""))
	rt.set(topicB, sb.route(""))
	m := newTestMux(t, rt, nil)
	const first = 1 << 20
	pa := topicPublisher(t, m.Addr(), topicA, false, publisherHooks{})
	pb := topicPublisher(t, m.Addr(), topicB, false, publisherHooks{firstSeq: first})
	probe(t, pa, sa, anyBatch)
	probe(t, pb, sb, anyBatch)
	const n = 200
	for i := 1; i <= n; i++ {
		publish(t, pa, i, i)
		publish(t, pb, n+i, n+i)
	}
	real := func(_ uint64, b Batch) bool { return b.TS > 0 }
	waitFor(t, "A's batches", func() bool { return sa.count(real) == n })
	waitFor(t, "B's batches", func() bool { return sb.count(real) == n })
	st := m.Stats()
	closeAll(t, m, pa, pb)
	check()

	for _, c := range []struct {
		name   string
		s      *sink
		lo, hi uint64
		ts     string
	}{{"A", sa, 0, first - 1, seqRange(1, n)}, {"B", sb, first, 1<<64 - 1, seqRange(n+1, 2*n)}} {
		seqs, ts, gaps, resets := c.s.snapshot()
		contiguous(t, seqs)
		if seqs[0] < c.lo || seqs[len(seqs)-1] > c.hi {
			t.Errorf("%s: seqs %d..%d, want within [%d, %d]: another publisher's batches", c.name, seqs[0], seqs[len(seqs)-1], c.lo, c.hi)
		}
		if fmt.Sprint(ts) != c.ts {
			t.Errorf("%s: delivered %v, want %s", c.name, ts, c.ts)
		}
		if len(gaps) != 0 || len(resets) != 0 {
			t.Errorf("%s: gaps %+v resets %+v", c.name, gaps, resets)
		}
	}
	total := uint64(sa.count(anyBatch) + sb.count(anyBatch))
	if st.Topics != 2 || st.Received != total || st.Gaps != 0 || st.Resets != 0 || st.Connects != 1 ||
		st.Unrouted != 0 || st.BadFrames != 0 || st.DecodeErrors != 0 {
		t.Fatalf("stats %+v (delivered %d)", st, total)
	}
	if rt.asks(topicA) != 1 || rt.asks(topicB) != 1 {
		t.Fatalf("resolved %v, want each topic once", rt.asked)
	}
	if st := m.Stats(); st.Topics != 0 {
		t.Fatalf("after Close: %d topics", st.Topics)
	}
}

// TestMuxResolveLater: a topic resolve refuses (or answers with a route
// that cannot take) is unrouted, counted and resolved again on each
// message; once resolve accepts, the topic is routed from then on and not
// resolved again, and the unrouted batches before are no gap.
func TestMuxResolveLater(t *testing.T) {
	check := noLeaks(t)
	rt := newRouteTable()
	m := newTestMux(t, rt, nil)
	pa := topicPublisher(t, m.Addr(), topicA, false, publisherHooks{})
	unroutedPast := func(n uint64) {
		t.Helper()
		end := time.Now().Add(deadline)
		for m.Stats().Unrouted < n {
			if time.Now().After(end) {
				t.Fatalf("timed out waiting for %d unrouted messages (stats %+v)", n, m.Stats())
			}
			publish(t, pa, 1000, 1000)
			time.Sleep(5 * time.Millisecond)
		}
	}
	unroutedPast(3) // resolve refuses
	sa := &sink{}
	bad := sa.route("")
	bad.ReplayEndpoint = "5558" // not an endpoint: the route does not take
	rt.set(topicA, bad)
	asked := rt.asks(topicA)
	unroutedPast(m.Stats().Unrouted + 10)
	if rt.asks(topicA) <= asked || sa.count(anyBatch) != 0 || m.Stats().Topics != 0 {
		t.Fatalf("a route with a bad replay endpoint: asked %d then %d, delivered %d, stats %+v", asked, rt.asks(topicA), sa.count(anyBatch), m.Stats())
	}
	rt.set(topicA, sa.route(""))
	probe(t, pa, sa, anyBatch)
	unrouted, asked := m.Stats().Unrouted, rt.asks(topicA)
	const n = 50
	publish(t, pa, 1, n)
	waitFor(t, "A's batches", func() bool { return sa.count(hasTS(n)) == 1 })
	st := m.Stats()
	closeAll(t, m, pa)
	check()

	if st.Unrouted != unrouted || rt.asks(topicA) != asked {
		t.Fatalf("after the route took: unrouted %d -> %d, asked %d -> %d", unrouted, st.Unrouted, asked, rt.asks(topicA))
	}
	if asked != int(unrouted)+1 {
		t.Fatalf("resolved %d times for %d unrouted messages and one routed", asked, unrouted)
	}
	rt.mu.Lock()
	calls := append([]string(nil), rt.unrouted...)
	rt.mu.Unlock()
	if uint64(len(calls)) != unrouted || strings.Trim(strings.Repeat(topicA+" ", len(calls)), " ") != strings.Join(calls, " ") {
		t.Fatalf("Unrouted called with %q, want %d times %q", calls, unrouted, topicA)
	}
	seqs, ts, gaps, resets := sa.snapshot()
	contiguous(t, seqs)
	if seqs[0] < unrouted {
		t.Fatalf("first routed seq %d, but %d earlier messages were unrouted", seqs[0], unrouted)
	}
	if fmt.Sprint(ts[len(ts)-n:]) != seqRange(1, n) || len(gaps) != 0 || len(resets) != 0 {
		t.Fatalf("delivered %v gaps %+v resets %+v", ts, gaps, resets)
	}
	if st.Topics != 1 || st.Gaps != 0 || st.Received != uint64(len(seqs)) {
		t.Fatalf("stats %+v", st)
	}
}

// TestMuxGapRepairWhileOtherFlows: A loses a batch on the wire; the Mux
// replays it from A's replay endpoint (not B's), and A's handler blocks on
// the replayed batch, in the middle of the repair. Meanwhile every batch of
// B's is delivered. Released, A gets every batch once, in order.
func TestMuxGapRepairWhileOtherFlows(t *testing.T) {
	check := noLeaks(t)
	rt := newRouteTable()
	m := newTestMux(t, rt, nil)
	var dropNext atomic.Bool
	pa := topicPublisher(t, m.Addr(), topicA, true, publisherHooks{
		skipSend: func(uint64) bool { return dropNext.CompareAndSwap(true, false) },
	})
	// B's sequence starts far from A's, so replaying A's gap from B's
	// buffer would deliver nothing.
	pb := topicPublisher(t, m.Addr(), topicB, true, publisherHooks{firstSeq: 1 << 20})
	sa, sb := &sink{}, &sink{}
	ra := sa.route(pa.ReplayAddr())
	var blocked <-chan struct{}
	var release func()
	ra.Handler, blocked, release = blockOn(sa, 1)
	defer release()
	rt.set(topicA, ra)
	rt.set(topicB, sb.route(pb.ReplayAddr()))
	probe(t, pb, sb, anyBatch)
	probe(t, pa, sa, anyBatch)

	dropNext.Store(true)
	publish(t, pa, 1, 2) // 1 is lost on the wire; 2 reveals the gap
	waitChan(t, "A's handler to get the replayed batch", blocked)
	publish(t, pa, 3, 5) // queued behind the blocked handler
	const n = 100
	publish(t, pb, 101, 100+n)
	waitFor(t, "B's batches while A is blocked", func() bool { return sb.count(hasTS(100+n)) == 1 })
	if got := sa.count(func(_ uint64, b Batch) bool { return b.TS > 0 }); got != 0 {
		t.Fatalf("A delivered %d batches while its handler was blocked", got)
	}
	release()
	waitFor(t, "A's batches", func() bool { return sa.count(hasTS(5)) == 1 })
	st := m.Stats()
	closeAll(t, m, pa, pb)
	check()

	seqs, ts, gaps, _ := sa.snapshot()
	contiguous(t, seqs)
	if fmt.Sprint(ts) != seqRange(1, 5) {
		t.Fatalf("A delivered %v, want [1 2 3 4 5]", ts)
	}
	if len(gaps) != 1 || !gaps[0].Repaired || gaps[0].First != gaps[0].Last {
		t.Fatalf("A's gaps %+v, want one repaired gap of one", gaps)
	}
	bseqs, bts, bgaps, _ := sb.snapshot()
	contiguous(t, bseqs)
	if fmt.Sprint(bts) != seqRange(101, 100+n) || len(bgaps) != 0 {
		t.Fatalf("B delivered %v gaps %+v", bts, bgaps)
	}
	if pa.Stats().ReplayRequests != 1 || pb.Stats().ReplayRequests != 0 {
		t.Fatalf("replay requests: A %d, B %d; want A 1, B 0", pa.Stats().ReplayRequests, pb.Stats().ReplayRequests)
	}
	if st.Gaps != 1 || st.Replayed != 1 || st.Missed != 0 || st.Topics != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// TestMuxQueueFullIsGap: with A's handler blocked, A's queue holds QueueLen
// batches and the Mux drops the rest; they show up as a gap, repaired from
// A's replay endpoint.
func TestMuxQueueFullIsGap(t *testing.T) {
	check := noLeaks(t)
	rt := newRouteTable()
	m := newTestMux(t, rt, func(c *MuxConfig) { c.QueueLen = 2 })
	pa := topicPublisher(t, m.Addr(), topicA, true, publisherHooks{})
	sa := &sink{}
	ra := sa.route(pa.ReplayAddr())
	var blocked <-chan struct{}
	var release func()
	ra.Handler, blocked, release = blockOn(sa, 1)
	defer release()
	rt.set(topicA, ra)
	probe(t, pa, sa, anyBatch)
	publish(t, pa, 1, 1)
	waitChan(t, "A's handler to block", blocked)
	publish(t, pa, 2, 10) // 2 and 3 are queued, 4..10 dropped
	waitFor(t, "7 batches dropped", func() bool { return m.dropped.Load() == 7 })
	release()
	waitFor(t, "the queued batches", func() bool { return sa.count(hasTS(3)) == 1 })
	publish(t, pa, 11, 11)
	waitFor(t, "batch 11", func() bool { return sa.count(hasTS(11)) == 1 })
	st := m.Stats()
	closeAll(t, m, pa)
	check()

	seqs, ts, gaps, _ := sa.snapshot()
	contiguous(t, seqs)
	if fmt.Sprint(ts) != seqRange(1, 11) {
		t.Fatalf("delivered %v, want 1..11", ts)
	}
	if len(gaps) != 1 || !gaps[0].Repaired || gaps[0].Last-gaps[0].First != 6 {
		t.Fatalf("gaps %+v, want one repaired gap of 7", gaps)
	}
	if st.Replayed != 7 || st.Gaps != 1 || st.Missed != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestMuxPublisherRestart: A's publisher goes away and a new one on the
// same topic connects, its sequence starting again: a reset on A only,
// with no new resolve, while B's batches keep their sequence.
func TestMuxPublisherRestart(t *testing.T) {
	check := noLeaks(t)
	rt := newRouteTable()
	sa, sb := &sink{}, &sink{}
	rt.set(topicA, sa.route(""))
	rt.set(topicB, sb.route(""))
	m := newTestMux(t, rt, nil)
	const first = 1 << 20
	pa1 := topicPublisher(t, m.Addr(), topicA, false, publisherHooks{firstSeq: first})
	pb := topicPublisher(t, m.Addr(), topicB, false, publisherHooks{firstSeq: first})
	probe(t, pa1, sa, anyBatch)
	probe(t, pb, sb, anyBatch)
	if err := pa1.Close(); err != nil {
		t.Fatal(err)
	}
	pa2 := topicPublisher(t, m.Addr(), topicA, false, publisherHooks{})
	probe(t, pa2, sa, func(seq uint64, _ Batch) bool { return seq < first })
	const n = 50
	publish(t, pa2, 1, n)
	publish(t, pb, 1, n)
	waitFor(t, "A's new batches", func() bool { return sa.count(hasTS(n)) == 1 })
	waitFor(t, "B's batches", func() bool { return sb.count(hasTS(n)) == 1 })
	st := m.Stats()
	closeAll(t, m, pa2, pb)
	check()

	_, _, gaps, resets := sa.snapshot()
	if len(resets) != 1 || resets[0].Prev < first || resets[0].Seq >= first {
		t.Fatalf("A's resets %+v", resets)
	}
	// The new publisher's first batches went by before its subscription
	// arrived: without replay they are one unrepaired gap.
	if seq := resets[0].Seq; seq > 0 && (len(gaps) != 1 || gaps[0] != (Gap{First: 0, Last: seq - 1})) {
		t.Fatalf("A's gaps %+v after reset at %d", gaps, seq)
	}
	bseqs, _, bgaps, bresets := sb.snapshot()
	contiguous(t, bseqs)
	if len(bresets) != 0 || len(bgaps) != 0 || bseqs[0] < first {
		t.Fatalf("B: seqs from %d, gaps %+v resets %+v", bseqs[0], bgaps, bresets)
	}
	if st.Resets != 1 || st.Topics != 2 || rt.asks(topicA) != 1 {
		t.Fatalf("stats %+v, A resolved %d times", st, rt.asks(topicA))
	}
}

// TestMuxForget: after Forget the topic's next message is resolved again,
// to the route resolve gives then, with a fresh sequence: a batch lost on
// the wire just after Forget is no gap.
func TestMuxForget(t *testing.T) {
	check := noLeaks(t)
	rt := newRouteTable()
	m := newTestMux(t, rt, nil)
	var dropNext atomic.Bool
	pa := topicPublisher(t, m.Addr(), topicA, false, publisherHooks{
		skipSend: func(uint64) bool { return dropNext.CompareAndSwap(true, false) },
	})
	s1, s2 := &sink{}, &sink{}
	rt.set(topicA, s1.route(""))
	probe(t, pa, s1, anyBatch)
	publish(t, pa, 1, 5)
	waitFor(t, "batch 5", func() bool { return s1.count(hasTS(5)) == 1 })
	if m.Stats().Topics != 1 {
		t.Fatalf("stats %+v before Forget", m.Stats())
	}
	m.Forget(topicA)
	m.Forget(topicA) // a second Forget is a no-op
	if st := m.Stats(); st.Topics != 0 {
		t.Fatalf("stats %+v after Forget", st)
	}
	waitFor(t, "the forgotten topic's goroutine to end", func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.draining) == 0
	})
	before := s1.count(anyBatch)
	s1seqs, _, _, _ := s1.snapshot()
	rt.set(topicA, s2.route(""))
	dropNext.Store(true)
	probe(t, pa, s2, anyBatch)
	publish(t, pa, 6, 8)
	waitFor(t, "batch 8", func() bool { return s2.count(hasTS(8)) == 1 })
	st := m.Stats()
	closeAll(t, m, pa)
	check()

	if got := s1.count(anyBatch); got != before {
		t.Fatalf("the forgotten route got %d more batches", got-before)
	}
	if rt.asks(topicA) != 2 {
		t.Fatalf("A resolved %d times, want 2", rt.asks(topicA))
	}
	seqs, _, gaps, resets := s2.snapshot()
	contiguous(t, seqs)
	if last := s1seqs[len(s1seqs)-1]; seqs[0] != last+2 {
		t.Fatalf("new route's first seq %d, want %d (one lost after %d)", seqs[0], last+2, last)
	}
	if len(gaps) != 0 || len(resets) != 0 || st.Gaps != 0 || st.Topics != 1 {
		t.Fatalf("new route: gaps %+v resets %+v, stats %+v", gaps, resets, st)
	}
}

// TestMuxForgetDrainsFirst: a forgotten topic's queued batches still reach
// its old route, and the new route's callbacks start only after them.
func TestMuxForgetDrainsFirst(t *testing.T) {
	check := noLeaks(t)
	rt := newRouteTable()
	m := newTestMux(t, rt, nil)
	pa := topicPublisher(t, m.Addr(), topicA, false, publisherHooks{})
	var mu sync.Mutex
	var order []string // the real batches both routes got, in order
	log := func(route string, b Batch) {
		if b.TS > 0 {
			mu.Lock()
			order = append(order, fmt.Sprint(route, " ", b.TS))
			mu.Unlock()
		}
	}
	s1, s2 := &sink{}, &sink{}
	r1 := s1.route("")
	h1, blocked, release := blockOn(s1, 1)
	defer release()
	r1.Handler = func(seq uint64, b Batch) {
		h1(seq, b)
		log("old", b)
	}
	r2 := s2.route("")
	r2.Handler = func(seq uint64, b Batch) {
		s2.handle(seq, b)
		log("new", b)
	}
	rt.set(topicA, r1)
	probe(t, pa, s1, anyBatch)
	publish(t, pa, 1, 3)
	waitChan(t, "the old route's handler to block", blocked)
	waitFor(t, "2 and 3 queued", func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.topics[topicA].queue) == 2
	})
	m.Forget(topicA)
	rt.set(topicA, r2)
	publish(t, pa, 4, 4)
	waitFor(t, "the new route", func() bool { return m.Stats().Topics == 1 })
	// The new route's goroutine holds 4 until the old one has drained.
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if s2.count(anyBatch) != 0 {
			t.Fatal("the new route got a batch while the old one was still delivering")
		}
	}
	release()
	waitFor(t, "batch 4", func() bool { return s2.count(hasTS(4)) == 1 })
	closeAll(t, m, pa)
	check()

	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join(order, ", "); got != "old 1, old 2, old 3, new 4" {
		t.Fatalf("delivered %s, want old 1, old 2, old 3, new 4", got)
	}
	if _, _, gaps, _ := s2.snapshot(); len(gaps) != 0 {
		t.Fatalf("new route's gaps %+v", gaps)
	}
}

// TestMuxTopicPrefix: a message whose topic does not start with
// TopicPrefix is neither resolved nor delivered, though resolve would take
// it; it is sent on the same connection just before a kv@ message that
// arrives.
func TestMuxTopicPrefix(t *testing.T) {
	check := noLeaks(t)
	const other = "other@10.0.0.3:8000@m"
	rt := newRouteTable()
	sa, so := &sink{}, &sink{}
	rt.set(topicA, sa.route(""))
	rt.set(other, so.route(""))
	m := newTestMux(t, rt, nil)
	pub, payload := rawPub(t, m)
	end := time.Now().Add(deadline)
	for seq := uint64(0); sa.count(anyBatch) == 0; seq++ {
		if time.Now().After(end) {
			t.Fatal("no kv@ message arrived")
		}
		for _, topic := range []string{other, topicA} {
			if err := pub.SendMulti(zmq4.NewMsgFrom([]byte(topic), be8(seq), payload)); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	st := m.Stats()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	_ = pub.Close()
	check()
	if rt.asks(other) != 0 || so.count(anyBatch) != 0 {
		t.Fatalf("topic %q resolved %d times, delivered %d", other, rt.asks(other), so.count(anyBatch))
	}
	if st.Topics != 1 || st.Unrouted != 0 || st.BadFrames != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// rawPub is a bare publisher connected to m (its frames are the test's
// to shape), and an encoded one-block batch to send.
func rawPub(t *testing.T, m *Mux) (zmq4.Socket, []byte) {
	t.Helper()
	pub := zmq4.NewPub(t.Context(), quiet())
	if err := pub.Dial(m.Addr()); err != nil {
		t.Fatal(err)
	}
	payload, err := EncodeBatch(storedBatch(1), FormatMap)
	if err != nil {
		t.Fatal(err)
	}
	return pub, payload
}

// TestMuxBadFrames: a message not shaped [topic, 8-byte seq, payload] is a
// bad frame; a payload that is no batch is a decode error on its topic,
// reported as an unrepaired gap of one; the good batches around them are
// delivered.
func TestMuxBadFrames(t *testing.T) {
	check := noLeaks(t)
	rt := newRouteTable()
	sa := &sink{}
	rt.set(topicA, sa.route(""))
	m := newTestMux(t, rt, nil)
	pub, payload := rawPub(t, m)
	end := time.Now().Add(deadline)
	seq := uint64(0)
	for st := m.Stats(); st.BadFrames < 2 || st.DecodeErrors == 0 || sa.count(anyBatch) == 0; st = m.Stats() {
		if time.Now().After(end) {
			t.Fatalf("stats %+v", st)
		}
		for _, msg := range []zmq4.Msg{
			zmq4.NewMsgFrom([]byte(topicA), []byte{0, 0, 0, 1}, payload), // 4-byte seq
			zmq4.NewMsgFrom([]byte(topicA), be8(seq)),                    // no payload
			zmq4.NewMsgFrom([]byte(topicA), be8(seq), []byte{0xc1}),      // not msgpack
			zmq4.NewMsgFrom([]byte(topicA), be8(seq+1), payload),
		} {
			if err := pub.SendMulti(msg); err != nil {
				t.Fatal(err)
			}
		}
		seq += 2
		time.Sleep(10 * time.Millisecond)
	}
	st := m.Stats()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	_ = pub.Close()
	check()
	seqs, _, gaps, _ := sa.snapshot()
	for _, q := range seqs {
		if q%2 != 1 {
			t.Fatalf("delivered seq %d, which was not a batch", q)
		}
	}
	for _, g := range gaps {
		if g.Repaired || g.First != g.Last || g.First%2 != 0 {
			t.Fatalf("gaps %+v, want unrepaired gaps of one at the bad payloads", gaps)
		}
	}
	if st.Received != uint64(len(seqs)) || st.Gaps != uint64(len(gaps)) || st.Gaps != st.DecodeErrors {
		t.Fatalf("stats %+v, delivered %d, gaps %+v", st, len(seqs), gaps)
	}
}

// TestMuxCloseDuringReplay: Close ends a topic's goroutine that waits on a
// replay endpoint that never answers (long before ReplayTimeout), and
// every goroutine the Mux started; a second Close is a no-op.
func TestMuxCloseDuringReplay(t *testing.T) {
	check := noLeaks(t)
	ctx, cancel := context.WithCancel(t.Context())
	router := zmq4.NewRouter(ctx, quiet())
	if err := router.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	requests := make(chan struct{}, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			if _, err := router.Recv(); err != nil {
				if ctx.Err() != nil {
					return
				}
				continue
			}
			select {
			case requests <- struct{}{}:
			default:
			}
		}
	})
	var stopOnce sync.Once
	stop := func() { stopOnce.Do(func() { cancel(); closeAndDrain(router); wg.Wait() }) }
	defer stop()

	rt := newRouteTable()
	m := newTestMux(t, rt, func(c *MuxConfig) { c.ReplayTimeout = time.Minute })
	var dropNext atomic.Bool
	pa := topicPublisher(t, m.Addr(), topicA, false, publisherHooks{
		skipSend: func(uint64) bool { return dropNext.CompareAndSwap(true, false) },
	})
	pb := topicPublisher(t, m.Addr(), topicB, false, publisherHooks{})
	sa, sb := &sink{}, &sink{}
	rt.set(topicA, sa.route("tcp://"+router.Addr().String()))
	rt.set(topicB, sb.route(""))
	probe(t, pa, sa, anyBatch)
	probe(t, pb, sb, anyBatch)
	dropNext.Store(true)
	publish(t, pa, 1, 2)
	waitChan(t, "the replay request", requests)
	start := time.Now()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Close took %v", took)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if st := m.Stats(); st.Topics != 0 {
		t.Fatalf("stats %+v after Close", st)
	}
	// The replay failed when Close cancelled it: an unrepaired gap.
	if _, _, gaps, _ := sa.snapshot(); len(gaps) != 1 || gaps[0].Repaired {
		t.Fatalf("gaps %+v", gaps)
	}
	closeAll(t, m, pa, pb)
	stop()
	check()
}

// TestMuxRejects: NewMux refuses a nil resolve, a bad endpoint, negative
// settings and a port already taken.
func TestMuxRejects(t *testing.T) {
	check := noLeaks(t)
	resolve := func(string) (Route, bool) { return Route{}, false }
	for _, c := range []MuxConfig{
		{Endpoint: "127.0.0.1:5557"},
		{Endpoint: "tcp://127.0.0.1:0", QueueLen: -1},
		{Endpoint: "tcp://127.0.0.1:0", ReplayTimeout: -1},
	} {
		if m, err := NewMux(t.Context(), c, resolve); err == nil {
			_ = m.Close()
			t.Errorf("NewMux accepted %+v", c)
		}
	}
	if _, err := NewMux(t.Context(), MuxConfig{Endpoint: "tcp://127.0.0.1:0"}, nil); err == nil {
		t.Error("NewMux accepted a nil resolve")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := NewMux(t.Context(), MuxConfig{Endpoint: "tcp://" + l.Addr().String()}, resolve); err == nil || !strings.Contains(err.Error(), "bind mux endpoint") {
		t.Fatalf("bind on a taken port: %v", err)
	}
	m, err := NewMux(t.Context(), MuxConfig{Endpoint: "tcp://127.0.0.1:0"}, resolve)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if st := m.Stats(); st.Connects != 1 || st.Topics != 0 {
		t.Fatalf("stats %+v", st)
	}
	check()
}
