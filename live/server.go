package live

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/inferrail/inferrail/router/gateway"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/inferrail/inferrail/calibrate"
	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/router/tokenize"
	"github.com/inferrail/inferrail/tenancy"
)

// Server is the proxy. Create it with New, start its background work
// (scraping, health checks, discovery, KV events) with Run, and serve
// Handler to clients and AdminHandler to operators.
type Server struct {
	// cfg is the configuration the server started with; what a reload
	// changes is in rl (reload.go).
	cfg config.Config
	// objectives are the InferencePool's InferenceObjectives, for the
	// endpoint picker (epp_objectives.go).
	objectives objectives
	models     []*model
	// routes resolves model names and aliases (a reload swaps it).
	routes   atomic.Pointer[routeTable]
	upstream *http.Client
	// homes are the replicas that answered the Responses API's responses
	// (responses.go).
	homes homes
	// loc finds the replica of a stored response homes does not know
	// (locate.go); shared is homes shared through tenancy.redis (nil
	// without it).
	loc    locator
	shared *sharedHomes
	// bgSlots bounds the background responses in flight, each watched
	// (max_background_responses; bgwatch.go).
	bgSlots chan struct{}
	// bgWatched are the background responses watched now, by id, for
	// GET /admin/background.
	watchMu   sync.Mutex
	bgWatched map[string]*bgEntry
	// h1 carries proxied requests to http:// engines (nil when Deps gave
	// a transport: every request then goes through it).
	h1  *h1Client
	tok *tokPool
	// contextRetry is contextLenRetry (maxlen.go); tests shorten it.
	contextRetry time.Duration
	met          *metrics
	ledgers      *sharedLedgers // nil: each core's ledger is its own
	tr           *tracer        // nil: tracing is off
	declog       *decisionLog
	logFile      io.Closer // the decision log's file, when New opened it
	resolver     Resolver
	boot         int64
	idPrefix     string // the boot time in base 36 and "-": request ids
	version      string
	reqSeq       atomic.Uint64
	start        time.Time
	log          *slog.Logger
	// accessSeq numbers the requests the access log samples from.
	accessSeq atomic.Uint64
	// bodies bounds the request bodies held at once.
	bodies *bodyBudget
	// draining fails readiness once shutdown has begun.
	draining atomic.Bool
	// standby fails readiness while another endpoint picker holds the
	// lease (epp.leader_election; epp_leader.go).
	standby atomic.Bool
	// addrMu guards the addresses Serve listens on.
	addrMu                sync.Mutex
	clientAddr, adminAddr net.Addr
	// rl reloads the configuration and holds what it loaded (the admin
	// token, the hash of the file) (reload.go).
	rl reloader

	bgMu sync.Mutex
	bg   *background

	// ten is API keys, rate limits and usage metering (tenancy.go); nil
	// when tenancy is off.
	ten *tenants

	// rec writes the recording (record.go); nil when it is off.
	rec *trafficRecorder

	// caches are the models' response caches (cache.go); nil when no
	// model has one.
	caches *caches

	// stop ends the models' deadline goroutines (wg).
	stop chan struct{}
	wg   sync.WaitGroup

	closeOnce sync.Once
}

