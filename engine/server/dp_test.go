package server

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/internal/timeheap"
)

// latencies are one request's TTFT and end-to-end latency.
type latencies struct{ ttft, e2e time.Duration }

// predictGroup runs an engine.Group on virtual time the way the server
// drives it (a request added when it arrives, each step when the group
// asks, tokens delivered at OutputAt) and returns each request's latencies.
// An arrival at the very time of a step or a delivery would make the
// server's order depend on goroutine scheduling: the arrivals must avoid
// them, and the test fails if they do not.
func predictGroup(t *testing.T, cfg engine.Config, model string, arrs []arrival) []latencies {
	t.Helper()
	g, err := engine.NewGroup(cfg)
	if err != nil {
		t.Fatal(err)
	}
	salt := kvblock.Salt(model, "", "")
	out := make([]latencies, len(arrs))
	var outs timeheap.Heap[[]engine.Emission]
	const never = time.Duration(1<<63 - 1)
	next := 0
	for {
		tArr, tStep, tOut := never, never, never
		if next < len(arrs) {
			tArr = arrs[next].at
		}
		if at, ok := g.NextStep(); ok {
			tStep = at
		}
		if it, ok := outs.Top(); ok {
			tOut = it.At
		}
		now := min(tArr, tStep, tOut)
		switch {
		case now == never:
			return out
		case tArr == now && (tStep == now || tOut == now):
			t.Fatalf("request %d arrives at %v, when a step or a delivery is due: move it", next, now)
		case tOut == now:
			it := outs.Pop()
			for _, em := range it.V {
				a := arrs[em.ID-1]
				if em.Output == 1 {
					out[em.ID-1].ttft = it.At - a.at
				}
				if em.Finished {
					out[em.ID-1].e2e = it.At - a.at
				}
			}
		case tStep == now:
			res := g.Step(now)
			if len(res.Emitted) > 0 {
				outs.Push(res.OutputAt, append([]engine.Emission(nil), res.Emitted...))
			}
		default:
			a := arrs[next]
			hashes := kvblock.AppendHashes(nil, salt, a.prompt, cfg.BlockSize) // generated blocks are never shared here
			req := engine.Request{ID: engine.RequestID(next + 1), PromptTokens: len(a.prompt), OutputTokens: a.out, MaxTokens: a.out, BlockHashes: hashes}
			if err := g.Add(a.at, req); err != nil {
				t.Fatal(err)
			}
			next++
		}
	}
}

// The must-show: a DP=2 mock engine (the server `inferrail engine`
// runs) and the simulated DP group give every request the same TTFT and
// end-to-end latency on virtual time, to the nanosecond, with independent
// ranks, with lockstep ranks, and with output lag.
func TestDataParallelServerMatchesGroup(t *testing.T) {
	for _, tc := range []struct {
		name     string
		ranks    int
		ep       bool
		lag, del float64
	}{
		{"dp2", 2, false, 0, 0},
		{"dp2-lag", 2, false, 1, 2},
		{"dp2-ep", 2, true, 0, 0},
		{"dp3-ep-lag", 3, true, 0.5, 1.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := Config{Engine: testEngine()}
				cfg.Engine.DataParallelSize = tc.ranks
				cfg.Engine.ExpertParallel = tc.ep
				cfg.Engine.Latency.OutputLagSteps = tc.lag
				cfg.Engine.Latency.OutputDelayMs = tc.del
				ts := startPipe(t, cfg)
				defer ts.stop()
				t0 := time.Now()
				// 30 requests over 0.6 s (six load-balancer refreshes), some
				// sharing a system prompt, at odd times.
				sys := words(ts.Server, 5000, 200)
				var arrs []arrival
				for i := range 30 {
					text := words(ts.Server, 9000+97*i, 10+37*i%300)
					if i%3 != 0 {
						text = sys + text
					}
					at := time.Duration(i)*19*time.Millisecond + time.Duration(i*i%11)*time.Millisecond + 12345*time.Nanosecond
					arrs = append(arrs, arrival{at: at, prompt: ts.tok.Encode(text), out: 4 + i*7%40})
				}
				want := predictGroup(t, cfg.Engine, DefaultModelName, arrs)
				got := make([]latencies, len(arrs))
				var wg sync.WaitGroup
				for i, a := range arrs {
					wg.Go(func() {
						time.Sleep(a.at)
						sent := time.Now()
						resp, err := ts.post(context.Background(), "/v1/completions", map[string]any{
							"prompt": ts.tok.Decode(a.prompt), "max_tokens": a.out, "ignore_eos": true, "stream": true,
						})
						if err != nil {
							t.Error(err)
							return
						}
						defer resp.Body.Close()
						evs, err := readSSE(resp.Body)
						if err != nil || len(evs) < 2 {
							t.Errorf("request %d: %d events, %v", i, len(evs), err)
							return
						}
						got[i] = latencies{ttft: evs[0].at.Sub(sent), e2e: evs[len(evs)-2].at.Sub(sent)}
						if sent.Sub(t0) != a.at {
							t.Errorf("request %d sent at %v, want %v", i, sent.Sub(t0), a.at)
						}
					})
				}
				wg.Wait()
				for i := range arrs {
					if got[i] != want[i] {
						t.Errorf("request %d: server TTFT %v E2E %v, group %v %v", i, got[i].ttft, got[i].e2e, want[i].ttft, want[i].e2e)
					}
				}
				if t.Failed() {
					return
				}
				// Both ranks served, and /metrics shows one series per rank.
				m := ts.met.snapshot.Load()
				ranks := *ts.met.ranks.Load()
				page := scrape(t, ts)
				for r, rm := range ranks {
					if rm.RequestsFinished == 0 {
						t.Errorf("rank %d served nothing: the test does not exercise the balancer", r)
					}
					for _, series := range []string{"vllm:num_requests_running", "vllm:prefix_cache_queries_total", "vllm:cache_config_info", "vllm:time_to_first_token_seconds_count"} {
						if !strings.Contains(page, series+"{") || !strings.Contains(page, `engine="`+string(rune('0'+r))+`"`) {
							t.Errorf("page lacks %s for engine %d", series, r)
						}
					}
				}
				if m.RequestsFinished != int64(len(arrs)) || m.NumGPUBlocks != tc.ranks*cfg.Engine.NumGPUBlocks {
					t.Errorf("group metrics %+v", m)
				}
			})
		})
	}
}

