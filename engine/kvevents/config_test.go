package kvevents

import (
	"strings"
	"testing"
)

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig([]byte(`{"enable_kv_cache_events": true, "endpoint": "tcp://*:6000", "replay_endpoint": "tcp://*:6001", "topic": "kv", "buffer_steps": 5}`))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{EnableKVCacheEvents: true, Publisher: "zmq", Endpoint: "tcp://*:6000", ReplayEndpoint: "tcp://*:6001",
		BufferSteps: 5, HWM: 100000, MaxQueueSize: 100000, Topic: "kv"}
	if c != want {
		t.Fatalf("got %+v\nwant %+v", c, want)
	}

	// vLLM's defaults; publisher follows enable_kv_cache_events; null replay.
	c, err = ParseConfig([]byte(`{"replay_endpoint": null}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Publisher != PublisherNull || c.Endpoint != "tcp://*:5557" || c.BufferSteps != 10000 || c.ReplayEndpoint != "" || c.EnableKVCacheEvents {
		t.Fatalf("defaults: %+v", c)
	}
}

func TestParseConfigRejects(t *testing.T) {
	cases := []struct{ json, errHas string }{
		{`{"enable_kv_cache_events": true, "endpont": "tcp://*:1"}`, `unknown field "endpont"`},
		{`{"publisher": "kafka"}`, `publisher "kafka"`},
		{`{"enable_kv_cache_events": true, "endpoint": "http://x:1"}`, "must start with tcp://"},
		{`{"enable_kv_cache_events": true, "endpoint": "tcp://host"}`, "has no port"},
		{`{"enable_kv_cache_events": true, "max_queue_size": 0}`, "max_queue_size 0"},
		{`{"enable_kv_cache_events": true, "buffer_steps": -1}`, "buffer_steps -1"},
		{`{"enable_kv_cache_events": true, "hwm": -1}`, "hwm -1"},
		{`{"buffer_steps": "ten"}`, "want a JSON object"},
		{`{} {}`, "text after the JSON object"},
		{`[1]`, "want a JSON object"},
	}
	for _, c := range cases {
		_, err := ParseConfig([]byte(c.json))
		if err == nil || !strings.Contains(err.Error(), c.errHas) {
			t.Errorf("%s: error %v, want one mentioning %q", c.json, err, c.errHas)
		}
	}
}

func TestBinds(t *testing.T) {
	for ep, want := range map[string]bool{
		"tcp://*:5557":          true,
		"tcp://[::]:5557":       true,
		"ipc:///tmp/kv":         true,
		"inproc://kv":           true,
		"tcp://127.0.0.1:5557":  false,
		"tcp://router.svc:5557": false,
	} {
		if got := Binds(ep); got != want {
			t.Errorf("Binds(%q) = %v, want %v", ep, got, want)
		}
	}
}

func TestEndpointForRank(t *testing.T) {
	cases := []struct {
		ep   string
		rank int
		want string
	}{
		{"tcp://*:5557", 0, "tcp://*:5557"},
		{"tcp://*:5557", 3, "tcp://*:5560"},
		{"tcp://[::1]:5557", 1, "tcp://[::1]:5558"},
		{"ipc:///tmp/kv", 2, "ipc:///tmp/kv_dp2"},
		{"inproc://kv", 1, "inproc://kv_dp1"},
	}
	for _, c := range cases {
		got, err := EndpointForRank(c.ep, c.rank)
		if err != nil || got != c.want {
			t.Errorf("EndpointForRank(%q, %d) = %q, %v; want %q", c.ep, c.rank, got, err, c.want)
		}
	}
	for _, bad := range []struct {
		ep   string
		rank int
	}{{"tcp://*:65535", 1}, {"tcp://host", 1}, {"udp://x:1", 1}, {"tcp://*:1", -1}} {
		if _, err := EndpointForRank(bad.ep, bad.rank); err == nil {
			t.Errorf("EndpointForRank(%q, %d) accepted", bad.ep, bad.rank)
		}
	}
}

func TestParseFormat(t *testing.T) {
	for _, f := range []Format{FormatMap, FormatArray} {
		got, err := ParseFormat(f.String())
		if err != nil || got != f {
			t.Errorf("ParseFormat(%q) = %v, %v", f.String(), got, err)
		}
	}
	if _, err := ParseFormat("json"); err == nil {
		t.Error("ParseFormat(json) accepted")
	}
}
