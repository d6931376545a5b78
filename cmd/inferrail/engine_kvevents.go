package main

import (
	"context"
	"fmt"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/engine/kvevents"
	"github.com/inferrail/inferrail/engine/server"
)

// attachKVEvents starts the KV event publisher named by --kv-events-config
// (vLLM's JSON) and points cfg at it. It returns a function that stops it.
func attachKVEvents(ctx context.Context, spec string, cfg *server.Config) (func(), error) {
	if spec == "" {
		return func() {}, nil
	}
	kc, err := kvevents.ParseConfig([]byte(spec))
	if err != nil {
		return nil, usagef("--kv-events-config: %w", err)
	}
	if !kc.EnableKVCacheEvents {
		return func() {}, nil
	}
	pub, err := kvevents.NewPublisher(ctx, kc)
	if err != nil {
		return nil, fmt.Errorf("--kv-events-config: %w", err)
	}
	cfg.Engine.EnableKVEvents = true
	cfg.KVEvents = func(at time.Time, evs []engine.KVEvent, tokens func(kvblock.Hash) []uint32) {
		// The queue is bounded; a full queue drops the batch and counts it,
		// as vLLM's publisher does.
		_ = pub.Publish(kvevents.Batch{
			TS:     float64(at.UnixNano()) / 1e9,
			Events: kvevents.FromEngine(evs, tokens),
		})
	}
	return func() { pub.Close() }, nil
}
