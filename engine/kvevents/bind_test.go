package kvevents

import (
	"fmt"
	"net"
	"reflect"
	"strings"
	"testing"
)

// bindConfig is a bound subscriber's config on a port of 127.0.0.1 the
// system chooses.
func bindConfig(s *sink, replay string) SubscriberConfig {
	c := s.config("tcp://127.0.0.1:0", replay)
	c.Bind = true
	return c
}

// connectConfig is a publisher config that connects to ep, as vLLM does
// for an endpoint without "*".
func connectConfig(ep string) Config {
	c := DefaultConfig()
	c.Endpoint = ep
	return c
}

// TestBindDelivery: our Publisher in connect mode dials a bound Subscriber
// and every batch arrives, in order.
func TestBindDelivery(t *testing.T) {
	check := noLeaks(t)
	s := &sink{}
	sub, err := NewSubscriber(t.Context(), bindConfig(s, ""), s.handle)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(sub.Addr(), "tcp://127.0.0.1:") || strings.HasSuffix(sub.Addr(), ":0") {
		t.Fatalf("Addr %q, want the bound port", sub.Addr())
	}
	cfg := connectConfig(sub.Addr())
	if Binds(cfg.Endpoint) || cfg.ForceBind {
		t.Fatalf("publisher on %q would bind", cfg.Endpoint)
	}
	p, err := NewPublisher(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if p.Addr() != "" {
		t.Fatalf("connecting publisher has address %q", p.Addr())
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
	check()
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
	if st := sub.Stats(); st.Gaps != 0 || st.Resets != 0 || st.Connects != 1 || st.Received != uint64(len(s.seqs)) {
		t.Fatalf("stats %+v", st)
	}
}

// TestBindPublisherRestart: the publisher goes away and a new one connects
// to the same bound socket; its sequence starts again, which is a reset.
func TestBindPublisherRestart(t *testing.T) {
	check := noLeaks(t)
	s := &sink{}
	sub, err := NewSubscriber(t.Context(), bindConfig(s, ""), s.handle)
	if err != nil {
		t.Fatal(err)
	}
	const first = 1 << 20
	p1, err := newPublisher(t.Context(), connectConfig(sub.Addr()), publisherHooks{firstSeq: first})
	if err != nil {
		t.Fatal(err)
	}
	probe(t, p1, s, anyBatch)
	if err := p1.Close(); err != nil {
		t.Fatal(err)
	}
	p2, err := NewPublisher(t.Context(), connectConfig(sub.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	probe(t, p2, s, func(seq uint64, _ Batch) bool { return seq < first })
	const n = 50
	for i := 1; i <= n; i++ {
		if err := p2.Publish(storedBatch(i)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the new publisher's batches", func() bool {
		return s.count(func(seq uint64, b Batch) bool { return seq < first && b.TS > 0 }) == n
	})
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p2.Close(); err != nil {
		t.Fatal(err)
	}
	check()
	if len(s.resets) != 1 || s.resets[0].Prev < first || s.resets[0].Seq >= first {
		t.Fatalf("resets %+v", s.resets)
	}
	if st := sub.Stats(); st.Resets != 1 || st.Connects != 1 {
		t.Fatalf("stats %+v", st)
	}
	// The new publisher's first batches went by before its subscription
	// arrived: without replay they are one unrepaired gap.
	if seq := s.resets[0].Seq; seq > 0 && (len(s.gaps) != 1 || s.gaps[0] != (Gap{First: 0, Last: seq - 1})) {
		t.Fatalf("gaps %+v after reset at %d", s.gaps, seq)
	}
	var after []uint64
	for i, seq := range s.seqs {
		if seq < first && s.batches[i].TS > 0 {
			after = append(after, seq)
		}
	}
	contiguous(t, after)
}

// TestBindGapRepaired: gap detection and replay (which still dials the
// replay endpoint) work on a bound subscriber.
func TestBindGapRepaired(t *testing.T) { testGapRepairedByReplay(t, false, true) }

// TestBindCloseWithoutPublisher closes a bound subscriber nobody connected to.
func TestBindCloseWithoutPublisher(t *testing.T) {
	check := noLeaks(t)
	s := &sink{}
	sub, err := NewSubscriber(t.Context(), bindConfig(s, ""), s.handle)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if st := sub.Stats(); st.Connects != 1 || st.Received != 0 {
		t.Fatalf("stats %+v", st)
	}
	check()
}

// TestBindErrors: a taken port is an error from NewSubscriber, and a
// dialling subscriber has no address.
func TestBindErrors(t *testing.T) {
	check := noLeaks(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	s := &sink{}
	c := bindConfig(s, "")
	c.Endpoint = "tcp://" + l.Addr().String()
	if _, err := NewSubscriber(t.Context(), c, s.handle); err == nil || !strings.Contains(err.Error(), "bind subscriber endpoint") {
		t.Fatalf("bind on a taken port: %v", err)
	}
	sub, err := NewSubscriber(t.Context(), s.config(fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t)), ""), s.handle)
	if err != nil {
		t.Fatal(err)
	}
	if sub.Addr() != "" {
		t.Errorf("dialling subscriber has address %q", sub.Addr())
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	check()
}
