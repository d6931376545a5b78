package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/internal/pipenet"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestParseKVTransferConfig(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want KVTransfer
	}{
		{"", KVTransfer{}},
		{`{"kv_connector":"NixlConnector","kv_role":"kv_producer"}`, KVTransfer{Connector: ConnectorNixl, Role: RoleProducer}},
		{`{"kv_connector":"NixlConnector","kv_role":"kv_consumer","kv_load_failure_policy":"fail","engine_id":"d-1"}`,
			KVTransfer{Connector: ConnectorNixl, Role: RoleConsumer, LoadFailurePolicy: FailureFail, EngineID: "d-1"}},
		// vLLM's other fields are accepted (and, but for kv_ip/kv_port, ignored).
		{`{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_buffer_device":"cuda","kv_rank":0,"kv_parallel_size":2,
		   "kv_ip":"10.0.0.7","kv_port":5600,"kv_connector_extra_config":{"backends":["UCX"]},"enable_permute_local_kv":false}`,
			KVTransfer{Connector: ConnectorNixl, Role: RoleBoth, SideChannelHost: "10.0.0.7", SideChannelPort: 5600}},
	} {
		got, err := ParseKVTransferConfig(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("%s: got %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	for _, tc := range []struct{ in, msg string }{
		{`{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}`, `unknown kv_connector "LMCacheConnectorV1": the mock engine emulates NixlConnector only`},
		{`{"kv_connector":"NixlConnector","kv_role":"producer"}`, `unknown kv_role "producer": want one of kv_producer, kv_consumer, kv_both`},
		{`{"kv_connector":"NixlConnector"}`, "kv_role is required"},
		{`{"kv_role":"kv_producer"}`, "kv_connector is required"},
		{`{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_load_failure_policy":"retry"}`, `unknown kv_load_failure_policy "retry"`},
		{`{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_bogus":1}`, `unknown field "kv_bogus"`},
		{`{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_port":70000}`, "kv_port 70000"},
		{`{"kv_connector":"NixlConnector",`, "invalid JSON"},
		{`{"kv_connector":"NixlConnector","kv_role":"kv_both"} {}`, "more than one value"},
	} {
		_, err := ParseKVTransferConfig(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: got %v, want an error containing %q", tc.in, err, tc.msg)
		}
	}
	if _, err := New(Config{Engine: testEngine(), KVTransfer: KVTransfer{Connector: "X", Role: RoleBoth}}); err == nil || !strings.Contains(err.Error(), "kv transfer config: unknown kv_connector") {
		t.Errorf("New with a bad connector: %v", err)
	}
}

// pdPair is a producer and a consumer engine on one in-memory network.
type pdPair struct {
	net              *pipenet.Network
	client           *http.Client
	prefill, decode  *Server
	stopP, stopD     func()
	prefillURL, dURL string
}

func startOn(t *testing.T, pn *pipenet.Network, addr string, cfg Config) (*Server, func()) {
	t.Helper()
	cfg.TransferDial = pn.Dial
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ln := pn.Listen(addr)
	hs := &http.Server{Handler: s.Handler()}
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	go hs.Serve(ln)
	var stopped bool
	return s, func() {
		if stopped {
			return
		}
		stopped = true
		hs.Close()
		ln.Close()
		cancel()
		<-done
	}
}

// pdEngine is testEngine with a slow KV link, so transfers take
// measurable time: 1 GB/s and 1 ms base latency.
func pdEngine() engine.Config {
	c := testEngine()
	c.PDTransfer = engine.PDTransfer{BandwidthGBps: 1, BaseLatencyMs: 1}
	return c
}

func startPair(t *testing.T, dcfg Config) *pdPair {
	var pn pipenet.Network
	p := &pdPair{net: &pn, prefillURL: "http://prefill:8000", dURL: "http://decode:8000"}
	p.prefill, p.stopP = startOn(t, &pn, "prefill:8000", Config{Engine: pdEngine(), KVTransfer: KVTransfer{Connector: ConnectorNixl, Role: RoleProducer, EngineID: "prefill-engine"}})
	if dcfg.KVTransfer == (KVTransfer{}) {
		dcfg.KVTransfer = KVTransfer{Connector: ConnectorNixl, Role: RoleConsumer}
	}
	if dcfg.Engine.BlockSize == 0 {
		dcfg.Engine = pdEngine()
	}
	p.decode, p.stopD = startOn(t, &pn, "decode:8000", dcfg)
	tr := &http.Transport{DialContext: pn.Dial}
	p.client = &http.Client{Transport: tr}
	return p
}

func (p *pdPair) stop() {
	p.client.CloseIdleConnections()
	p.stopP()
	p.stopD()
	time.Sleep(time.Second)
}

func (p *pdPair) post(t *testing.T, ctx context.Context, url string, body map[string]any) (*http.Response, error) {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return p.client.Do(req)
}

// prefillOf sends the prefill request of prompt and returns its answer's
// kv_transfer_params.
func (p *pdPair) prefillOf(t *testing.T, prompt string) map[string]any {
	t.Helper()
	resp, err := p.post(t, context.Background(), p.prefillURL, map[string]any{
		"prompt": prompt, "max_tokens": 1, "stream": false,
		"kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		KV map[string]any `json:"kv_transfer_params"`
	}
	if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&out) != nil || out.KV == nil {
		t.Fatalf("prefill answered %d without kv_transfer_params", resp.StatusCode)
	}
	return out.KV
}

// decodeOf streams the decode of prompt with kv and returns its text, its
// time to first token and its status.
func (p *pdPair) decodeOf(t *testing.T, url, prompt string, kv map[string]any, out int) (string, time.Duration, int) {
	t.Helper()
	body := map[string]any{"prompt": prompt, "max_tokens": out, "ignore_eos": true, "stream": true}
	if kv != nil {
		body["kv_transfer_params"] = kv
	}
	began := time.Now()
	resp, err := p.post(t, context.Background(), url, body)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		io.Copy(io.Discard, resp.Body)
		return "", 0, resp.StatusCode
	}
	evs, err := readSSE(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for _, ev := range evs[:len(evs)-1] {
		var c completionChunk
		if err := json.Unmarshal([]byte(ev.data), &c); err != nil {
			t.Fatal(err)
		}
		text.WriteString(c.Choices[0].Text)
	}
	return text.String(), evs[0].at.Sub(began), 200
}

// The prefill answer carries kv_transfer_params as vLLM's NixlConnector
// writes them, field for field and in its order; without the producer role
// (or without a connector, or streaming) it carries null.
func TestPrefillAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := startPair(t, Config{})
		defer p.stop()
		prompt := words(p.prefill, 100, 70) // 70 tokens: 5 blocks of 16
		body := map[string]any{"prompt": prompt, "max_tokens": 1, "stream": false,
			"kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}}
		resp, err := p.post(t, context.Background(), p.prefillURL, body)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var top map[string]json.RawMessage
		if err := json.Unmarshal(raw, &top); err != nil {
			t.Fatal(err)
		}
		kv := string(top["kv_transfer_params"])
		var ids []int
		var params kvParamsOut
		json.Unmarshal(top["kv_transfer_params"], &params)
		ids = params.RemoteBlockIDs
		if len(ids) != 5 {
			t.Fatalf("remote_block_ids %v: want 5 blocks for 70 tokens", ids)
		}
		idsJSON, _ := json.Marshal(ids)
		want := `{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":` + string(idsJSON) +
			`,"remote_engine_id":"prefill-engine","remote_request_id":"` + params.RemoteRequestID + `","remote_host":"prefill","remote_port":8000,"tp_size":1}`
		if kv != want || !strings.HasPrefix(params.RemoteRequestID, "cmpl-") {
			t.Fatalf("kv_transfer_params\n got %s\nwant %s", kv, want)
		}
		// The same prompt prefix, the same block ids (the prefix cache's).
		again := p.prefillOf(t, prompt+" "+words(p.prefill, 900, 20))
		got := again["remote_block_ids"].([]any)
		for i := range 4 {
			if int(got[i].(float64)) != ids[i] {
				t.Fatalf("block %d of a prompt sharing 4 full blocks: id %v, first prompt's %d", i, got[i], ids[i])
			}
		}
		// A consumer does not produce; a stream carries no parameters.
		for _, tc := range []struct {
			url    string
			stream bool
		}{{p.dURL, false}, {p.prefillURL, true}} {
			b := map[string]any{"prompt": prompt, "max_tokens": 1, "kv_transfer_params": map[string]any{"do_remote_decode": true}, "stream": tc.stream}
			resp, err := p.post(t, context.Background(), tc.url, b)
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if bytes.Contains(raw, []byte(`"kv_transfer_params":{`)) || resp.StatusCode != 200 {
				t.Fatalf("%s stream=%v: %d %s", tc.url, tc.stream, resp.StatusCode, raw)
			}
		}
		// kv_transfer_params must be an object.
		resp, err = p.post(t, context.Background(), p.prefillURL, map[string]any{"prompt": prompt, "max_tokens": 1, "kv_transfer_params": "yes"})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Fatalf("kv_transfer_params a string: %d, want 400", resp.StatusCode)
		}
	})
}

