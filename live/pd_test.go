package live

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/engine/simtok"
	"github.com/inferrail/inferrail/internal/pipenet"
	"github.com/inferrail/inferrail/live/config"
)

func TestPrefillAndDecodeBodies(t *testing.T) {
	body := []byte(`{"model":"m","prompt":"a b","stream":true,"stream_options":{"include_usage":true},"max_tokens":64,"min_tokens":4,"temperature":0,"kv_transfer_params":{"remote_host":"evil"},"user":"u"}`)
	p, err := prefillBody(body)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"model":"m","prompt":"a b","temperature":0,"user":"u","kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null},"stream":false,"max_tokens":1}`
	if string(p) != want {
		t.Fatalf("prefill body\n got %s\nwant %s", p, want)
	}
	// Chat with max_completion_tokens: both bounds are 1.
	p, _ = prefillBody([]byte(`{"messages":[{"role":"user","content":"x"}],"max_completion_tokens":9,"min_completion_tokens":2}`))
	if want := `{"messages":[{"role":"user","content":"x"}],"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null},"stream":false,"max_tokens":1,"max_completion_tokens":1}`; string(p) != want {
		t.Fatalf("chat prefill body\n got %s\nwant %s", p, want)
	}
	params := []byte(`{"do_remote_prefill":true,"remote_engine_id":"e"}`)
	d, err := decodeBody(withoutKVParams(body), params)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"model":"m","prompt":"a b","stream":true,"stream_options":{"include_usage":true},"max_tokens":64,"min_tokens":4,"temperature":0,"user":"u","kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"e"}}`; string(d) != want {
		t.Fatalf("decode body\n got %s\nwant %s", d, want)
	}
	// A body without the key is left as it is; an escaped key is found.
	plain := []byte(`{"prompt":"x"}`)
	if out := withoutKVParams(plain); &out[0] != &plain[0] {
		t.Fatal("a body without kv_transfer_params was copied")
	}
	if out := withoutKVParams([]byte(`{"kv_transfer_param\u0073":{"remote_host":"h"},"prompt":"x"}`)); string(out) != `{"prompt":"x"}` {
		t.Fatalf("escaped key kept: %s", out)
	}
	// An answer's kv_transfer_params is nulled in place.
	ans := []byte(`{"id":"c","choices":[],"kv_transfer_params":{"do_remote_prefill":false},"metrics":null}`)
	if out, ok := nullKVParams(ans); !ok || string(out) != `{"id":"c","choices":[],"kv_transfer_params":null,"metrics":null}` {
		t.Fatalf("nulled: %s %v", out, ok)
	}
	if _, ok := nullKVParams([]byte(`{"kv_transfer_params":null}`)); ok {
		t.Fatal("a null kv_transfer_params was rewritten")
	}
}

// pdLab is engines and gateways on one in-memory network, on virtual time
// (inside a synctest bubble).
type pdLab struct {
	pn     pipenet.Network
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	stops  []func()
	client *http.Client
}

func newPDLab() *pdLab {
	l := &pdLab{}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.client = &http.Client{Transport: &http.Transport{DialContext: l.pn.Dial, MaxIdleConnsPerHost: 64}}
	return l
}

// pdEngineConfig is the engines' profile: fast steps, and a 1 GB/s KV
// link, so a transfer takes a measurable time.
func pdEngineConfig() engine.Config {
	c := testEngineConfig()
	c.PDTransfer = engine.PDTransfer{BandwidthGBps: 1, BaseLatencyMs: 1}
	return c
}

// serve serves h at addr ("host:80").
func (l *pdLab) serve(addr string, h http.Handler) func() {
	ln := l.pn.Listen(addr)
	hs := &http.Server{Handler: h}
	l.wg.Add(1)
	go func() { defer l.wg.Done(); hs.Serve(ln) }()
	var once sync.Once
	stop := func() { once.Do(func() { hs.Close(); ln.Close() }) }
	l.stops = append(l.stops, stop)
	return stop
}

