package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/inferrail/inferrail/engine"
)

// Tests against peers assembled by hand in the shapes other programs send,
// byte for byte, rather than against this package's own Publisher.

// be8 is seq as an 8-byte big-endian frame.
func be8(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// replayShape is how a replay ROUTER frames its replies after [identity]:
// each buffered batch, then the end marker.
type replayShape struct {
	name  string
	batch func(topic string, seq uint64, payload []byte) [][]byte
	end   [][]byte
}

var (
	// vLLM >= 0.26 (PR #45177, vllm/distributed/kv_events.py
	// _service_replay) and llm-d-inference-sim (pkg/kv-cache/
	// kv_events_replayer.go): the topic frame comes before the seq, and the
	// end marker has an empty topic.
	shapeTopic = replayShape{
		name: "vLLM>=0.26 topic frame",
		batch: func(topic string, seq uint64, payload []byte) [][]byte {
			return [][]byte{{}, []byte(topic), be8(seq), payload}
		},
		end: [][]byte{{}, {}, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, {}},
	}
	// vLLM before 0.26: no topic frame.
	shapeLegacy = replayShape{
		name: "vLLM<0.26 no topic frame",
		batch: func(_ string, seq uint64, payload []byte) [][]byte {
			return [][]byte{{}, be8(seq), payload}
		},
		end: [][]byte{{}, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, {}},
	}
)

// handEngine is a bare zmq4 PUB plus a ROUTER that answers replay requests
// in a given shape from a buffer of every batch "published", including those
// never sent live.
type handEngine struct {
	topic  string
	shape  replayShape
	pub    zmq4.Socket
	router zmq4.Socket
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	buffer   map[uint64][]byte
	requests [][][]byte
}

func newHandEngine(t *testing.T, topic string, shape replayShape) *handEngine {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	e := &handEngine{topic: topic, shape: shape, cancel: cancel, buffer: map[uint64][]byte{},
		pub: zmq4.NewPub(ctx, quiet()), router: zmq4.NewRouter(ctx, quiet())}
	if err := e.pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if err := e.router.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	e.wg.Go(func() { e.serve(ctx) })
	return e
}

func (e *handEngine) endpoint() string { return "tcp://" + e.pub.Addr().String() }
func (e *handEngine) replay() string   { return "tcp://" + e.router.Addr().String() }

// serve answers [identity, "", start] as vLLM does: every buffered batch with
// seq >= start in order, then the end marker.
func (e *handEngine) serve(ctx context.Context) {
	for {
		m, err := e.router.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		e.mu.Lock()
		e.requests = append(e.requests, m.Frames)
		var replies [][][]byte
		if len(m.Frames) == 3 && len(m.Frames[2]) == 8 {
			for seq := binary.BigEndian.Uint64(m.Frames[2]); e.buffer[seq] != nil; seq++ {
				replies = append(replies, e.shape.batch(e.topic, seq, e.buffer[seq]))
			}
			replies = append(replies, e.shape.end)
		}
		e.mu.Unlock()
		id := m.Frames[0]
		for _, r := range replies {
			if err := e.router.Send(zmq4.NewMsgFrom(append([][]byte{id}, r...)...)); err != nil {
				break
			}
		}
	}
}

// publish buffers batch seq for replay and, if live, sends it on the PUB.
func (e *handEngine) publish(t *testing.T, seq uint64, live bool) {
	t.Helper()
	p, err := EncodeBatch(storedBatch(int(seq)), FormatMap)
	if err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	e.buffer[seq] = p
	e.mu.Unlock()
	if live {
		if err := e.pub.SendMulti(zmq4.NewMsgFrom([]byte(e.topic), be8(seq), p)); err != nil {
			t.Fatal(err)
		}
	}
}

func (e *handEngine) close() {
	e.cancel()
	closeAndDrain(e.router)
	_ = e.pub.Close()
	e.wg.Wait()
}

// TestReplayShapesInterop loses one batch on the wire and has the
// subscriber repair it from a hand-assembled ROUTER answering in each of
// vLLM's replay shapes. The repair must take a round trip, not a
// ReplayTimeout stall.
func TestReplayShapesInterop(t *testing.T) {
	for _, shape := range []replayShape{shapeTopic, shapeLegacy} {
		t.Run(shape.name, func(t *testing.T) {
			check := noLeaks(t)
			const topic = "kv@10.0.0.7:8000@model"
			e := newHandEngine(t, topic, shape)
			s := &sink{}
			cfg := s.config(e.endpoint(), e.replay())
			cfg.Topic = "kv@"
			cfg.ReplayTimeout = 5 * time.Second // the default, spelled out
			sub, err := NewSubscriber(t.Context(), cfg, s.handle)
			if err != nil {
				t.Fatal(err)
			}
			var seq uint64
			end := time.Now().Add(deadline)
			for s.count(anyBatch) == 0 {
				if time.Now().After(end) {
					t.Fatal("subscriber never received a batch")
				}
				e.publish(t, seq, true)
				seq++
				time.Sleep(10 * time.Millisecond)
			}
			lost := seq
			e.publish(t, lost, false)
			start := time.Now()
			e.publish(t, lost+1, true)
			waitFor(t, "the batch after the gap", func() bool {
				return s.count(func(q uint64, _ Batch) bool { return q == lost+1 }) == 1
			})
			took := time.Since(start)
			t.Logf("gap repaired in %v", took)
			if err := sub.Close(); err != nil {
				t.Fatal(err)
			}
			e.close()
			check()

			if took > time.Second {
				t.Errorf("gap repair took %v (ReplayTimeout %v): the replay reply was not understood", took, cfg.ReplayTimeout)
			}
			contiguous(t, s.seqs)
			if n := s.count(func(q uint64, _ Batch) bool { return q == lost }); n != 1 {
				t.Fatalf("lost batch %d delivered %d times, want once", lost, n)
			}
			for i, q := range s.seqs {
				if !reflect.DeepEqual(s.batches[i], storedBatch(int(q))) {
					t.Fatalf("seq %d: got %+v want %+v", q, s.batches[i], storedBatch(int(q)))
				}
			}
			st := sub.Stats()
			if len(s.gaps) != 1 || s.gaps[0] != (Gap{First: lost, Last: lost, Repaired: true}) ||
				st.Replayed != 1 || st.Missed != 0 || st.BadFrames != 0 {
				t.Fatalf("gaps %+v stats %+v", s.gaps, st)
			}
			// The request is vLLM's: [identity, "", start_seq].
			if len(e.requests) != 1 || len(e.requests[0]) != 3 || len(e.requests[0][1]) != 0 || !bytes.Equal(e.requests[0][2], be8(lost)) {
				t.Fatalf("replay requests %x", e.requests)
			}
		})
	}
}

// TestDecodeParentZero decodes BlockStored events whose parent_block_hash is
// 0, as llm-d-inference-sim sends for a prefix with no cached parent, and the
// other zero spellings: they mean no parent, as vLLM's None does.
func TestDecodeParentZero(t *testing.T) {
	// llm-d-inference-sim's default (legacy array) event, as
	// vmihailenco/msgpack writes its msgpackBlockStoredEvent
	// (pkg/kv-cache/kv_cache_sender.go): a 9-element array of tag,
	// block_hashes (uint64 in `any`: always cf + 8 bytes), parent_block_hash
	// (the uint64 0: cf + 8 zero bytes), token_ids ([]uint32: ce + 4 bytes
	// each), block_size, lora_id, medium, lora_name, extra_keys (as_array
	// ignores omitempty, so the nil pointers and slice are sent as nil); the
	// batch is [ts, events, data_parallel_rank].
	sim := h(t,
		"93 cb 3ff8000000000000 91",
		"99", "'BlockStored",
		"92 cf 0000000000000011 cf 8000000000000022",
		"cf 0000000000000000",
		"94 ce00000001 ce00000002 ce00000003 ce00000004",
		"02 c0", "'GPU", "c0 c0",
		"00")
	want := Batch{TS: 1.5, DataParallelRank: ptr(0), Events: []Event{{
		Kind: engine.BlockStored, BlockHashes: []BlockHash{IntHash(0x11), IntHash(0x8000000000000022)},
		TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: "GPU",
	}}}
	stored := func(parent any) []byte {
		return mp(t, arr{1.5, arr{omap{{"type", "BlockStored"}, {"block_hashes", arr{uint64(0x11), uint64(0x8000000000000022)}},
			{"parent_block_hash", parent}, {"token_ids", arr{1, 2, 3, 4}}, {"block_size", 2}, {"lora_id", nil}, {"medium", "GPU"}, {"lora_name", nil}}}, 0})
	}
	cases := []struct {
		name    string
		payload []byte
	}{
		{"llm-d-inference-sim array event, parent uint64 0", sim},
		{"map event, parent fixint 0", stored(0)},
		{"map event, parent int64 0", stored(int64(0))},
		{"map event, parent empty bytes", stored([]byte{})},
		{"map event, parent 32 zero bytes", stored(make([]byte, 32))},
		{"map event, parent None (vLLM)", stored(nil)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := DecodeBatch(c.payload)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("got  %+v\nwant %+v", got, want)
			}
		})
	}
	// A real parent still decodes, including a digest whose last 8 bytes
	// are zero.
	digest := append(bytes.Repeat([]byte{0x5a}, 24), make([]byte, 8)...)
	for _, p := range []struct {
		wire any
		want BlockHash
	}{{1, IntHash(1)}, {uint64(1 << 63), IntHash(1 << 63)}, {digest, BytesHash(digest)}} {
		got, err := DecodeBatch(stored(p.wire))
		if err != nil {
			t.Fatal(err)
		}
		if ph := got.Events[0].ParentBlockHash; ph == nil || *ph != p.want {
			t.Fatalf("parent %v decoded as %+v, want %+v", p.wire, ph, p.want)
		}
	}
}

// TestEncodeParentZero: a zero parent is sent as None, since a consumer
// reads 0 as no parent.
func TestEncodeParentZero(t *testing.T) {
	for _, parent := range []BlockHash{IntHash(0), BytesHash(make([]byte, 32))} {
		ev := Event{Kind: engine.BlockStored, BlockHashes: []BlockHash{IntHash(5)}, ParentBlockHash: &parent, BlockSize: 1}
		none := ev
		none.ParentBlockHash = nil
		for _, f := range []Format{FormatMap, FormatArray} {
			got, err := EncodeBatch(Batch{Events: []Event{ev}}, f)
			if err != nil {
				t.Fatal(err)
			}
			want, err := EncodeBatch(Batch{Events: []Event{none}}, f)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%v, parent %x: encoded %x, want %x (parent None)", f, parent.Raw, got, want)
			}
		}
	}
}