// A decode of a remote prefill reads the KV, waits the profile's transfer
// time for the prompt's tokens it lacks, and emits its first token one
// step later; its answer is the aggregated one, token for token. The
// transfer is counted; a second read of the same blocks fails (each is
// read once) and falls back to a local prefill, counted as failed.
func TestRemotePrefillDecode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := startPair(t, Config{})
		defer p.stop()
		prompt := words(p.prefill, 100, 500)
		n := len(p.prefill.tok.Encode(prompt))
		kv := p.prefillOf(t, prompt)
		// A read that names other blocks fails and takes nothing.
		wrong := map[string]any{}
		for k, v := range kv {
			wrong[k] = v
		}
		ids := append([]any(nil), kv["remote_block_ids"].([]any)...)
		ids[1] = 12345.0
		wrong["remote_block_ids"] = ids
		if _, _, st := p.decodeOf(t, p.dURL, prompt+" x", wrong, 2); st != 200 {
			t.Fatalf("decode with other blocks: %d", st)
		}
		// The prefix the failed one computed locally stays cached: a
		// fresh engine's state is what the timing below assumes.
		if ok := p.decode.resetCache(t, p.client, p.dURL); !ok {
			t.Fatal("prefix cache not reset")
		}
		text, ttft, status := p.decodeOf(t, p.dURL, prompt, kv, 20)
		if status != 200 {
			t.Fatalf("decode: %d", status)
		}
		// The engine model's first step of a remote prefill, alone.
		ec := pdEngine()
		e, _ := engine.New(ec)
		hashes := kvblock.AppendHashes(nil, kvblock.Salt(DefaultModelName, "", ""), p.prefill.tok.Encode(prompt), ec.BlockSize)
		e.Add(0, engine.Request{ID: 1, PromptTokens: n, OutputTokens: 20, MaxTokens: 20, BlockHashes: hashes, RemotePrefill: true})
		step := e.Step(0).End()
		want := ec.TransferTime(n) + step
		if d := ttft - want; d < -time.Millisecond || d > time.Millisecond {
			t.Fatalf("TTFT %v, want transfer %v + one step %v = %v", ttft, ec.TransferTime(n), step, want)
		}
		// The aggregated answer: the same engine model and seed, no P/D.
		agg, _, _ := p.decodeOf(t, p.prefillURL, words(p.prefill, 100, 500), nil, 20)
		if text != agg || text == "" {
			t.Fatalf("decoded %q, aggregated %q", text, agg)
		}
		if c := testutil.ToFloat64(p.decode.met.xferFailed); c != 1 {
			t.Fatalf("%v failed transfers, want 1 (the read of other blocks)", c)
		}
		// The same parameters again: the blocks were read already, the
		// request prefills locally (from the blocks the first left cached).
		text2, _, _ := p.decodeOf(t, p.dURL, prompt, kv, 20)
		if text2 != text {
			t.Fatalf("a second read: %q, want %q", text2, text)
		}
		if c := testutil.ToFloat64(p.decode.met.xferFailed); c != 2 {
			t.Fatalf("%v failed transfers, want 2", c)
		}
		m := scrapeText(t, p.client, p.dURL)
		for _, want := range []string{`vllm:nixl_xfer_time_seconds_count{engine="0",model_name="inferrail-sim"} 1`, `vllm:nixl_num_failed_transfers_total{engine="0",model_name="inferrail-sim"} 2`,
			`vllm:nixl_bytes_transferred_count{engine="0",model_name="inferrail-sim"} 1`} {
			if !strings.Contains(m, want) {
				t.Errorf("/metrics lacks %s", want)
			}
		}
	})
}