// Deps is what a Server needs beyond its configuration: what cannot be
// written in YAML. Every field is optional.
type Deps struct {
	// Transport carries every request to the engines (proxied requests,
	// scrapes, probes); nil: a pooled keep-alive transport.
	Transport http.RoundTripper
	// Resolver resolves DNS groups; nil: net.DefaultResolver.
	Resolver Resolver
	// DecisionLog receives the sampled decisions (decision_log.sample and
	// .buffer apply); nil: the file at decision_log.path, which New opens
	// for appending and Close closes, or no log when the path is "".
	DecisionLog DecisionSink
	// Encoders are tokenizers already loaded, by model name (a nil entry:
	// no edge tokenization, no predictions); a model not in the map gets
	// its tokenizer setting loaded.
	Encoders map[string]Encoder
	// Notes receives startup notes, one line each, such as replicas that
	// kv admission cannot weigh until their first scrape; nil: discarded.
	Notes io.Writer
	// Trace, when set, receives every call into each model's gateway core
	// (gateway.Config.Trace), under the model's lock: a recording of the
	// gateway's decisions.
	Trace func(model string, ev gateway.TraceEvent)
	// Version is the build's version, for inferrail_build_info; "" is
	// "dev".
	Version string
	// Store, when set, holds API keys and usage instead of the store
	// tenancy.store names (which New then does not open); the caller
	// closes it after Close.
	Store tenancy.Store
	// Logger receives the process log: state changes (ejections,
	// readmissions, scrapes failing and recovering, KV index resets) once
	// per change, and the access log; nil: discarded.
	Logger *slog.Logger
	// ConfigPath is the file the configuration was loaded from: Reload
	// and WatchConfig read it again (reload.go); "" when it was not read
	// from a file (Reload then fails).
	ConfigPath string
}

