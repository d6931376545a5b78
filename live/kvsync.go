package live

import (
	"context"
	"sync"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/engine/kvevents"
)

// kvSync feeds one replica's KV events to its model's index. Engines hash
// blocks their own way (vLLM: sha256 or xxhash with a per-deployment seed),
// so, as llm-d's "dual key" design does, the proxy recomputes its own block
// hashes from each BlockStored event's token ids, chained from the parent
// it already knows, and keeps an engine-hash to own-hash map for
// BlockRemoved. A block whose parent it never saw (events before the proxy
// subscribed) cannot be placed and is skipped; decisions recorded
// speculatively stand in until the engine stores blocks the proxy can place.
type kvSync struct {
	s   *Server
	m   *model
	r   *replica
	sub *kvevents.Subscriber

	mu  sync.Mutex
	own map[uint64]kvblock.Hash
	buf []engine.KVEvent
}

func (s *Server) startKVSync(ctx context.Context, m *model, r *replica) (*kvSync, error) {
	k := &kvSync{s: s, m: m, r: r, own: map[uint64]kvblock.Hash{}}
	sub, err := kvevents.NewSubscriber(ctx, kvevents.SubscriberConfig{
		Endpoint:       r.kvEvents,
		ReplayEndpoint: r.kvReplay,
		Topic:          r.kvTopic,
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
// missed may have evicted anything. The index rebuilds from new events.
func (k *kvSync) outOfSync(why string) {
	k.mu.Lock()
	clear(k.own)
	k.mu.Unlock()
	k.m.mu.Lock()
	k.m.rt.Restarted(k.r.idx)
	k.m.mu.Unlock()
	k.s.met.kvBatch(k.m.name, k.r.name, why)
}

func (k *kvSync) apply(_ uint64, b kvevents.Batch) {
	k.mu.Lock()
	evs := k.translate(b, k.buf[:0])
	k.buf = evs
	k.mu.Unlock()
	if len(evs) > 0 {
		k.m.mu.Lock()
		k.m.rt.KVEvents(k.r.idx, evs)
		k.m.mu.Unlock()
	}
	k.s.met.kvBatch(k.m.name, k.r.name, "applied")
}

// translate turns an event batch into engine events keyed by the proxy's
// own hashes.
func (k *kvSync) translate(b kvevents.Batch, out []engine.KVEvent) []engine.KVEvent {
	bs := k.m.opts.Engine.BlockSize
	for _, e := range b.Events {
		switch e.Kind {
		case engine.BlockStored:
			if e.BlockSize != 0 && e.BlockSize != bs || len(e.TokenIDs) != bs*len(e.BlockHashes) {
				continue // cannot recompute: a block size the model is not configured for
			}
			parent := k.m.salt
			if e.ParentBlockHash != nil {
				p, ok := k.own[e.ParentBlockHash.V]
				if !ok {
					continue
				}
				parent = p
			}
			ours := make([]kvblock.Hash, 0, len(e.BlockHashes))
			for i, h := range e.BlockHashes {
				parent = kvblock.HashBlock(parent, e.TokenIDs[i*bs:(i+1)*bs])
				k.own[h.V] = parent
				ours = append(ours, parent)
			}
			out = append(out, engine.KVEvent{Kind: engine.BlockStored, BlockHashes: ours, BlockSize: bs, Medium: engine.MediumGPU})
		case engine.BlockRemoved:
			var ours []kvblock.Hash
			for _, h := range e.BlockHashes {
				if o, ok := k.own[h.V]; ok {
					ours = append(ours, o)
					delete(k.own, h.V)
				}
			}
			if len(ours) > 0 {
				out = append(out, engine.KVEvent{Kind: engine.BlockRemoved, BlockHashes: ours, Medium: engine.MediumGPU})
			}
		case engine.AllBlocksCleared:
			clear(k.own)
			out = append(out, engine.KVEvent{Kind: engine.AllBlocksCleared})
		}
	}
	return out
}

func (k *kvSync) close() {
	if k.sub != nil {
		k.sub.Close()
	}
}