// engine starts a mock engine at addr in kv role role ("" for none).
func (l *pdLab) engine(t *testing.T, addr, role string, faults server.Faults) (*server.Server, func()) {
	t.Helper()
	cfg := server.Config{Engine: pdEngineConfig(), EnablePromptTokensDetails: true, Faults: faults, TransferDial: l.pn.Dial}
	if role != "" {
		cfg.KVTransfer = server.KVTransfer{Connector: server.ConnectorNixl, Role: role}
	}
	s, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l.wg.Add(1)
	go func() { defer l.wg.Done(); s.Run(l.ctx) }()
	return s, l.serve(addr, s.Handler())
}

// gateway starts a proxy at addr for c.
func (l *pdLab) gateway(t *testing.T, addr string, c *config.Config) *Server {
	t.Helper()
	gw, err := New(c, Deps{Transport: &http.Transport{DialContext: l.pn.Dial, MaxIdleConnsPerHost: 64}, Encoders: map[string]Encoder{c.Models[0].Name: simModel(t)}})
	if err != nil {
		t.Fatal(err)
	}
	l.wg.Add(1)
	go func() { defer l.wg.Done(); gw.Run(l.ctx) }()
	l.serve(addr, gw.Handler())
	l.stops = append(l.stops, gw.Close)
	return gw
}

func (l *pdLab) close() {
	l.client.CloseIdleConnections()
	for i := len(l.stops) - 1; i >= 0; i-- {
		l.stops[i]()
	}
	l.cancel()
	l.wg.Wait()
	time.Sleep(time.Second) // connections that linger after early answers
}

// pdConfig is a gateway's configuration for replicas named by role.
func pdConfig(t *testing.T, decider string, reps ...config.Replica) *config.Config {
	c := config.Default()
	c.Health.Interval = time.Hour // no probe ejects a replica under test
	c.Retry.Attempts = 1
	m := config.DefaultModel()
	m.Name, m.Policy = server.DefaultModelName, "round_robin"
	m.Profile = profileFile(t, pdEngineConfig())
	m.PD.Decider = decider
	m.Replicas = reps
	c.Models = []config.Model{m}
	return &c
}

// streamed is a streamed answer: its text, its usage and when its first
// event came.
type streamed struct {
	status  int
	replica string
	text    string
	usage   string
	ttft    time.Duration
	body    string
}

