package remote

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
	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/internal/pipenet"
)

// The mock engine with data_parallel_size 2 serves one series per rank
// (label engine, as vLLM does); the parser reads the page as one replica:
// counts and KV capacity summed over both ranks.
func TestParseMockEngineDataParallel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := engine.DefaultConfig()
		cfg.DataParallelSize = 2
		s, err := server.New(server.Config{Engine: cfg, ServedModelNames: []string{"mock-8b"}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { s.Run(ctx); close(done) }()
		defer func() { cancel(); <-done }()
		ln := pipenet.Listen("engine")
		hs := &http.Server{Handler: s.Handler()}
		go hs.Serve(ln)
		tr := &http.Transport{DialContext: ln.Dial}
		client := &http.Client{Transport: tr}
		// Three long requests: the balancer puts two on rank 0, one on rank 1.
		for i := range 3 {
			body, _ := json.Marshal(map[string]any{"prompt": strings.Repeat("w"+string(rune('a'+i))+" ", 300), "max_tokens": 1000, "ignore_eos": true, "stream": true})
			go func() {
				resp, err := client.Post("http://engine/v1/completions", "application/json", bytes.NewReader(body))
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
		}
		time.Sleep(200 * time.Millisecond)
		resp, err := client.Get("http://engine/metrics")
		if err != nil {
			t.Fatal(err)
		}
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, line := range []string{
			`vllm:num_requests_running{engine="0",model_name="mock-8b"} 2`,
			`vllm:num_requests_running{engine="1",model_name="mock-8b"} 1`,
			`vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="1",num_gpu_blocks="4096"} 1`,
		} {
			if !bytes.Contains(page, []byte(line)) {
				t.Errorf("page lacks %s:\n%s", line, page)
			}
		}
		got, err := ParseMetrics(bytes.NewReader(page), resp.Header.Get("Content-Type"))
		if err != nil {
			t.Fatal(err)
		}
		if got.Ranks != 2 || got.Running != 3 || got.Waiting != 0 || got.NumGPUBlocks != 2*cfg.NumGPUBlocks ||
			got.KVTokens != int64(2*cfg.NumGPUBlocks*cfg.BlockSize) || got.Model != "mock-8b" || got.KVUsage <= 0 {
			t.Errorf("parsed %+v, want 2 ranks, 3 running, %d blocks", got, 2*cfg.NumGPUBlocks)
		}
		tr.CloseIdleConnections()
		hs.Close()
		ln.Close()
		cancel()
		<-done
		time.Sleep(time.Second) // net/http's lingering connections: no real time in the bubble
	})
}
