package main

import (
	"context"

	"github.com/inferrail/inferrail/engine/server"
)

// attachKVEvents starts the KV event publisher named by --kv-events-config
// and points cfg at it. It returns a function that stops it.
func attachKVEvents(ctx context.Context, spec string, cfg *server.Config) (func(), error) {
	if spec == "" {
		return func() {}, nil
	}
	return func() {}, usagef("--kv-events-config: not available in this build yet")
}