func (l *pdLab) stream(t *testing.T, ctx context.Context, base, path string, body map[string]any) streamed {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(b))
	began := time.Now()
	resp, err := l.client.Do(req)
	if err != nil {
		return streamed{status: -1}
	}
	defer resp.Body.Close()
	out := streamed{status: resp.StatusCode, replica: resp.Header.Get(HeaderReplica)}
	first := true
	var all strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if first {
			out.ttft, first = time.Since(began), false
		}
		all.WriteString(data)
		all.WriteByte('\n')
		if data == "[DONE]" {
			break
		}
		ev := struct{ Data []byte }{[]byte(data)}
		var c struct {
			Choices []struct {
				Text  string `json:"text"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage json.RawMessage `json:"usage"`
		}
		if json.Unmarshal(ev.Data, &c) != nil {
			continue
		}
		for _, ch := range c.Choices {
			out.text += ch.Text + ch.Delta.Content
		}
		if len(c.Usage) > 0 && string(c.Usage) != "null" {
			out.usage = string(c.Usage)
		}
	}
	out.body = all.String()
	return out
}

// Through live in front of a prefill engine and a decode engine, streamed
// and not, completions and chat: the client gets one ordinary OpenAI
// answer, the aggregated one token for token (the same engine model and
// seed behind a gateway with one engine of both roles), from the decode
// replica. Its time to first token is the prefill's, the KV transfer's
// and one decode step, nothing more: the decode streams the moment it
// starts.
func TestPDThroughLive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newPDLab()
		defer l.close()
		_, _ = l.engine(t, "prefill:80", server.RoleProducer, server.Faults{})
		dec, _ := l.engine(t, "decode:80", server.RoleConsumer, server.Faults{})
		_, _ = l.engine(t, "both:80", "", server.Faults{})
		gw := l.gateway(t, "gw:80", pdConfig(t, "always",
			config.Replica{Name: "p", URL: "http://prefill:80", Role: "prefill"},
			config.Replica{Name: "d", URL: "http://decode:80", Role: "decode"}))
		l.gateway(t, "agg:80", pdConfig(t, "", config.Replica{Name: "b", URL: "http://both:80"}))
		time.Sleep(time.Second) // first scrapes

		tok := simtok.New()
		for i, tc := range []struct {
			path string
			body func(prompt string) map[string]any
		}{
			{"/v1/completions", func(p string) map[string]any {
				return map[string]any{"prompt": p, "max_tokens": 24, "ignore_eos": true, "stream": true, "stream_options": map[string]any{"include_usage": true}}
			}},
			{"/v1/chat/completions", func(p string) map[string]any {
				return map[string]any{"messages": []map[string]string{{"role": "user", "content": p}}, "max_completion_tokens": 24, "ignore_eos": true, "stream": true,
					"stream_options": map[string]any{"include_usage": true}}
			}},
		} {
			prompt := words(1000*(i+1), 400)
			pd := l.stream(t, context.Background(), "http://gw:80", tc.path, tc.body(prompt))
			agg := l.stream(t, context.Background(), "http://agg:80", tc.path, tc.body(prompt))
			if pd.status != 200 || pd.replica != "d" || pd.text == "" {
				t.Fatalf("%s through P/D: status %d from %q, text %q", tc.path, pd.status, pd.replica, pd.text)
			}
			if pd.text != agg.text || pd.usage == "" {
				t.Fatalf("%s: P/D answered %q (usage %s), aggregated %q (usage %s)", tc.path, pd.text, pd.usage, agg.text, agg.usage)
			}
			if strings.Contains(pd.body, "kv_transfer_params") {
				t.Fatalf("%s: the stream names kv_transfer_params:\n%s", tc.path, pd.body)
			}
			if i == 0 {
				// The prefill engine's step of the whole prompt, the
				// transfer of its KV, the decode engine's first step.
				ec := pdEngineConfig()
				ids := tok.Encode(prompt)
				hashes := kvblock.AppendHashes(nil, kvblock.Salt(server.DefaultModelName, "", ""), ids, ec.BlockSize)
				pe, _ := engine.New(ec)
				pe.Add(0, engine.Request{ID: 1, PromptTokens: len(ids), OutputTokens: 1, MaxTokens: 1, BlockHashes: hashes})
				prefillStep := pe.Step(0).End()
				de, _ := engine.New(ec)
				de.Add(0, engine.Request{ID: 1, PromptTokens: len(ids), OutputTokens: 24, MaxTokens: 24, BlockHashes: hashes, RemotePrefill: true})
				decodeStep := de.Step(0).End()
				want := prefillStep + ec.TransferTime(len(ids)) + decodeStep
				t.Logf("TTFT %v = prefill %v + transfer %v + decode step %v (aggregated %v)", pd.ttft, prefillStep, ec.TransferTime(len(ids)), decodeStep, agg.ttft)
				if d := pd.ttft - want; d < -time.Millisecond || d > time.Millisecond {
					t.Fatalf("TTFT %v; want the prefill %v + the transfer %v + one decode step %v = %v", pd.ttft, prefillStep, ec.TransferTime(len(ids)), decodeStep, want)
				}
			}
		}

		// Not streamed: one JSON answer, kv_transfer_params null as vLLM
		// writes it without P/D.
		b, _ := json.Marshal(map[string]any{"prompt": words(7000, 300), "max_tokens": 8, "ignore_eos": true})
		resp, err := l.client.Post("http://gw:80/v1/completions", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var ans struct {
			Object string          `json:"object"`
			KV     json.RawMessage `json:"kv_transfer_params"`
			Usage  struct {
				Completion int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(raw, &ans) != nil || ans.Object != "text_completion" || string(ans.KV) != "null" || ans.Usage.Completion != 8 {
			t.Fatalf("non-streamed: %d %s", resp.StatusCode, raw)
		}

		if got := testutil.ToFloat64(gw.met.pdRequests.WithLabelValues(server.DefaultModelName, "remote")); got != 3 {
			t.Fatalf("inferrail_pd_requests_total{outcome=remote} = %v, want 3", got)
		}
		if got := testutil.ToFloat64(gw.met.pdRequests.WithLabelValues(server.DefaultModelName, "fallback")); got != 0 {
			t.Fatalf("fallbacks: %v", got)
		}
		m := scrapeBody(t, l.client, "http://decode:80/metrics")
		if !strings.Contains(m, `vllm:nixl_xfer_time_seconds_count{engine="0",model_name="inferrail-sim"} 3`) {
			t.Fatalf("the decode engine did not read 3 transfers:\n%s", grepLines(m, "nixl"))
		}
		_ = dec
		waitIdle(t, gw)
	})
}

func scrapeBody(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// waitIdle waits (virtual time) until the gateway's core holds nothing:
// every request and prefill ended exactly once.
func waitIdle(t *testing.T, gw *Server) {
	t.Helper()
	for range 100 {
		busy := false
		for _, m := range gw.models {
			for _, r := range m.snapshot().reps {
				busy = busy || r.st.Load.InFlight != 0 || r.st.Load.Pending != 0 || r.st.ReservedBlocks != 0
			}
		}
		if !busy {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, m := range gw.models {
		for _, r := range m.snapshot().reps {
			t.Errorf("replica %s: in flight %d, pending %d, reserved %d", r.rep.name, r.st.Load.InFlight, r.st.Load.Pending, r.st.ReservedBlocks)
		}
	}
}

// A prefill that fails (its engine down, answering 500, hanging past
// pd.prefill_timeout, or answering without kv_transfer_params because it
// has no KV connector) falls back to a local prefill on the decode
// replica: the client still gets a 200 with the whole answer, and the
// fallback is counted with its reason.
func TestPDPrefillFailureFallsBack(t *testing.T) {
	for _, tc := range []struct {
		name   string
		start  func(t *testing.T, l *pdLab)
		reason string
	}{
		{"engine down", func(t *testing.T, l *pdLab) {}, "prefill_error"},
		{"500", func(t *testing.T, l *pdLab) {
			l.engine(t, "prefill:80", server.RoleProducer, server.Faults{ErrorRate: 1})
		}, "prefill_upstream_500"},
		{"hang", func(t *testing.T, l *pdLab) {
			l.engine(t, "prefill:80", server.RoleProducer, server.Faults{HangRate: 1})
		}, "prefill_timeout"},
		{"no connector", func(t *testing.T, l *pdLab) {
			l.engine(t, "prefill:80", "", server.Faults{})
		}, "prefill_no_kv_transfer_params"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := newPDLab()
				defer l.close()
				tc.start(t, l)
				l.engine(t, "decode:80", server.RoleConsumer, server.Faults{})
				l.engine(t, "both:80", "", server.Faults{})
				c := pdConfig(t, "always",
					config.Replica{Name: "p", URL: "http://prefill:80", Role: "prefill"},
					config.Replica{Name: "d", URL: "http://decode:80", Role: "decode"})
				c.Models[0].PD.PrefillTimeout = 2 * time.Second
				gw := l.gateway(t, "gw:80", c)
				l.gateway(t, "agg:80", pdConfig(t, "", config.Replica{Name: "b", URL: "http://both:80"}))
				time.Sleep(time.Second)
				body := map[string]any{"prompt": words(3000, 200), "max_tokens": 12, "ignore_eos": true, "stream": true}
				began := time.Now()
				got := l.stream(t, context.Background(), "http://gw:80", "/v1/completions", body)
				took := time.Since(began)
				want := l.stream(t, context.Background(), "http://agg:80", "/v1/completions", body)
				if got.status != 200 || got.replica != "d" || got.text != want.text || got.text == "" {
					t.Fatalf("status %d from %q, text %q; want 200 from d, %q", got.status, got.replica, got.text, want.text)
				}
				if tc.reason == "prefill_timeout" && (took < 2*time.Second || took > 3*time.Second) {
					t.Fatalf("answered in %v: want the 2s prefill timeout and a local prefill", took)
				}
				if n := testutil.ToFloat64(gw.met.pdRequests.WithLabelValues(server.DefaultModelName, "fallback")); n != 1 {
					t.Fatalf("fallbacks: %v, want 1", n)
				}
				if n := testutil.ToFloat64(gw.met.errors.WithLabelValues(server.DefaultModelName, tc.reason)); n != 1 {
					t.Fatalf("inferrail_upstream_errors_total{reason=%q} = %v, want 1 (%s)", tc.reason, n, grepLines(metricsText(t, gw), "prefill_"))
				}
				waitIdle(t, gw)
			})
		})
	}
}

func metricsText(t *testing.T, gw *Server) string {
	t.Helper()
	var b strings.Builder
	mfs, err := gw.met.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			b.WriteString(mf.GetName())
			for _, lp := range m.GetLabel() {
				b.WriteString(" " + lp.GetName() + "=" + lp.GetValue())
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

// A client that leaves during the prefill ends its request and its
// prefill in the core: nothing stays held on either replica.
func TestPDClientGoneDuringPrefill(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newPDLab()
		defer l.close()
		l.engine(t, "prefill:80", server.RoleProducer, server.Faults{HangRate: 1})
		l.engine(t, "decode:80", server.RoleConsumer, server.Faults{})
		gw := l.gateway(t, "gw:80", pdConfig(t, "always",
			config.Replica{Name: "p", URL: "http://prefill:80", Role: "prefill"},
			config.Replica{Name: "d", URL: "http://decode:80", Role: "decode"}))
		time.Sleep(time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		got := l.stream(t, ctx, "http://gw:80", "/v1/completions", map[string]any{"prompt": words(3000, 200), "max_tokens": 12, "stream": true})
		if got.status == 200 && got.text != "" {
			t.Fatalf("answered %q to a client that left during the prefill", got.text)
		}
		waitIdle(t, gw)
		if n := testutil.ToFloat64(gw.met.pdRequests.WithLabelValues(server.DefaultModelName, "fallback")); n != 0 {
			t.Fatalf("a client gone counted as a fallback: %v", n)
		}
	})
}

// A decode engine that echoes kv_transfer_params does not leak them to the
// client, and a client's own kv_transfer_params never reach an engine.
func TestPDKVParamsNeverLeak(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newPDLab()
		defer l.close()
		l.engine(t, "prefill:80", server.RoleProducer, server.Faults{})
		var mu sync.Mutex
		var seen []string
		l.serve("decode:80", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/v1/completions" {
				w.WriteHeader(http.StatusOK)
				return
			}
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			seen = append(seen, string(b))
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"cmpl-1","object":"text_completion","created":1,"model":"inferrail-sim","choices":[{"index":0,"text":" ok","finish_reason":"length"}],"usage":{"prompt_tokens":3,"total_tokens":4,"completion_tokens":1},"kv_transfer_params":{"do_remote_prefill":false,"remote_host":"10.0.0.9"}}`)
		}))
		gw := l.gateway(t, "gw:80", pdConfig(t, "always",
			config.Replica{Name: "p", URL: "http://prefill:80", Role: "prefill"},
			config.Replica{Name: "d", URL: "http://decode:80", Role: "decode"}))
		time.Sleep(time.Second)
		b, _ := json.Marshal(map[string]any{"prompt": words(100, 64), "max_tokens": 1,
			"kv_transfer_params": map[string]any{"do_remote_prefill": true, "remote_host": "attacker.example", "remote_port": 4444}})
		resp, err := l.client.Post("http://gw:80/v1/completions", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !bytes.Contains(raw, []byte(`"kv_transfer_params":null`)) || bytes.Contains(raw, []byte("10.0.0.9")) {
			t.Fatalf("%d %s", resp.StatusCode, raw)
		}
		if resp.ContentLength != int64(len(raw)) {
			t.Fatalf("content-length %d for %d bytes", resp.ContentLength, len(raw))
		}
		mu.Lock()
		defer mu.Unlock()
		if len(seen) != 1 || strings.Contains(seen[0], "attacker") || !strings.Contains(seen[0], `"remote_engine_id":`) {
			t.Fatalf("the decode engine got %q", seen)
		}
		waitIdle(t, gw)
	})
}