func scrape(t *testing.T, ts *testServer) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, ts.base+"/metrics", nil)
	resp, err := ts.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Output lag on the server: a lone request's first token comes a prefill
// step after the prefill ends plus the output delay, while the engine
// moves on at the step's end.
func TestServerOutputLag(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := Config{Engine: testEngine()}
		cfg.Engine.Latency.OutputLagSteps = 1
		cfg.Engine.Latency.OutputDelayMs = 2
		ts := startPipe(t, cfg)
		defer ts.stop()
		prompt := ts.tok.Encode(words(ts.Server, 100, 100))
		p := cfg.Engine.Latency.PrefillTime(len(prompt), 0)
		d2 := cfg.Engine.Latency.StepTime(engine.Batch{DecodeSeqs: 1, DecodeCtxTokens: int64(len(prompt) + 1)})
		start := time.Now()
		resp, err := ts.post(context.Background(), "/v1/completions", map[string]any{"prompt": ts.tok.Decode(prompt), "max_tokens": 2, "ignore_eos": true, "stream": true})
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		evs, err := readSSE(resp.Body)
		if err != nil || len(evs) != 3 {
			t.Fatalf("%d events, %v", len(evs), err)
		}
		if got, want := evs[0].at.Sub(start), 2*p+2*time.Millisecond; got != want {
			t.Fatalf("TTFT %v, want prefill %v twice + 2 ms = %v", got, p, want)
		}
		if got, want := evs[1].at.Sub(start), max(p+d2+d2, 2*p)+2*time.Millisecond; got != want {
			t.Fatalf("E2E %v, want %v", got, want)
		}
	})
}

// An engine with a CPU tier shows the tier's hits and blocks on /metrics;
// one without shows neither.
func TestTierMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := Config{Engine: testEngine()}
		cfg.Engine.KVTiers.CPUBlocks, cfg.Engine.KVTiers.CPULink = 64, "pcie-gen5"
		ts := startPipe(t, cfg)
		defer ts.stop()
		body := scrape(t, ts)
		for _, want := range []string{`inferrail_engine_kv_tier_hit_tokens_total{engine="0",medium="CPU",`, `inferrail_engine_kv_tier_blocks{engine="0",medium="CPU",`} {
			if !strings.Contains(body, want) {
				t.Errorf("/metrics lacks %s", want)
			}
		}
		if strings.Contains(body, `medium="DISK"`) {
			t.Error("/metrics shows a disk tier the engine does not have")
		}
		plain := startPipe(t, Config{Engine: testEngine()})
		defer plain.stop()
		if strings.Contains(scrape(t, plain), "kv_tier") {
			t.Error("an engine without tiers shows tier series")
		}
	})
}