// resetCache empties s's prefix cache (POST /reset_prefix_cache).
func (s *Server) resetCache(t *testing.T, c *http.Client, base string) bool {
	t.Helper()
	synctest.Wait()
	resp, err := c.Post(base+"/reset_prefix_cache", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode == 200
}

func scrapeText(t *testing.T, c *http.Client, base string) string {
	t.Helper()
	resp, err := c.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// Only the prompt's tokens the decode engine lacks move: a prompt whose
// prefix it holds transfers less.
func TestRemotePrefillMovesUncachedOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := startPair(t, Config{})
		defer p.stop()
		sys := words(p.prefill, 100, 480) // 30 blocks
		// The decode engine computes the shared prefix itself first.
		if _, _, st := p.decodeOf(t, p.dURL, sys, nil, 2); st != 200 {
			t.Fatal(st)
		}
		prompt := sys + " " + words(p.prefill, 5000, 40)
		kv := p.prefillOf(t, prompt)
		_, ttft, _ := p.decodeOf(t, p.dURL, prompt, kv, 5)
		pe := pdEngine()
		full := pe.TransferTime(len(p.prefill.tok.Encode(prompt)))
		if ttft >= full {
			t.Fatalf("TTFT %v with 480 of the prompt's tokens cached: not below the whole prompt's transfer %v", ttft, full)
		}
	})
}