// A decider that keeps a request local sends it to the decode replica
// alone, as an ordinary request: nothing is counted as P/D.
func TestPDDeciderKeepsShortPromptsLocal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newPDLab()
		defer l.close()
		pre, _ := l.engine(t, "prefill:80", server.RoleProducer, server.Faults{})
		l.engine(t, "decode:80", server.RoleConsumer, server.Faults{})
		c := pdConfig(t, "threshold",
			config.Replica{Name: "p", URL: "http://prefill:80", Role: "prefill"},
			config.Replica{Name: "d", URL: "http://decode:80", Role: "decode"})
		c.Models[0].PD.NonCachedTokens = 256
		gw := l.gateway(t, "gw:80", c)
		time.Sleep(time.Second)
		short := l.stream(t, context.Background(), "http://gw:80", "/v1/completions", map[string]any{"prompt": words(100, 50), "max_tokens": 4, "stream": true})
		long := l.stream(t, context.Background(), "http://gw:80", "/v1/completions", map[string]any{"prompt": words(5000, 600), "max_tokens": 4, "stream": true})
		if short.status != 200 || long.status != 200 || short.replica != "d" || long.replica != "d" {
			t.Fatalf("short %d from %s, long %d from %s", short.status, short.replica, long.status, long.replica)
		}
		if n := testutil.ToFloat64(gw.met.pdRequests.WithLabelValues(server.DefaultModelName, "remote")); n != 1 {
			t.Fatalf("remote prefills: %v, want 1 (the long prompt only)", n)
		}
		_ = pre
		waitIdle(t, gw)
	})
}