// New validates cfg (config.Validate), loads what it names (tokenizers,
// profiles, the decision log's file) once, and builds the proxy: one
// gateway core per model. Nothing is proxied or scraped until Handler is
// served and Run is called; each model's deadline goroutine (queue
// timeouts) runs until Close.
func New(cfg *config.Config, deps Deps) (*Server, error) {
	if cfg == nil {
		return nil, errors.New("live: no configuration")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("live: %w", err)
	}
	s := &Server{
		cfg: *cfg, resolver: deps.Resolver,
		boot: time.Now().UnixNano(), start: time.Now(), stop: make(chan struct{}), log: deps.Logger,
		bgSlots:   make(chan struct{}, max(cfg.MaxBackgroundResponses, 1)),
		bgWatched: make(map[string]*bgEntry),
		bodies:    &bodyBudget{max: int64(cfg.MaxInflightBodyBytes)}, version: deps.Version,
		contextRetry: contextLenRetry,
	}
	if s.version == "" {
		s.version = "dev"
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	adminToken := ""
	if cfg.AdminTokenFile != "" {
		tok, err := config.ReadToken(cfg.AdminTokenFile)
		if err != nil {
			return nil, fmt.Errorf("live: admin_token_file: %w", err)
		}
		adminToken = tok
	}
	s.cfg.Models = append([]config.Model(nil), cfg.Models...)
	// The metrics come first: the shared ledger's error hook counts into
	// them from its first call (they read the models only when scraped).
	s.met = newMetrics(s)
	if err := s.rl.init(s, deps, adminToken); err != nil {
		return nil, fmt.Errorf("live: %w", err)
	}
	cs, err := newCaches(&s.cfg, s.met.cache, deps.Notes, s.log)
	if err != nil {
		return nil, fmt.Errorf("live: %w", err)
	}
	s.caches = cs
	leds, err := s.newSharedLedgers()
	if err != nil {
		cs.close()
		return nil, fmt.Errorf("live: %w", err)
	}
	s.ledgers = leds
	if s.shared, err = s.newSharedHomes(); err != nil {
		leds.close()
		cs.close()
		return nil, fmt.Errorf("live: %w", err)
	}
	built := false
	defer func() {
		if !built {
			s.shared.close()
			leds.close() // New failed: no reservation stays behind
			cs.close()
		}
	}()
	for i := range s.cfg.Models {
		mc := &s.cfg.Models[i]
		enc, ok := deps.Encoders[mc.Name]
		if !ok {
			tok, err := tokenize.LoadModel(mc.Tokenizer, tokenize.Options{})
			if err != nil {
				return nil, fmt.Errorf("live: models[%d].tokenizer: %w", i, err)
			}
			enc = tok
		}
		ec := engine.DefaultConfig()
		if mc.Profile != "" {
			var err error
			if ec, err = calibrate.ResolveProfile(mc.Profile); err != nil {
				return nil, fmt.Errorf("live: models[%d].profile: %w", i, err)
			}
		}
		ec.BlockSize = mc.BlockSize
		var trace func(gateway.TraceEvent)
		if deps.Trace != nil {
			name := mc.Name
			trace = func(ev gateway.TraceEvent) { deps.Trace(name, ev) }
		}
		led, err := leds.forModel(s, mc.Name)
		if err != nil {
			return nil, fmt.Errorf("live: %w", err)
		}
		m, err := newModel(&s.cfg, mc, enc, ec, s.start, trace, s.log, led)
		if err != nil {
			return nil, fmt.Errorf("live: %w", err)
		}
		s.models = append(s.models, m)
		if deps.Notes != nil {
			if names, groups := m.unweighed(); len(names) > 0 || groups {
				var what []string
				if len(names) > 0 {
					what = append(what, plural(len(names), "replica")+" "+strings.Join(names, ", "))
				}
				if groups {
					what = append(what, "the replicas its DNS groups find")
				}
				fmt.Fprintf(deps.Notes, "inferrail live: model %s: no kv_capacity_blocks for %s: %s admission takes each without weighing KV until a scrape reports its num_gpu_blocks (vllm:cache_config_info)\n",
					m.name, strings.Join(what, " and "), m.admission)
			}
		}
	}
	tr := deps.Transport
	if tr == nil {
		// Proxied requests to http:// engines; the transport below keeps
		// scrapes, probes and https:// engines.
		s.h1 = newH1Client(1024, 4*time.Second)
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
	sink := deps.DecisionLog
	if sink == nil && s.cfg.DecisionLog.Path != "" {
		f, err := os.OpenFile(s.cfg.DecisionLog.Path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return nil, fmt.Errorf("live: decision_log.path: %w", err)
		}
		sink, s.logFile = f, f
	}
	s.upstream = &http.Client{Transport: tr}
	s.idPrefix = strconv.FormatInt(s.boot, 36) + "-"
	s.tok = newTokPool(s.cfg.Tokenize)
	ten, err := newTenants(&s.cfg, deps, s.met, s.log)
	if err != nil {
		if s.logFile != nil {
			s.logFile.Close()
		}
		return nil, fmt.Errorf("live: %w", err)
	}
	s.ten = ten
	s.declog = newDecisionLog(sink, s.cfg.DecisionLog.Sample, s.cfg.DecisionLog.Buffer, s.met.logDropped.Inc)
	tracing, err := newTracer(s.cfg.Tracing, s.version, s.log, s.met.traceFailures)
	if err != nil {
		s.ten.close()
		return nil, fmt.Errorf("live: %w", err)
	}
	s.tr = tracing
	rec, err := newRecorder(s.cfg.Record, s.version, s.recordFleet, s.met, s.log)
	if err != nil {
		s.ten.close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		s.tr.shutdown(ctx)
		cancel()
		return nil, fmt.Errorf("live: %w", err)
	}
	s.rec = rec
	s.routes.Store(newRouteTable(s.models, &s.cfg))
	for _, m := range s.models {
		s.wg.Go(func() { m.runDeadlines(s.stop) })
		if s.ledgers != nil {
			s.wg.Go(func() { s.ledgers.watch(m, s.stop) })
		}
	}
	built = true
	return s, nil
}

func plural(n int, what string) string {
	if n == 1 {
		return what
	}
	return what + "s"
}

// lookup resolves a model name, alias or LoRA adapter; "" is the only
// model when there is one.
func (s *Server) lookup(name string) (m *model, alias, adapter bool) {
	if name == "" {
		if len(s.models) == 1 {
			return s.models[0], false, false
		}
		return nil, false, false
	}
	rt := s.routes.Load()
	return rt.byName[name], rt.aliases[name], rt.adapters[name]
}

func (s *Server) newRequestID() string {
	var b [40]byte
	out := append(b[:0], s.idPrefix...)
	return string(strconv.AppendUint(out, s.reqSeq.Add(1), 36))
}

// Handler is the client-facing API: the generation endpoints (completions,
// chat and the Responses API, with its stored responses: responses.go),
// /v1/embeddings and vLLM's scoring endpoints (scorePaths) proxied,
// /v1/models and /v1/models/{id}, and the health endpoints (/livez,
// /readyz, /health) answered locally, anything else 404 (405 for a known
// path with the wrong method) in OpenAI's error shape. Every response
// write is bounded by write_timeout, every body read by read_timeout.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", s.handleGenerate)
	mux.HandleFunc("POST /v1/chat/completions", s.handleGenerate)
	mux.HandleFunc("POST /v1/responses", s.handleGenerate)
	mux.HandleFunc("POST /v1/embeddings", s.handleGenerate)
	for _, p := range scorePaths {
		mux.HandleFunc("POST "+p, s.handleGenerate)
	}
	small := http.NewServeMux()
	small.HandleFunc("GET /v1/models", s.handleModels)
	small.HandleFunc("GET /v1/models/{id...}", s.handleModel)
	mux.HandleFunc("GET /v1/responses/{id}", s.handleStoredResponse)
	mux.HandleFunc("POST /v1/responses/{id}/cancel", s.handleStoredResponse)
	s.healthRoutes(small)
	allowed := map[string]string{"/v1/completions": "POST", "/v1/chat/completions": "POST", "/v1/responses": "POST", "/v1/embeddings": "POST", "/score": "POST", "/v1/score": "POST", "/rerank": "POST", "/v1/rerank": "POST", "/v2/rerank": "POST", "/v1/models": "GET", "/health": "GET", "/livez": "GET", "/readyz": "GET"}
	small.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if m, ok := allowed[r.URL.Path]; ok {
			w.Header().Set("Allow", m)
			s.writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", fmt.Sprintf("%s %.200s: use %s", r.Method, r.URL.Path, m))
			return
		}
		s.writeError(w, http.StatusNotFound, "invalid_request_error", "not_found", fmt.Sprintf("unknown path %.200s: this gateway serves /v1/completions, /v1/chat/completions, /v1/responses, /v1/embeddings, vLLM's /score and /rerank, /v1/models, /livez, /readyz and /health", r.URL.Path))
	})
	mux.Handle("/", s.bounded(small))
	return mux
}

