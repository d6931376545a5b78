package fleet

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/engine/simtok"
	"github.com/inferrail/inferrail/internal/pipenet"
	"github.com/inferrail/inferrail/workload"
)

// streamTimes posts one streaming completion and returns when its first
// and its last token arrived, after sent.
func streamTimes(client *http.Client, prompt string, out int) (ttft, e2e time.Duration, err error) {
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": out, "ignore_eos": true, "stream": true})
	sent := time.Now()
	resp, err := client.Post("http://engine/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			return ttft, e2e, nil
		}
		if ttft == 0 {
			ttft = time.Since(sent)
		}
		e2e = time.Since(sent)
	}
	return ttft, e2e, sc.Err()
}

// The must-show, end to end: the mock engine server (what
// `inferrail engine --data-parallel-size 2` runs) on synctest's virtual
// clock and the simulator's DP replica give each request of one sequence
// the same TTFT and E2E, to the nanosecond, with and without lockstep and
// output lag.
func TestSimMatchesMockServerDataParallel(t *testing.T) {
	for _, tc := range []struct {
		name     string
		ep       bool
		lag, del float64
	}{
		{"dp2", false, 0, 0},
		{"dp2-ep-lag", true, 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ecfg := engine.DefaultConfig()
			ecfg.NumGPUBlocks = 512
			ecfg.MaxModelLen = 4096
			ecfg.DataParallelSize = 2
			ecfg.ExpertParallel = tc.ep
			ecfg.Latency.OutputLagSteps = tc.lag
			ecfg.Latency.OutputDelayMs = tc.del
			tok := simtok.New()
			words := func(first, n int) string {
				ids := make([]uint32, n)
				for i := range ids {
					ids[i] = uint32(first + i)
				}
				return tok.Decode(ids)
			}
			// The same sequence both ways: a shared 200-token system prompt
			// on two of three requests, then a prompt of its own.
			type spec struct {
				at          time.Duration
				shared      bool
				own, output int
			}
			var specs []spec
			for i := range 24 {
				specs = append(specs, spec{
					at:     time.Duration(i)*23*time.Millisecond + time.Duration(i*i%13)*time.Millisecond + 54321*time.Nanosecond,
					shared: i%3 != 0, own: 10 + 41*i%250, output: 3 + 11*i%35,
				})
			}
			model := server.DefaultModelName
			var reqs []*workload.Request
			for i, sp := range specs {
				id := uint64(i + 1)
				var prompt []kvblock.Segment
				if sp.shared {
					prompt = append(prompt, kvblock.Segment{ID: 7, Len: 200})
				}
				prompt = append(prompt, kvblock.Segment{ID: 100 + id, Len: sp.own})
				reqs = append(reqs, &workload.Request{ID: id, Arrival: sp.at, Model: model, Prompt: prompt,
					MaxTokens: sp.output, OutputTokens: sp.output, Output: kvblock.Segment{ID: 1<<40 + id, Len: sp.output}})
			}
			c := listConfig(ecfg, reqs...)
			c.Workload.Model = model
			out := simulateAll(t, c)

			synctest.Test(t, func(t *testing.T) {
				s, err := server.New(server.Config{Engine: ecfg})
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				ln := pipenet.Listen("engine")
				hs := &http.Server{Handler: s.Handler()}
				done := make(chan struct{})
				go func() { s.Run(ctx); close(done) }()
				go hs.Serve(ln)
				tr := &http.Transport{DialContext: ln.Dial, MaxIdleConnsPerHost: 64}
				client := &http.Client{Transport: tr}
				defer func() {
					tr.CloseIdleConnections()
					hs.Close()
					ln.Close()
					cancel()
					<-done
					time.Sleep(time.Second)
				}()
				sys := words(5000, 200)
				var wg sync.WaitGroup
				for i, sp := range specs {
					text := words(9000+300*i, sp.own)
					if sp.shared {
						text = sys + text
					}
					wg.Go(func() {
						time.Sleep(sp.at)
						ttft, e2e, err := streamTimes(client, text, sp.output)
						if err != nil {
							t.Error(err)
							return
						}
						r := out.Records[i]
						if ttft != r.FirstToken-r.Arrival || e2e != r.End-r.Arrival {
							t.Errorf("request %d: server TTFT %v E2E %v, simulator %v %v", i+1, ttft, e2e, r.FirstToken-r.Arrival, r.End-r.Arrival)
						}
					})
				}
				wg.Wait()
			})
			if out.Summary.HitRate == 0 {
				t.Fatal("no prefix hits: the sequence does not exercise the caches")
			}
		})
	}
}