// Remote parameters that cannot be used (malformed, naming an unknown
// engine, missing blocks, a producer that is gone) fail the transfer: the
// decode engine prefills locally (recompute) and the client gets the whole
// answer; with kv_load_failure_policy fail it gets a 500. Each is counted.
func TestRemotePrefillFallback(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(kv map[string]any, p *pdPair)
	}{
		{"malformed port", func(kv map[string]any, _ *pdPair) { kv["remote_port"] = "8000" }},
		{"missing request id", func(kv map[string]any, _ *pdPair) { delete(kv, "remote_request_id") }},
		{"unknown engine", func(kv map[string]any, _ *pdPair) { kv["remote_engine_id"] = "someone-else" }},
		{"missing blocks", func(kv map[string]any, _ *pdPair) { kv["remote_block_ids"] = kv["remote_block_ids"].([]any)[:3] }},
		{"other blocks", func(kv map[string]any, _ *pdPair) { kv["remote_block_ids"].([]any)[0] = 99999.0 }},
		{"no such host", func(kv map[string]any, _ *pdPair) { kv["remote_host"] = "nowhere" }},
		{"producer gone", func(_ map[string]any, p *pdPair) { p.stopP() }},
	}
	for _, policy := range []string{FailureRecompute, FailureFail} {
		for _, tc := range cases {
			t.Run(policy+"/"+tc.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					p := startPair(t, Config{KVTransfer: KVTransfer{Connector: ConnectorNixl, Role: RoleBoth, LoadFailurePolicy: policy}})
					defer p.stop()
					prompt := words(p.prefill, 100, 300)
					kv := p.prefillOf(t, prompt)
					tc.mutate(kv, p)
					text, _, status := p.decodeOf(t, p.dURL, prompt, kv, 8)
					want, _, _ := p.decodeOf(t, p.dURL, words(p.prefill, 100, 300), nil, 8)
					switch {
					case policy == FailureFail && status != 500:
						t.Fatalf("status %d, want 500", status)
					case policy == FailureRecompute && (status != 200 || text != want):
						t.Fatalf("status %d, text %q; want 200 and %q", status, text, want)
					}
					if c := testutil.ToFloat64(p.decode.met.xferFailed); c != 1 {
						t.Fatalf("%v failed transfers, want 1", c)
					}
				})
			})
		}
	}
}