// bounded gives a small answer's handler one write deadline
// (write_timeout) for all of it, and a read deadline (read_timeout) for a
// body it never reads, which the server discards after it (a stalled one
// would hold the connection). The generation handler sets its own around
// each write instead: a deadline left running while it waits would reset
// an HTTP/2 stream when it passed.
func (s *Server) bounded(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		now := time.Now()
		rc.SetWriteDeadline(now.Add(s.cfg.WriteTimeout))
		rc.SetReadDeadline(now.Add(s.cfg.ReadTimeout))
		h.ServeHTTP(w, r)
	})
}

func (s *Server) healthRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /livez", s.handleLive)
	mux.HandleFunc("GET /readyz", s.handleReady)
	mux.HandleFunc("GET /health", s.handleReady)
}

// AdminHandler serves the gateway's metrics (/metrics), its view of the
// replicas (/replicas, JSON), the tenancy admin API (/admin/keys,
// /admin/usage, /admin/status: admin.go), the health endpoints and, with
// pprof: true, Go's profiles (/debug/pprof/). With admin_token_file set
// every path but the health endpoints needs "Authorization: Bearer TOKEN".
func (s *Server) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", s.authorized(promhttp.HandlerFor(s.met.reg, promhttp.HandlerOpts{})))
	mux.Handle("GET /replicas", s.authorized(http.HandlerFunc(s.handleReplicas)))
	s.adminRoutes(mux)
	if s.cfg.Pprof {
		mux.Handle("/debug/pprof/", s.authorized(http.HandlerFunc(pprof.Index)))
		mux.Handle("/debug/pprof/profile", s.authorized(s.sampling(pprof.Profile)))
		mux.Handle("/debug/pprof/trace", s.authorized(s.sampling(pprof.Trace)))
	}
	s.healthRoutes(mux)
	return s.bounded(mux)
}

