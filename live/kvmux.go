package live

import (
	"context"
	"strings"
	"sync/atomic"

	"github.com/inferrail/inferrail/engine/kvevents"
	"github.com/inferrail/inferrail/router"
)

// This file is llm-d's central KV-events mode: the proxy (or the picker)
// binds one ZMQ endpoint, the model's kv_events_listen, every engine's
// publisher connects to it, and each publishes on its own topic,
// kv@ADDRESS@MODEL. A kvevents.Mux reads them all and keeps each topic's
// sequence and replay apart; the topic names the replica (topicNames), and
// from there its events take the path of a subscribed replica's (kvSync).

// startKVMux binds m's kv_events_listen, in events mode.
func (s *Server) startKVMux(ctx context.Context, bg *background, m *model) error {
	if m.index != router.IndexEvents || m.kvListen == "" {
		return nil
	}
	var ref atomic.Pointer[kvevents.Mux] // the routes' Forget, once bound
	warned := map[string]bool{}
	mux, err := kvevents.NewMux(ctx, kvevents.MuxConfig{
		Endpoint: m.kvListen,
		Unrouted: func(topic string) {
			s.met.kvBatch(m.name, "", "unrouted")
			if !warned[topic] && len(warned) < maxWarnedTopics {
				warned[topic] = true
				m.log.Warn("KV events on a topic that names no replica: dropped", "model", m.name, "topic", topic,
					"want", "kv@HOST:PORT@MODEL with a replica's host:port, or a listed replica's kv_events_topic")
			}
		},
	}, func(topic string) (kvevents.Route, bool) { return s.routeTopic(bg, m, topic, &ref) })
	if err != nil {
		return err
	}
	ref.Store(mux)
	bg.mu.Lock()
	bg.muxes = append(bg.muxes, mux)
	bg.mu.Unlock()
	return nil
}

// maxWarnedTopics bounds the unrouted topics logged, once each.
const maxWarnedTopics = 64

// routeTopic is where a topic's batches go: the replica it names, which
// then counts as subscribed (its kvSync closes the route when it is
// removed). False for a topic no replica of m answers to (yet: a replica
// added later is found on the topic's next batch).
func (s *Server) routeTopic(bg *background, m *model, topic string, mux *atomic.Pointer[kvevents.Mux]) (kvevents.Route, bool) {
	var r *replica
	for _, c := range m.live() {
		if c.kvEvents == "" && topicNames(topic, c) {
			r = c
			break
		}
	}
	if r == nil {
		return kvevents.Route{}, false
	}
	bg.mu.Lock()
	defer bg.mu.Unlock()
	if _, ok := bg.kv[r]; ok {
		// Another topic already names this replica: one publisher each.
		return kvevents.Route{}, false
	}
	k := &kvSync{s: s, m: m, r: r, topic: topic, mux: mux}
	bg.kv[r] = k
	m.log.Info("replica KV events routed", "model", m.name, "replica", r.name, "topic", topic)
	return kvevents.Route{
		ReplayEndpoint: r.kvReplay,
		Handler:        k.apply,
		OnGap:          k.onGap,
		OnReset:        func(kvevents.Reset) { k.outOfSync("reset") },
	}, true
}

// topicNames reports whether a central KV-events topic is r's: the
// kv_events_topic r is listed with, exactly, or else llm-d's
// kv@ADDRESS@MODEL whose ADDRESS is r's host:port (or its host, when the
// topic names no port).
func topicNames(topic string, r *replica) bool {
	if r.group == "" && r.kvTopic != "" {
		return topic == r.kvTopic
	}
	rest, ok := strings.CutPrefix(topic, "kv@")
	if !ok {
		return false
	}
	addr, _, _ := strings.Cut(rest, "@")
	return addr == r.base.Host || addr == r.base.Hostname()
}