// The transfer wait is bounded by the transfer timeout and ends with the
// client: a client that leaves while its KV moves leaves nothing in the
// engine.
func TestRemotePrefillBoundedAndCancellable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		slow := pdEngine()
		slow.PDTransfer = engine.PDTransfer{BandwidthGBps: 0.001, BaseLatencyMs: 1} // about 30 s for 240 tokens
		p := startPair(t, Config{Engine: slow, KVTransfer: KVTransfer{Connector: ConnectorNixl, Role: RoleConsumer, Timeout: 2 * time.Second}})
		defer p.stop()
		prompt := words(p.prefill, 100, 240)
		kv := p.prefillOf(t, prompt)
		began := time.Now()
		_, ttft, status := p.decodeOf(t, p.dURL, prompt, kv, 4)
		if status != 200 || ttft < 2*time.Second || ttft > 3*time.Second {
			t.Fatalf("status %d, TTFT %v: want 200 after the 2s timeout and a local prefill", status, ttft)
		}
		if c := testutil.ToFloat64(p.decode.met.xferFailed); c != 1 {
			t.Fatalf("%v failed transfers, want 1", c)
		}
		_ = began
		// A client that leaves during the wait.
		kv = p.prefillOf(t, prompt+" again")
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			resp, err := p.post(t, ctx, p.dURL, map[string]any{"prompt": prompt + " again", "max_tokens": 4, "stream": true, "kv_transfer_params": kv})
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
		time.Sleep(500 * time.Millisecond)
		cancel()
		<-done
		synctest.Wait()
		if m := p.decode.met.snapshot.Load(); m.Running+m.Waiting != 0 || m.UsedBlocks != 0 {
			t.Fatalf("the engine holds %d requests, %d blocks after the client left mid-transfer", m.Running+m.Waiting, m.UsedBlocks)
		}
		if c := testutil.ToFloat64(p.decode.met.xferFailed); c != 1 {
			t.Fatalf("%v failed transfers after a client left, want still 1", c)
		}
	})
}

// Without a connector kv_transfer_params are ignored, as vLLM ignores them.
func TestKVParamsIgnoredWithoutConnector(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startPipe(t, Config{Engine: testEngine()})
		defer ts.stop()
		resp, err := ts.post(context.Background(), "/v1/completions", map[string]any{"prompt": "a b c", "max_tokens": 1,
			"kv_transfer_params": map[string]any{"do_remote_decode": true}})
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !bytes.Contains(raw, []byte(`"kv_transfer_params":null`)) {
			t.Fatalf("%d %s", resp.StatusCode, raw)
		}
		resp, err = ts.post(context.Background(), SideChannelPath, map[string]any{})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 404 {
			t.Fatalf("side channel without a producer role: %d, want 404", resp.StatusCode)
		}
	})
}
