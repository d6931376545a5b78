package server

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/engine/simtok"
)

type arrival struct {
	at     time.Duration
	prompt []uint32
	out    int
}

// predict runs the engine model on virtual time for the given arrivals, the
// way the server drives it (commands taken before a step starts, the next
// step at the end of the previous one), and returns each request's token
// times.
func predict(t *testing.T, cfg engine.Config, model string, arrs []arrival) [][]time.Duration {
	t.Helper()
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	salt := kvblock.Salt(model, "", "")
	times := make([][]time.Duration, len(arrs))
	add := func(i int) {
		a := arrs[i]
		// Hash only the prompt: generated blocks are unique per request here.
		hashes := kvblock.AppendHashes(nil, salt, a.prompt, cfg.BlockSize)
		if err := e.Add(a.at, engine.Request{ID: engine.RequestID(i + 1), PromptTokens: len(a.prompt), OutputTokens: a.out, MaxTokens: a.out, BlockHashes: hashes}); err != nil {
			t.Fatal(err)
		}
	}
	next := 0
	var now time.Duration
	for {
		if _, ok := e.NextStep(); ok {
			res := e.Step(now)
			end := res.End()
			for next < len(arrs) && arrs[next].at < end {
				add(next)
				next++
			}
			for _, em := range res.Emitted {
				times[em.ID-1] = append(times[em.ID-1], end)
			}
			now = end
			continue
		}
		if next == len(arrs) {
			return times
		}
		now = arrs[next].at
		for next < len(arrs) && arrs[next].at == now {
			add(next)
			next++
		}
	}
}

// Inside a synctest bubble the network costs no time, so the server's token
// times must equal the model's: single requests and small concurrent
// batches, with prefix sharing.
func TestTokenTimesMatchEngineModel(t *testing.T) {
	for _, tc := range []struct {
		name  string
		arrs  func(s *Server) []arrival
		batch bool
	}{
		{"single", func(s *Server) []arrival {
			return []arrival{{at: 0, prompt: s.tok.Encode(words(s, 100, 700)), out: 40}}
		}, false},
		{"concurrent", func(s *Server) []arrival {
			sys := words(s, 5000, 300)
			var arrs []arrival
			for i := range 6 {
				p := s.tok.Encode(sys + words(s, 9000+100*i, 20+7*i))
				arrs = append(arrs, arrival{at: time.Duration(i) * 3300 * time.Microsecond, prompt: p, out: 15 + 3*i})
			}
			return arrs
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := Config{Engine: testEngine()}
				ts := startPipe(t, cfg)
				defer ts.stop()
				t0 := time.Now()
				arrs := tc.arrs(ts.Server)
				got := make([][]time.Duration, len(arrs))
				var wg sync.WaitGroup
				for i, a := range arrs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						time.Sleep(a.at)
						resp, err := ts.post(context.Background(), "/v1/completions", map[string]any{
							"prompt": ts.tok.Decode(a.prompt), "max_tokens": a.out, "ignore_eos": true, "stream": true,
						})
						if err != nil {
							t.Error(err)
							return
						}
						defer resp.Body.Close()
						evs, err := readSSE(resp.Body)
						if err != nil {
							t.Error(err)
							return
						}
						for _, ev := range evs[:len(evs)-1] {
							got[i] = append(got[i], ev.at.Sub(t0))
						}
					}()
				}
				wg.Wait()
				want := predict(t, cfg.Engine, DefaultModelName, arrs)
				for i := range arrs {
					if len(got[i]) != len(want[i]) {
						t.Fatalf("request %d: %d token events, model says %d", i, len(got[i]), len(want[i]))
					}
					for k := range want[i] {
						if d := got[i][k] - want[i][k]; d < -2*time.Millisecond || d > 2*time.Millisecond {
							t.Fatalf("request %d token %d at %v, model says %v", i, k, got[i][k], want[i][k])
						}
					}
				}
			})
		})
	}
}

// A client that goes away frees its slot and blocks before the engine's
// next step ends, at any stage: waiting, prefilling, decoding.
func TestDisconnectAborts(t *testing.T) {
	for _, stage := range []time.Duration{time.Millisecond, 30 * time.Millisecond, 300 * time.Millisecond} {
		t.Run(stage.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ts := startPipe(t, Config{Engine: testEngine()})
				defer ts.stop()
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() {
					defer close(done)
					resp, err := ts.post(ctx, "/v1/completions", map[string]any{"prompt": words(ts.Server, 1, 3000), "max_tokens": 500, "stream": true, "ignore_eos": true})
					if err == nil {
						readSSE(resp.Body)
						resp.Body.Close()
					}
				}()
				time.Sleep(stage)
				if m := ts.met.snapshot.Load(); m.Running+m.Waiting != 1 {
					t.Fatalf("engine holds %d requests before the disconnect, want 1", m.Running+m.Waiting)
				}
				cancel()
				<-done
				synctest.Wait()
				m := ts.met.snapshot.Load()
				if m.Running+m.Waiting != 0 || m.UsedBlocks != 0 {
					t.Fatalf("after the disconnect the engine holds %d requests and %d blocks", m.Running+m.Waiting, m.UsedBlocks)
				}
				if m.RequestsAborted != 1 {
					t.Fatalf("aborted %d requests, want 1", m.RequestsAborted)
				}
			})
		})
	}
}

