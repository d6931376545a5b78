package calibrate

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/inferrail/inferrail/internal/pipenet"
	"hash/fnv"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/internal/openai"
)

// fakeServer is a minimal OpenAI-compatible server over the engine model on
// real (or, inside a synctest bubble, fake) time: one goroutine owns the
// engine, handlers talk to it over channels. Prompts are space-separated
// words, one token each.
type fakeServer struct {
	cfg      engine.Config
	start    time.Time
	addc     chan *fakeReq
	resetc   chan chan bool
	running  atomic.Int64
	waiting  atomic.Int64
	nextID   atomic.Uint64
	noCached bool          // leave usage.prompt_tokens_details out
	overhead time.Duration // delay before a request reaches the engine
	// finishOnly ends every stream as llm-d-inference-sim does: a chunk of
	// its own with the finish reason and empty text.
	finishOnly bool
	// perChunk puts this many tokens in a chunk (vLLM's --stream-interval);
	// 0 means 1.
	perChunk int
	// mergeNext: while above 0, a stream of two tokens or more sends its
	// first two in one chunk and takes one off it (tokens merged now and
	// then, as a server does while a busy client has not read them).
	mergeNext atomic.Int64
	// failAfter writes vLLM's error event after this many tokens (0: never).
	failAfter int
	// noUsage leaves the usage chunk out (a server that ignores
	// stream_options.include_usage).
	noUsage bool
	maxLen  int
	// holdAfterDone keeps each stream open this long after data: [DONE]
	// before its end, or until the client goes (0: ends at once, in a write
	// of its own, as vLLM's server does).
	holdAfterDone time.Duration
	// dials counts the connections clients made to the server.
	dials  atomic.Int64
	salt   kvblock.Hash
	cancel context.CancelFunc
	done   chan struct{}
}

type fakeReq struct {
	req    engine.Request
	out    chan engine.Emission
	cached int
}

func newFakeServer(cfg engine.Config) (*fakeServer, error) {
	if _, err := engine.New(cfg); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &fakeServer{cfg: cfg, start: time.Now(), addc: make(chan *fakeReq), resetc: make(chan chan bool), maxLen: cfg.MaxModelLen,
		salt: kvblock.Salt("fake", "", ""), cancel: cancel, done: make(chan struct{})}
	e, _ := engine.New(cfg)
	go f.loop(ctx, e)
	return f, nil
}

func (f *fakeServer) close() { f.cancel(); <-f.done }

func (f *fakeServer) loop(ctx context.Context, e *engine.Engine) {
	defer close(f.done)
	reqs := map[engine.RequestID]*fakeReq{}
	add := func(r *fakeReq) {
		if err := e.Add(time.Since(f.start), r.req); err != nil {
			close(r.out)
			return
		}
		reqs[r.req.ID] = r
	}
	for {
		_, busy := e.NextStep()
		if !busy {
			select {
			case <-ctx.Done():
				return
			case r := <-f.addc:
				add(r)
			case c := <-f.resetc:
				ok, _ := e.ResetPrefixCache()
				c <- ok
			}
			continue
		}
	drain:
		for {
			select {
			case r := <-f.addc:
				add(r)
			case c := <-f.resetc:
				ok, _ := e.ResetPrefixCache()
				c <- ok
			default:
				break drain
			}
		}
		res := e.Step(time.Since(f.start))
		if d := res.End() - time.Since(f.start); d > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
		}
		for _, em := range res.Emitted {
			r := reqs[em.ID]
			if em.Output == 1 {
				r.cached = em.CachedTokens
			}
			r.out <- em
			if em.Finished {
				close(r.out)
				delete(reqs, em.ID)
			}
		}
		m := e.Metrics()
		f.running.Store(int64(m.Running))
		f.waiting.Store(int64(m.Waiting))
	}
}

func (f *fakeServer) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, `{"object":"list","data":[{"id":"fake","object":"model","max_model_len":%d}]}`, f.maxLen)
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "# HELP vllm:num_requests_running x\nvllm:num_requests_running{model_name=\"fake\"} %d\nvllm:num_requests_waiting{model_name=\"fake\"} %d\n", f.running.Load(), f.waiting.Load())
		fmt.Fprintf(w, "vllm:cache_config_info{block_size=\"%d\",num_gpu_blocks=\"%d\"} 1.0\n", f.cfg.BlockSize, f.cfg.NumGPUBlocks)
	})
	mux.HandleFunc("POST /reset_prefix_cache", func(w http.ResponseWriter, _ *http.Request) {
		c := make(chan bool)
		f.resetc <- c
		<-c
	})
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Prompt    string `json:"prompt"`
			MaxTokens int    `json:"max_tokens"`
			Stream    bool   `json:"stream"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || !body.Stream {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		words := strings.Fields(body.Prompt)
		toks := make([]uint32, len(words))
		for i, wd := range words {
			h := fnv.New32a()
			h.Write([]byte(wd))
			toks[i] = h.Sum32()
		}
		fr := &fakeReq{out: make(chan engine.Emission, body.MaxTokens+1), req: engine.Request{
			ID: engine.RequestID(f.nextID.Add(1)), PromptTokens: len(toks), OutputTokens: body.MaxTokens,
			BlockHashes: kvblock.AppendHashes(nil, f.salt, toks, f.cfg.BlockSize),
		}}
		time.Sleep(f.overhead)
		f.addc <- fr
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		n := 0
		pending := 0
		merge := body.MaxTokens >= 2 && f.mergeNext.Add(-1) >= 0
		for range fr.out {
			n++
			if f.failAfter > 0 && n > f.failAfter {
				w.Write(openai.AppendErrorEvent(nil, "Internal server error", "InternalServerError", 500))
				fl.Flush()
				for range fr.out {
				}
				return
			}
			if pending++; pending < max(f.perChunk, 1) || merge && n == 1 {
				continue
			}
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\"%s\"}]}\n\n", strings.Repeat("tok ", pending))
			pending = 0
			fl.Flush()
		}
		if pending > 0 {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\"%s\"}]}\n\n", strings.Repeat("tok ", pending))
		}
		if f.finishOnly {
			fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-1\",\"created\":1,\"model\":\"fake\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"finish_reason\":\"stop\",\"text\":\"\"}]}\n\n")
		}
		details := fmt.Sprintf(`,"prompt_tokens_details":{"cached_tokens":%d}`, fr.cached)
		if f.noCached {
			details = ""
		}
		if !f.noUsage {
			fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d%s}}\n\n", len(toks), n, details)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
		fl.Flush()
		if f.holdAfterDone > 0 {
			select {
			case <-time.After(f.holdAfterDone):
			case <-r.Context().Done(): // the client gave up on the stream's end
			}
		}
	})
	return mux
}

// startFake serves f on an in-memory listener and returns a client for it;
// stop closes everything.
func startFake(f *fakeServer) (url string, client *http.Client, stop func()) {
	l := pipenet.Listen("engine")
	srv := httptest.NewUnstartedServer(f.handler())
	srv.Listener = l
	srv.Start()
	// Probe's own client, dialling the in-memory listener.
	client = probeClient(0)
	tr := client.Transport.(*http.Transport)
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		f.dials.Add(1)
		return l.Dial(ctx, network, addr)
	}
	return srv.URL, client, func() {
		tr.CloseIdleConnections()
		srv.Close()
		f.close()
	}
}
