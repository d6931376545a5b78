package live

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Server is the proxy. Create it with New, start its background work
// (scraping, health checks, discovery, KV events) with Run, and serve
// Handler to clients and AdminHandler to operators.
type Server struct {
	opts     Options
	models   []*model
	byName   map[string]*model // names and aliases
	aliases  map[string]bool
	upstream *http.Client
	tok      *tokPool
	met      *metrics
	declog   *decisionLog
	boot     int64
	reqSeq   atomic.Uint64
	start    time.Time

	bgMu sync.Mutex
	bg   *background

	closeOnce sync.Once
}

// New validates opts and builds the proxy; nothing runs until Run.
func New(opts Options) (*Server, error) {
	if err := opts.validate(); err != nil {
		return nil, fmt.Errorf("live: %w", err)
	}
	s := &Server{
		opts: opts, byName: map[string]*model{}, aliases: map[string]bool{},
		boot: time.Now().UnixNano(), start: time.Now(),
	}
	for _, mo := range opts.Models {
		m, err := newModel(mo, &s.opts, s.start)
		if err != nil {
			return nil, fmt.Errorf("live: %w", err)
		}
		s.models = append(s.models, m)
		s.byName[mo.Name] = m
		for _, a := range mo.Aliases {
			s.byName[a] = m
			s.aliases[a] = true
		}
	}
	tr := opts.Transport
	if tr == nil {
		tr = &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        0,
			MaxIdleConnsPerHost: 1024,
			// Below the 5 s keep-alive of the engines' HTTP servers, so the
			// proxy does not reuse a connection the engine is closing.
			IdleConnTimeout:    4 * time.Second,
			DisableCompression: true,
		}
	}
	s.upstream = &http.Client{Transport: tr}
	s.tok = newTokPool(opts.Tokenize)
	s.met = newMetrics(s)
	s.declog = newDecisionLog(opts.DecisionLog, opts.DecisionLogSample, opts.DecisionLogBuffer, s.met.logDropped.Inc)
	return s, nil
}

// lookup resolves a model name or alias; "" is the only model when there is
// one.
func (s *Server) lookup(name string) (*model, bool) {
	if name == "" {
		if len(s.models) == 1 {
			return s.models[0], false
		}
		return nil, false
	}
	return s.byName[name], s.aliases[name]
}

func (s *Server) newRequestID() string {
	return strconv.FormatInt(s.boot, 36) + "-" + strconv.FormatUint(s.reqSeq.Add(1), 36)
}

// Handler is the client-facing API: the two generation endpoints proxied,
// /v1/models and /health answered locally, anything else 404 (405 for a
// known path with the wrong method) in OpenAI's error shape.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", s.handleGenerate)
	mux.HandleFunc("POST /v1/chat/completions", s.handleGenerate)
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("GET /health", s.handleHealth)
	allowed := map[string]string{"/v1/completions": "POST", "/v1/chat/completions": "POST", "/v1/models": "GET", "/health": "GET"}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if m, ok := allowed[r.URL.Path]; ok {
			w.Header().Set("Allow", m)
			writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", fmt.Sprintf("%s %s: use %s", r.Method, r.URL.Path, m))
			return
		}
		writeError(w, http.StatusNotFound, "invalid_request_error", "not_found", fmt.Sprintf("unknown path %s: this gateway serves /v1/completions, /v1/chat/completions, /v1/models and /health", r.URL.Path))
	})
	return mux
}

// AdminHandler serves the gateway's metrics (/metrics), its view of the
// replicas (/replicas, JSON) and Go's profiles (/debug/pprof/).
func (s *Server) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.met.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /replicas", s.handleReplicas)
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	type card struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
		Root    string `json:"root"`
	}
	out := struct {
		Object string `json:"object"`
		Data   []card `json:"data"`
	}{Object: "list", Data: []card{}}
	for _, m := range s.models {
		for _, n := range append([]string{m.name}, m.opts.Aliases...) {
			out.Data = append(out.Data, card{ID: n, Object: "model", Created: s.start.Unix(), OwnedBy: "inferrail", Root: m.name})
		}
	}
	b, _ := json.Marshal(out)
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

// handleHealth is 200 while every model has a replica taking requests.
func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	now := time.Now()
	for _, m := range s.models {
		m.mu.Lock()
		ok := false
		for _, r := range m.reps {
			ok = ok || r.healthy(now)
		}
		m.mu.Unlock()
		if !ok {
			writeError(w, http.StatusServiceUnavailable, "service_unavailable", "no_healthy_replica", "model "+m.name+" has no healthy replica")
			return
		}
	}
	w.WriteHeader(http.StatusOK)
}

type replicaView struct {
	Model        string  `json:"model"`
	Replica      string  `json:"replica"`
	URL          string  `json:"url"`
	Healthy      bool    `json:"healthy"`
	InFlight     int     `json:"in_flight"`
	Pending      int     `json:"pending"`
	Failures     int     `json:"consecutive_failures"`
	Ejections    int     `json:"ejections"`
	EjectedUntil string  `json:"ejected_until,omitempty"`
	Running      int     `json:"engine_running"`
	Waiting      int     `json:"engine_waiting"`
	KVUsage      float64 `json:"engine_kv_usage"`
	ReportAgeS   float64 `json:"report_age_s"`
	IndexBlocks  int     `json:"index_blocks"`
}

func (s *Server) replicaViews() []replicaView {
	now := time.Now()
	var out []replicaView
	for _, m := range s.models {
		m.mu.Lock()
		for _, r := range m.reps {
			if r.gone {
				continue
			}
			v := replicaView{
				Model: m.name, Replica: r.name, URL: r.base.String(), Healthy: r.healthy(now),
				InFlight: r.load.InFlight, Pending: r.load.Pending, Failures: r.failures, Ejections: r.ejections,
				Running: r.engine.Running, Waiting: r.engine.Waiting, KVUsage: r.engine.KVCacheUsage, ReportAgeS: -1,
				IndexBlocks: m.rt.Index().Blocks(r.idx),
			}
			if now.Before(r.ejectedUntil) {
				v.EjectedUntil = r.ejectedUntil.UTC().Format(time.RFC3339Nano)
			}
			if !r.engineAt.IsZero() {
				v.ReportAgeS = now.Sub(r.engineAt).Seconds()
			}
			out = append(out, v)
		}
		m.mu.Unlock()
	}
	return out
}

func (s *Server) handleReplicas(w http.ResponseWriter, _ *http.Request) {
	b, _ := json.MarshalIndent(s.replicaViews(), "", "  ")
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

// Close stops the tokenizer pool and the decision log; call it after the
// HTTP servers have shut down and Run has returned.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		if s.declog != nil {
			s.declog.close()
		}
		s.upstream.CloseIdleConnections()
	})
}