// Thousands of concurrent streams, a random share cut off at random points,
// leave nothing held in the engine and every other stream complete.
func TestManyStreamsWithDisconnects(t *testing.T) {
	n := 2000
	if testing.Short() {
		n = 300
	}
	synctest.Test(t, func(t *testing.T) {
		cfg := Config{Engine: testEngine()}
		cfg.Engine.NumGPUBlocks = 4096
		ts := startPipe(t, cfg)
		defer ts.stop()
		var mu sync.Mutex
		completed, cut := 0, 0
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				disconnect := i%2 == 1
				if disconnect {
					go func() {
						time.Sleep(time.Duration(i*7919%4000) * time.Millisecond / 10)
						cancel()
					}()
				}
				resp, err := ts.post(ctx, "/v1/completions", map[string]any{
					"prompt": words(ts.Server, i*13%30000, 20+i%50), "max_tokens": 10 + i%30, "ignore_eos": true, "stream": true,
				})
				if err != nil {
					if !disconnect {
						t.Error(err)
					}
					mu.Lock()
					cut++
					mu.Unlock()
					return
				}
				defer resp.Body.Close()
				evs, err := readSSE(resp.Body)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					completed++
				case disconnect:
					cut++
				default:
					t.Errorf("stream %d: %v", i, err)
				}
				_ = evs
			}()
		}
		wg.Wait()
		synctest.Wait()
		m := ts.met.snapshot.Load()
		if m.Running+m.Waiting != 0 || m.UsedBlocks != 0 {
			t.Fatalf("engine holds %d requests and %d blocks after every client left", m.Running+m.Waiting, m.UsedBlocks)
		}
		if completed+cut != n || completed < n/2 {
			t.Fatalf("%d completed, %d cut off, of %d", completed, cut, n)
		}
		t.Logf("%d streams: %d completed, %d cut off, %d aborted in the engine", n, completed, cut, m.RequestsAborted)
	})
}

func TestNonStreamingAndUsage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startPipe(t, Config{Engine: testEngine(), EnablePromptTokensDetails: true})
		defer ts.stop()
		prompt := words(ts.Server, 10, 64)
		var cached []int
		for range 2 {
			resp, err := ts.post(context.Background(), "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 8, "ignore_eos": true})
			if err != nil {
				t.Fatal(err)
			}
			var body completionResponse
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			u := body.Usage
			if u.PromptTokens != 64 || u.CompletionTokens != 8 || u.TotalTokens != 72 || u.PromptTokensDetails == nil {
				t.Fatalf("usage %+v", u)
			}
			if got := ts.tok.Encode(body.Choices[0].Text); len(got) != 8 {
				t.Fatalf("text %q is %d tokens, want 8", body.Choices[0].Text, len(got))
			}
			cached = append(cached, u.PromptTokensDetails.CachedTokens)
		}
		// The second identical prompt finds its blocks: all but the last
		// (recomputed) block's worth.
		if cached[0] != 0 || cached[1] != 48 {
			t.Fatalf("cached tokens %v, want [0 48]", cached)
		}
	})
}

// A follow-up turn that contains the first turn's answer reuses the blocks
// of prompt and answer: generated text retokenizes to the generated ids.
func TestMultiTurnReuse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startPipe(t, Config{Engine: testEngine(), EnablePromptTokensDetails: true})
		defer ts.stop()
		msgs := []map[string]any{{"role": "system", "content": words(ts.Server, 300, 100)}, {"role": "user", "content": words(ts.Server, 900, 30)}}
		chat := func() (string, int) {
			resp, err := ts.post(context.Background(), "/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 64, "ignore_eos": true})
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body chatResponse
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatal(err)
			}
			return body.Choices[0].Message.Content, body.Usage.PromptTokensDetails.CachedTokens
		}
		answer, _ := chat()
		first := len(ts.tok.Encode(mustRender(t, msgs)))
		msgs = append(msgs, map[string]any{"role": "assistant", "content": answer}, map[string]any{"role": "user", "content": words(ts.Server, 2000, 10)})
		_, cached := chat()
		// Everything up to the first turn's last full block is found,
		// including most of the generated answer.
		if min := (first + 64 - 16) / 16 * 16; cached < min {
			t.Fatalf("second turn found %d cached tokens, want at least %d", cached, min)
		}
	})
}

func mustRender(t *testing.T, msgs []map[string]any) string {
	t.Helper()
	b, _ := json.Marshal(msgs)
	var in []simtok.Message
	if err := json.Unmarshal(b, &in); err != nil {
		t.Fatal(err)
	}
	s, err := simtok.RenderChat(in, true, false)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
