package server

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/engine/simtok"
	"github.com/inferrail/inferrail/internal/seed"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

var (
	errShutdown = errors.New("engine shut down")
	errStuck    = errors.New("engine made no progress")
	// errShuttingDown refuses a request the engine goroutine can no longer
	// take.
	errShuttingDown = errors.New("the engine is shutting down")
)

// Server is a mock vLLM server. Create it with New, start its engine with
// Run, and serve Handler.
type Server struct {
	cfg  Config
	tok  *simtok.Tokenizer
	cmds chan command
	met  *metrics
	salt kvblock.Hash

	// held are a producer's finished prefills waiting for their remote
	// read; xfer is a consumer's client of producers' side channels
	// (kvtransfer.go).
	held heldTable
	xfer *http.Client
	// responses are the Responses API's stored responses (responses.go).
	responses responseStore

	running atomic.Bool
	done    chan struct{} // closed when Run returns
	nextID  atomic.Uint64

	rngMu sync.Mutex
	rng   *rand.Rand
}

// New validates cfg and returns a server whose engine is not yet running.
func New(cfg Config) (*Server, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("engine server: %w", err)
	}
	s := &Server{
		cfg:  cfg,
		tok:  simtok.New(),
		cmds: make(chan command, 1024),
		salt: kvblock.Salt(cfg.ServedModelNames[0], "", ""),
		done: make(chan struct{}),
		rng:  seed.Rand(cfg.Seed, "engine/server"),
	}
	s.cfg.KVTransfer.setDefaults(seed.Rand(cfg.Seed, "engine/server/kv_transfer"))
	if s.cfg.KVTransfer.consumes() {
		dial := cfg.TransferDial
		if dial == nil {
			d := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
			dial = d.DialContext
		}
		s.xfer = &http.Client{
			Transport: &http.Transport{DialContext: dial, MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second},
			// A side channel never redirects; a redirect is not followed.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	s.met = newMetrics(&s.cfg)
	return s, nil
}

// Run drives the engine on wall-clock time until ctx ends. It returns nil
// on cancellation; in-flight requests then fail.
func (s *Server) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("engine server: Run called twice")
	}
	defer close(s.done)
	ec := s.cfg.Engine
	if s.cfg.KVTransfer.consumes() {
		// A consumer follows its prefix cache through the engine's KV
		// events (loop.track); they reach a sink only when one is set.
		ec.EnableKVEvents = true
	}
	eng, err := engine.NewGroup(ec)
	if err != nil {
		return fmt.Errorf("engine server: %w", err)
	}
	l := &loop{
		s:         s,
		eng:       eng,
		start:     time.Now(),
		reqs:      make(map[engine.RequestID]*active),
		lastToken: make(map[engine.RequestID]time.Time),
	}
	if s.cfg.KVEvents != nil {
		l.blockTokens = make(map[kvblock.Hash]blockRef)
	}
	if s.cfg.KVTransfer.consumes() {
		l.cached = make(map[kvblock.Hash]int)
	}
	return l.run(ctx)
}

func (s *Server) publishSnapshot(g *engine.Group) { s.met.publish(g) }

// Handler returns the HTTP API.
// requireKey answers a request under /v1 that does not carry the API key
// (Authorization: Bearer) 401 as vLLM's AuthenticationMiddleware does.
func (s *Server) requireKey(next http.Handler) http.Handler {
	want := []byte("Bearer " + s.cfg.APIKey)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/") && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "Unauthorized"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", s.handleCompletions)
	mux.HandleFunc("POST /v1/chat/completions", s.handleChat)
	mux.HandleFunc("POST /v1/embeddings", s.handleEmbeddings)
	mux.HandleFunc("POST /v1/responses", s.handleResponses)
	mux.HandleFunc("GET /v1/responses/{id}", s.handleGetResponse)
	mux.HandleFunc("POST /v1/responses/{id}/cancel", s.handleCancelResponse)
	mux.HandleFunc("/v1/responses/{id}", onlyGet)
	for _, p := range []string{"/score", "/v1/score"} {
		mux.HandleFunc("POST "+p, s.handleScore)
	}
	for _, p := range []string{"/rerank", "/v1/rerank", "/v2/rerank"} {
		mux.HandleFunc("POST "+p, s.handleRerank)
	}
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"version": s.cfg.Version})
	})
	mux.HandleFunc("POST /reset_prefix_cache", s.handleReset)
	if s.cfg.KVTransfer.produces() {
		mux.HandleFunc("POST "+SideChannelPath, s.handleRead)
	}
	metricsHandler := promhttp.HandlerFor(s.met.reg, promhttp.HandlerOpts{})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.Faults.GarbageMetrics {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			fmt.Fprintf(w, "vllm:num_requests_running{{{ not a metric page %d\n\x00\xff garbage\n", s.draw(1000))
			return
		}
		metricsHandler.ServeHTTP(w, r)
	})
	// Unknown paths and wrong methods answer as vLLM's FastAPI app does.
	allowed := map[string]string{
		"/v1/completions": "POST", "/v1/chat/completions": "POST", "/v1/embeddings": "POST", "/v1/models": "GET", "/health": "GET",
		"/score": "POST", "/v1/score": "POST", "/rerank": "POST", "/v1/rerank": "POST", "/v2/rerank": "POST",
		"/version": "GET", "/reset_prefix_cache": "POST", "/metrics": "GET", "/v1/responses": "POST",
	}
	if s.cfg.KVTransfer.produces() {
		allowed[SideChannelPath] = "POST"
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if m, ok := allowed[r.URL.Path]; ok {
			w.Header().Set("Allow", m)
			writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed"})
			return
		}
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
	})
	if s.cfg.APIKey != "" {
		return s.requireKey(mux)
	}
	return mux
}

// draw returns a seeded random integer in [0, n).
func (s *Server) draw(n int) int {
	s.rngMu.Lock()
	defer s.rngMu.Unlock()
	return s.rng.IntN(n)
}

func (s *Server) drawFloat() float64 {
	s.rngMu.Lock()
	defer s.rngMu.Unlock()
	return s.rng.Float64()
}

// send hands a command to the engine goroutine, unless it has stopped.
func (s *Server) send(c command) bool {
	select {
	case s.cmds <- c:
		return true
	case <-s.done:
		return false
	}
}
