package live

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inferrail/inferrail/engine/kvevents"
	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/live/config"
)

// centralEngine starts an engine on 127.0.0.1:port whose KV events go out
// through a publisher that connects to listen, on topic.
func centralEngine(t *testing.T, port int, listen, topic string) *upstream {
	t.Helper()
	kc := kvevents.DefaultConfig()
	kc.EnableKVCacheEvents, kc.Endpoint, kc.Topic = true, listen, topic
	u, _ := publishingEngineAt(t, fmt.Sprintf("127.0.0.1:%d", port), testEngineConfig(), kc)
	return u
}

// llm-d's central KV-events mode: the proxy binds kv_events_listen, the
// engines' publishers connect to it, each on its topic kv@HOST:PORT@MODEL
// (or a listed replica's own kv_events_topic), and each topic's events
// reach its replica's index; a topic that names no replica is counted and
// dropped.
func TestKVEventsListen(t *testing.T) {
	listen := fmt.Sprintf("tcp://127.0.0.1:%d", freeTCPPort(t))
	pa, pb := freeTCPPort(t), freeTCPPort(t)
	ua := centralEngine(t, pa, listen, fmt.Sprintf("kv@127.0.0.1:%d@%s", pa, server.DefaultModelName))
	ub := centralEngine(t, pb, listen, "engine-b")
	stray := centralEngine(t, freeTCPPort(t), listen, "kv@10.9.9.9:8000@other")
	o := testConfig(t, ua, ub)
	o.Models[0].Index, o.Models[0].KVEventsListen = config.IndexEvents, listen
	o.Models[0].Replicas[1].KVEventsTopic = "engine-b" // its own topic, exactly
	g := startGateway(t, o)
	strayBase := stray.url()
	// Until both replicas' batches are applied (the publishers connect
	// with ZMQ's slow joiner): new prompts each round, as a cached one
	// stores no block and publishes nothing.
	round := 0
	waitUntil(t, "KV events from both engines", 20*time.Second, func() bool {
		round++
		for i := range 4 {
			g.complete(context.Background(), words(1000+round*200+i*40, 40), 2)
		}
		// The stray engine is no replica: its events are dropped.
		if resp, err := g.client.Post(strayBase+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "`+words(20000+round*40, 40)+`", "max_tokens": 1}`)); err == nil {
			resp.Body.Close()
		}
		time.Sleep(50 * time.Millisecond)
		for _, r := range []string{"a", "b"} {
			if testutil.ToFloat64(g.met.kvEvents.WithLabelValues(server.DefaultModelName, r, "applied")) == 0 {
				return false
			}
		}
		return true
	})
	wantRepeatPredicted(t, g, words(9000, 100), "96")
	// The stray engine's publisher may connect later than the others:
	// new prompts until its batches are counted.
	waitUntil(t, "the stray topic counted", 20*time.Second, func() bool {
		round++
		if resp, err := g.client.Post(strayBase+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "`+words(20000+round*40, 40)+`", "max_tokens": 1}`)); err == nil {
			resp.Body.Close()
		}
		time.Sleep(50 * time.Millisecond)
		return testutil.ToFloat64(g.met.kvEvents.WithLabelValues(server.DefaultModelName, "", "unrouted")) > 0
	})
}
