package server

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/engine/kvevents"
)

// The engine's KV events reach a ZMQ subscriber as vLLM publishes them:
// BlockStored with the blocks' token ids and the parent hash, in order.
func TestKVEventsOverZMQ(t *testing.T) {
	kc := kvevents.DefaultConfig()
	kc.EnableKVCacheEvents = true
	kc.Endpoint = "tcp://127.0.0.1:0"
	kc.ForceBind = true
	kc.Topic = "kv"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub, err := kvevents.NewPublisher(ctx, kc)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	var mu sync.Mutex
	var stored []kvevents.Event
	sub, err := kvevents.NewSubscriber(ctx, kvevents.SubscriberConfig{Endpoint: pub.Addr(), Topic: "kv"}, func(_ uint64, b kvevents.Batch) {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range b.Events {
			if e.Kind == engine.BlockStored {
				stored = append(stored, e)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()

	cfg := Config{Engine: testEngine()}
	cfg.Engine.EnableKVEvents = true
	cfg.KVEvents = func(at time.Time, evs []engine.KVEvent, tokens func(kvblock.Hash) []uint32) {
		pub.Publish(kvevents.Batch{TS: float64(at.UnixNano()) / 1e9, Events: kvevents.FromEngine(evs, tokens)})
	}
	ts := startTCP(t, cfg)
	defer ts.stop()
	prompt := words(ts.Server, 500, 40) // 2 full blocks of 16 and 8 tokens
	ids := ts.tok.Encode(prompt)
	// The subscriber may join late (ZMQ's slow joiner): send until events
	// arrive, then check the last request's.
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		stored = stored[:0]
		mu.Unlock()
		resp, err := ts.post(context.Background(), "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 30, "ignore_eos": true})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if _, err := ts.post(context.Background(), "/reset_prefix_cache", nil); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
		mu.Lock()
		n := len(stored)
		mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no BlockStored events arrived")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	var tokens []uint32
	var hashes []kvevents.BlockHash
	for _, e := range stored {
		if e.BlockSize != 16 || len(e.TokenIDs) != 16*len(e.BlockHashes) {
			t.Fatalf("event %+v: block size and token ids disagree", e)
		}
		tokens = append(tokens, e.TokenIDs...)
		hashes = append(hashes, e.BlockHashes...)
	}
	// Prompt (40) and output (30) give 70 tokens: 4 full blocks, the last
	// one stored only once generated.
	if len(hashes) != 4 || !slices.Equal(tokens[:40], ids) {
		t.Fatalf("stored %d blocks, tokens %v..., want 4 blocks starting with the prompt %v", len(hashes), tokens[:8], ids[:8])
	}
	want := kvblock.AppendHashes(nil, kvblock.Salt(DefaultModelName, "", ""), tokens, 16)
	for i, h := range hashes {
		if h.V != want[i].Lo {
			t.Fatalf("block %d hash %x, want the low 64 bits of the engine's hash %x", i, h.V, want[i].Lo)
		}
	}
	if stored[0].ParentBlockHash != nil {
		t.Fatalf("first stored block has a parent %v", *stored[0].ParentBlockHash)
	}
}