// A configuration with prefill replicas and none to decode on is refused,
// naming the field.
func TestPDConfigErrors(t *testing.T) {
	doc := `
models:
  - name: m
    pd: {decider: always}
    replicas:
      - {name: p1, url: "http://127.0.0.1:8001", role: prefill}
      - {name: p2, url: "http://127.0.0.1:8002", role: prefill}
`
	_, err := config.Parse([]byte(doc))
	if err == nil || !strings.Contains(err.Error(), "models[0].replicas[0].role: the model has prefill replicas but none to decode on") {
		t.Fatalf("got %v", err)
	}
	_, err = config.Parse([]byte(strings.Replace(doc, "decider: always", "decider: maybe", 1)))
	if err == nil || !strings.Contains(err.Error(), `models[0].pd.decider: unknown decider "maybe"`) {
		t.Fatalf("got %v", err)
	}
	_, err = config.Parse([]byte(strings.Replace(doc, "role: prefill}\n      - {name: p2", "role: prefil}\n      - {name: p2", 1)))
	if err == nil || !strings.Contains(err.Error(), `models[0].replicas[0].role: unknown role "prefil"`) {
		t.Fatalf("got %v", err)
	}
}

// The same over real sockets on 127.0.0.1, through the proxy's own HTTP/1.1
// client: the prefill engine names its side channel by the address the
// proxy reached it at, and the decode engine reads from there.
func TestPDOverTCP(t *testing.T) {
	kv := func(role string) server.Config {
		return server.Config{Engine: pdEngineConfig(), KVTransfer: server.KVTransfer{Connector: server.ConnectorNixl, Role: role}}
	}
	p, d, b := newUpstream(t, kv(server.RoleProducer)), newUpstream(t, kv(server.RoleConsumer)), newUpstream(t, server.Config{Engine: pdEngineConfig()})
	c := testConfig(t, p, d)
	c.Models[0].Replicas[0].Role, c.Models[0].Replicas[1].Role = "prefill", "decode"
	c.Models[0].PD.Decider = "always"
	g := startGateway(t, c)
	agg := startGateway(t, testConfig(t, b))
	prompt := words(2000, 300)
	_, got, err := g.complete(context.Background(), prompt, 16)
	if err != nil {
		t.Fatal(err)
	}
	_, want, err := agg.complete(context.Background(), prompt, 16)
	if err != nil {
		t.Fatal(err)
	}
	text := func(sse string) string {
		var out strings.Builder
		for _, line := range strings.Split(sse, "\n") {
			var c struct {
				Choices []struct{ Text string } `json:"choices"`
			}
			if data, ok := strings.CutPrefix(line, "data: "); ok && json.Unmarshal([]byte(data), &c) == nil && len(c.Choices) > 0 {
				out.WriteString(c.Choices[0].Text)
			}
		}
		return out.String()
	}
	if text(got) != text(want) || text(got) == "" {
		t.Fatalf("P/D over TCP answered %q, aggregated %q", text(got), text(want))
	}
	if n := testutil.ToFloat64(g.met.pdRequests.WithLabelValues(server.DefaultModelName, "remote")); n != 1 {
		t.Fatalf("remote prefills: %v, want 1 (fallbacks %v)", n, testutil.ToFloat64(g.met.pdRequests.WithLabelValues(server.DefaultModelName, "fallback")))
	}
	m := scrapeBody(t, http.DefaultClient, d.url()+"/metrics")
	if !strings.Contains(m, `vllm:nixl_xfer_time_seconds_count{engine="0",model_name="inferrail-sim"} 1`) || !strings.Contains(m, `vllm:nixl_num_failed_transfers_total{engine="0",model_name="inferrail-sim"} 0`) {
		t.Fatalf("decode engine's transfers:\n%s", grepLines(m, "nixl"))
	}
}

// The request's own deadline bounds its prefill: past request_timeout the
// client gets a 504 and the core holds nothing.
func TestPDRequestTimeoutDuringPrefill(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newPDLab()
		defer l.close()
		l.engine(t, "prefill:80", server.RoleProducer, server.Faults{HangRate: 1})
		l.engine(t, "decode:80", server.RoleConsumer, server.Faults{})
		c := pdConfig(t, "always",
			config.Replica{Name: "p", URL: "http://prefill:80", Role: "prefill"},
			config.Replica{Name: "d", URL: "http://decode:80", Role: "decode"})
		c.RequestTimeout, c.Models[0].PD.PrefillTimeout = time.Second, time.Minute
		gw := l.gateway(t, "gw:80", c)
		time.Sleep(time.Second)
		began := time.Now()
		got := l.stream(t, context.Background(), "http://gw:80", "/v1/completions", map[string]any{"prompt": words(3000, 200), "max_tokens": 12, "stream": true})
		if got.status != http.StatusGatewayTimeout || time.Since(began) > 2*time.Second {
			t.Fatalf("status %d after %v, want 504 after request_timeout (1s)", got.status, time.Since(began))
		}
		waitIdle(t, gw)
	})
}
