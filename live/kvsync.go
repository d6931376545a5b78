package live

import (
	"context"
	"sync/atomic"

	"github.com/inferrail/inferrail/engine/kvevents"
	"github.com/inferrail/inferrail/router/gateway"
)

// kvSync feeds one replica's KV events to its model's gateway core, which
// recomputes its own block hashes from each stored block's tokens (engines
// hash their own way) and keeps the engine-id to own-hash map for removals.
// A gap the replay could not repair, or a reset, makes the core forget what
// it believed of the replica; the index rebuilds from new events.
type kvSync struct {
	s   *Server
	m   *model
	r   *replica
	sub *kvevents.Subscriber
	// topic is the replica's topic on its model's kv_events_listen
	// (kvmux.go), its events routed there instead of sub's.
	topic string
	mux   *atomic.Pointer[kvevents.Mux]
	// evs and ids are scratch for converting one batch; the subscriber
	// calls apply from one goroutine.
	evs []gateway.KVEvent
	ids []uint64
}

func (s *Server) startKVSync(ctx context.Context, m *model, r *replica) (*kvSync, error) {
	k := &kvSync{s: s, m: m, r: r}
	sub, err := kvevents.NewSubscriber(ctx, kvevents.SubscriberConfig{
		Endpoint:       r.kvEvents,
		ReplayEndpoint: r.kvReplay,
		Topic:          r.kvTopic,
		Bind:           r.kvBind,
		OnGap:          k.onGap,
		OnReset:        func(kvevents.Reset) { k.outOfSync("reset") },
	}, k.apply)
	if err != nil {
		return nil, err
	}
	k.sub = sub
	return k, nil
}

func (k *kvSync) onGap(g kvevents.Gap) {
	if g.Repaired {
		k.s.met.kvBatch(k.m.name, k.r.name, "gap_repaired")
		return
	}
	k.outOfSync("gap")
}

// outOfSync forgets what the index believed of the replica: the events it
// missed may have evicted anything.
func (k *kvSync) outOfSync(why string) {
	k.m.log.Warn("replica KV index reset", "model", k.m.name, "replica", k.r.name, "cause", why)
	k.m.resync(k.r)
	k.s.met.kvBatch(k.m.name, k.r.name, why)
}

func (k *kvSync) apply(_ uint64, b kvevents.Batch) {
	k.evs, k.ids = toGateway(b.Events, k.evs[:0], k.ids[:0])
	if len(k.evs) > 0 {
		k.m.kvEvents(k.r, k.evs)
	}
	clear(k.evs) // drop the batch's token slices
	k.s.met.kvBatch(k.m.name, k.r.name, "applied")
}

// toGateway converts vLLM's events to the core's, appended to out; ids
// holds their engine block ids. The events keep references into evs' token
// ids, which the core reads before it returns.
func toGateway(evs []kvevents.Event, out []gateway.KVEvent, ids []uint64) ([]gateway.KVEvent, []uint64) {
	for i := range evs {
		e := &evs[i]
		start := len(ids)
		for _, h := range e.BlockHashes {
			ids = append(ids, h.V)
		}
		ge := gateway.KVEvent{Kind: e.Kind, Blocks: ids[start:len(ids):len(ids)], TokenIDs: e.TokenIDs, BlockSize: e.BlockSize, Medium: e.Medium, LoRA: e.LoRAName}
		if e.ParentBlockHash != nil {
			ge.Parent, ge.HasParent = e.ParentBlockHash.V, true
		} else if len(e.ExtraKeys) > 0 {
			ge.CacheSalt = cacheSaltOf(e.ExtraKeys[0], e.LoRAName)
		}
		out = append(out, ge)
	}
	return out, ids
}

// cacheSaltOf reads the cache_salt in a prefix's first block's extra keys
// (vLLM's: its LoRA name, its multimodal items' (identifier, offset)
// pairs, its cache_salt, its prompt embeddings' digests, in that order):
// the string that is not the LoRA name, the last one should there be
// several; "" for none.
func cacheSaltOf(keys []any, lora string) string {
	salt := ""
	for _, k := range keys {
		s, ok := k.(string)
		if !ok {
			continue
		}
		if lora != "" && s == lora {
			lora = "" // the LoRA name is the first such string
			continue
		}
		salt = s
	}
	return salt
}

func (k *kvSync) close() {
	if k.sub != nil {
		k.sub.Close()
	}
	if k.mux != nil {
		if mux := k.mux.Load(); mux != nil {
			mux.Forget(k.topic)
		}
	}
}