// sampling gives a profile or trace that samples for ?seconds=N (pprof's
// default 30 for a profile, 1 for a trace) a write deadline that long past
// write_timeout: the admin server's deadline (bounded) would cut any longer
// than write_timeout, an empty reply. N is capped at maxSampleSeconds.
func (s *Server) sampling(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sec := int64(30)
		if r.URL.Path == "/debug/pprof/trace" {
			sec = 1
		}
		if v := r.FormValue("seconds"); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n <= 0 || n > maxSampleSeconds {
				s.writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_seconds", fmt.Sprintf("seconds=%.40q: give a whole number of seconds from 1 to %d", v, maxSampleSeconds))
				return
			}
			sec = n
		}
		http.NewResponseController(w).SetWriteDeadline(time.Now().Add(time.Duration(sec)*time.Second + s.cfg.WriteTimeout))
		h(w, r)
	})
}

// maxSampleSeconds bounds a profile's or trace's ?seconds.
const maxSampleSeconds = 600

// authorized requires the admin bearer token, when one is configured (a
// reload may change it).
func (s *Server) authorized(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok := s.loaded().adminToken
		if tok == "" {
			h.ServeHTTP(w, r)
			return
		}
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte("Bearer "+tok)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="inferrail admin"`)
			s.writeError(w, http.StatusUnauthorized, "authentication_error", "invalid_admin_token", "the admin endpoints need Authorization: Bearer <the token in admin_token_file>")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// handleModel is GET /v1/models/{id}: the card of one model or alias.
func (s *Server) handleModel(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	rt := s.routes.Load()
	for _, m := range s.models {
		for _, n := range rt.names[m] {
			if n == id {
				b, _ := json.Marshal(modelCard{ID: n, Object: "model", Created: s.start.Unix(), OwnedBy: "inferrail", Root: m.name})
				w.Header().Set("Content-Type", "application/json")
				w.Write(b)
				return
			}
		}
	}
	s.writeError(w, http.StatusNotFound, "invalid_request_error", "model_not_found", fmt.Sprintf("The model `%.200s` does not exist.", id))
}

// modelCard is one entry of /v1/models.
type modelCard struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	Root    string `json:"root"`
}

// handleLive is /livez: 200 while the process serves.
func (s *Server) handleLive(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Write([]byte("ok\n"))
}

// handleReady is /readyz (and /health): 200 while every model has a
// replica that passed a probe or answered a request within
// health.ready_window; 503 once draining has begun.
func (s *Server) handleReady(w http.ResponseWriter, _ *http.Request) {
	if s.draining.Load() {
		s.writeError(w, http.StatusServiceUnavailable, "service_unavailable", "draining", "the gateway is shutting down")
		return
	}
	if s.standby.Load() {
		s.writeError(w, http.StatusServiceUnavailable, "service_unavailable", "standby",
			fmt.Sprintf("another endpoint picker holds the lease %s (epp.leader_election): this one takes over when it lapses", s.leaseName()))
		return
	}
	window := s.loaded().cfg.Health.Ready()
	now := time.Now()
	for _, m := range s.models {
		if !m.ready(now, window) {
			s.writeError(w, http.StatusServiceUnavailable, "service_unavailable", "no_ready_replica",
				fmt.Sprintf("no replica of %s passed a probe or answered a request in the last %v", m.name, window))
			return
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Write([]byte("ok\n"))
}

// Drain fails readiness from now on: the first step of a graceful
// shutdown, before the listeners stop accepting.
func (s *Server) Drain() { s.draining.Store(true) }

// remoteHost is a request's client address without its port.
func remoteHost(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	out := struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}{Object: "list", Data: []modelCard{}}
	rt := s.routes.Load()
	for _, m := range s.models {
		for _, n := range rt.names[m] {
			out.Data = append(out.Data, modelCard{ID: n, Object: "model", Created: s.start.Unix(), OwnedBy: "inferrail", Root: m.name})
		}
	}
	b, _ := json.Marshal(out)
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

type replicaView struct {
	Model        string  `json:"model"`
	Replica      string  `json:"replica"`
	URL          string  `json:"url"`
	Healthy      bool    `json:"healthy"`
	InFlight     int     `json:"in_flight"`
	Pending      int     `json:"pending"`
	PeakInFlight int     `json:"peak_in_flight"`
	Failures     int     `json:"consecutive_failures"`
	Ejections    int     `json:"ejections"`
	EjectedUntil string  `json:"ejected_until,omitempty"`
	Restarts     int     `json:"restarts"`
	Running      int     `json:"engine_running"`
	Waiting      int     `json:"engine_waiting"`
	KVUsage      float64 `json:"engine_kv_usage"`
	ReportAgeS   float64 `json:"report_age_s"`
	IndexBlocks  int     `json:"index_blocks"`
	// ReservedBlocks is the KV blocks admission holds for the replica's
	// requests in flight, CapacityBlocks what it weighs them against (0:
	// unknown yet), PeakReservedBlocks the most ever reserved.
	ReservedBlocks     int `json:"reserved_blocks"`
	CapacityBlocks     int `json:"capacity_blocks"`
	PeakReservedBlocks int `json:"peak_reserved_blocks"`
	// Queued is the model's requests waiting for a replica.
	Queued int `json:"model_queued"`
	// MaxModelLen is the context the engine's /v1/models gave (0: none
	// yet, or max_model_len is configured and it was not asked);
	// ModelMaxModelLen the one the gateway checks requests against (0:
	// none).
	MaxModelLen      int `json:"engine_max_model_len"`
	ModelMaxModelLen int `json:"model_max_model_len"`
}

func (s *Server) replicaViews() []replicaView {
	var out []replicaView
	for _, m := range s.models {
		snap := m.snapshot()
		for _, rs := range snap.reps {
			st := rs.st
			v := replicaView{
				Model: m.name, Replica: rs.rep.name, URL: rs.rep.base.String(), Healthy: st.Healthy,
				InFlight: st.Load.InFlight, Pending: st.Load.Pending, PeakInFlight: st.PeakInFlight,
				Failures: st.Failures, Ejections: st.Ejections, Restarts: st.Restarts,
				Running: st.Report.Running, Waiting: st.Report.Waiting, KVUsage: st.Report.KVUsage, ReportAgeS: -1,
				IndexBlocks: rs.indexBlocks, ReservedBlocks: st.ReservedBlocks, CapacityBlocks: st.CapacityBlocks,
				PeakReservedBlocks: st.PeakReserved, Queued: snap.queued,
				MaxModelLen: rs.ctxLen, ModelMaxModelLen: m.contextLen(),
			}
			if st.EjectedNow {
				v.EjectedUntil = m.start.Add(st.EjectedUntil).UTC().Format(time.RFC3339Nano)
			}
			if st.ReportAge >= 0 {
				v.ReportAgeS = st.ReportAge.Seconds()
			}
			out = append(out, v)
		}
	}
	return out
}

func (s *Server) handleReplicas(w http.ResponseWriter, _ *http.Request) {
	b, _ := json.MarshalIndent(s.replicaViews(), "", "  ")
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

// Close stops the deadline goroutines and the decision log (closing its
// file if New opened it); call it after the HTTP servers have shut down and
// Run has returned.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		s.rl.close() // a reload running ends first; none starts after
		close(s.stop)
		s.wg.Wait()
		s.ledgers.close() // this gateway's reservations released
		s.shared.close()  // its response homes' writes in flight, each bounded
		if s.declog != nil {
			s.declog.close()
		}
		// The recording's last rows and file, within a bound.
		if err := s.rec.close(); err != nil {
			s.log.Error(err.Error())
		}
		// The caches' pending writes, within a bound.
		s.caches.close()
		// The usage left goes to the store, within a bound.
		s.ten.close()
		// What is left of the traces goes out, within a bound.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s.tr.shutdown(ctx)
		cancel()
		if s.logFile != nil {
			s.logFile.Close()
		}
		s.upstream.CloseIdleConnections()
		if s.h1 != nil {
			s.h1.closeIdle(true)
		}
	})
}
