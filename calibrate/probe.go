package calibrate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/fleet/remote"
	"github.com/inferrail/inferrail/internal/openai"
	"github.com/inferrail/inferrail/internal/seed"
)

// ProbeConfig configures Probe.
type ProbeConfig struct {
	// BaseURL is the server's root, for example http://127.0.0.1:8000 (the
	// API is under /v1).
	BaseURL string
	// Model is the model to ask for; empty means the first /v1/models lists.
	Model string
	// Budget bounds the whole run; probes that do not fit are skipped. 0
	// means 2 minutes.
	Budget time.Duration
	// Progress, when set, receives the plan up front and a line per probe.
	Progress io.Writer
	// MaxNumBatchedTokens is the server's --max-num-batched-tokens (the
	// prefill chunk size); 0 means vLLM's default, 2048.
	MaxNumBatchedTokens int
	// BlockSize is the server's KV block size; 0 means what /metrics says,
	// else 16.
	BlockSize int
	// MaxPromptTokens caps the longest prompt; 0 means 8192 or less if the
	// server's max_model_len is smaller.
	MaxPromptTokens int
	// MaxBatch caps the concurrency of decode probes; 0 means 32.
	MaxBatch int
	// Repeats runs the design this many times; 0 means 3, which lets the
	// fit leave out a probe that a busy machine delayed and still measure
	// every design point at least twice.
	Repeats int
	// Seed seeds the prompt words.
	Seed uint64
	// APIKey, when set, is sent as a bearer token.
	APIKey string
	// Client is the HTTP client; nil means one that keeps a connection
	// for every concurrent probe request (MaxBatch of them, at least 32),
	// so that no probe's time to first token includes a connection's
	// set-up.
	Client *http.Client
	// IdleWait bounds how long to wait for the engine to go idle before a
	// probe (read from /metrics); 0 means 10 s.
	IdleWait time.Duration
}

func (c *ProbeConfig) validate() error {
	var errs []error
	if c.BaseURL == "" || !(strings.HasPrefix(c.BaseURL, "http://") || strings.HasPrefix(c.BaseURL, "https://")) {
		errs = append(errs, fmt.Errorf("url: want the server's http:// or https:// root, got %q", c.BaseURL))
	}
	if c.Budget < 0 {
		errs = append(errs, fmt.Errorf("budget: must be positive, got %v", c.Budget))
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"max_num_batched_tokens", c.MaxNumBatchedTokens}, {"block size", c.BlockSize}, {"max prompt tokens", c.MaxPromptTokens}, {"max batch", c.MaxBatch}, {"repeats", c.Repeats}} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("%s: must be 0 (default) or positive, got %d", f.name, f.v))
		}
	}
	return errors.Join(errs...)
}

// Tokenizer is how prompt words map to tokens on the server: tokens = PerWord*words + Extra.
type Tokenizer struct {
	PerWord float64 `json:"per_word"`
	Extra   float64 `json:"extra"`
}

func (t Tokenizer) words(tokens int) int {
	return max(1, int(math.Round((float64(tokens)-t.Extra)/t.PerWord)))
}

// ProbeResult is what Probe measured and fitted.
type ProbeResult struct {
	BaseURL      string        `json:"base_url"`
	Model        string        `json:"model"`
	Design       Design        `json:"design"`
	Tokenizer    Tokenizer     `json:"tokenizer"`
	Measurements []Measurement `json:"measurements"`
	Rows         []Row         `json:"rows"`
	// Fit is nil when the measurements could not identify every coefficient.
	Fit *LinearFit `json:"fit,omitempty"`
	// Config is the engine configuration to write: known server limits and
	// the fitted profile.
	Config  engine.Config `json:"config"`
	Skipped int           `json:"skipped_probes"`
	Notes   []string      `json:"notes,omitempty"`
	WallS   float64       `json:"wall_s"`
}

// prober holds one run's state.
type prober struct {
	cfg     ProbeConfig
	client  *http.Client
	rng     *rand.Rand
	res     *ProbeResult
	metrics bool // /metrics answers with a page fleet/remote can read
	noReset bool // /reset_prefix_cache is not served
	noted   map[string]bool
	// dropped counts the decode probes left out of the fit, of decodes run,
	// and why the first was.
	dropped, decodes int
	dropWhy          string
}

// Probe runs a calibration experiment against an OpenAI-compatible server
// (vLLM or inferrail engine) and fits the latency model by least squares: cold
// prompts of varied lengths, cached-prefix prompts, and concurrent decode
// batches (see NewDesign), each streamed from /v1/completions with
// ignore_eos and temperature 0, timed on the monotonic clock. Prompts are
// space-separated words; their token counts come from usage.prompt_tokens.
// Before each probe it waits for /metrics to show an idle engine, and before
// cold probes it resets the prefix cache, where the server offers either.
// The run stops at cfg.Budget; the result holds every measurement even when
// the fit fails (then err says what is missing).
func Probe(ctx context.Context, cfg ProbeConfig) (*ProbeResult, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	began := time.Now()
	if cfg.Budget == 0 {
		cfg.Budget = 2 * time.Minute
	}
	if cfg.IdleWait == 0 {
		cfg.IdleWait = 10 * time.Second
	}
	if cfg.Repeats == 0 {
		cfg.Repeats = 3
	}
	cfg.BaseURL = strings.TrimRight(cfg.BaseURL, "/")
	ctx, cancel := context.WithTimeout(ctx, cfg.Budget)
	defer cancel()
	p := &prober{cfg: cfg, client: cfg.Client, rng: seed.Rand(cfg.Seed, "calibrate/probe"), noted: map[string]bool{}}
	if p.client == nil {
		p.client = probeClient(cfg.MaxBatch)
		defer p.client.CloseIdleConnections()
	}
	p.res = &ProbeResult{BaseURL: cfg.BaseURL}
	res := p.res
	maxLen, err := p.models(ctx)
	if err != nil {
		return nil, err
	}
	res.Model = p.cfg.Model
	blockSize, numBlocks := p.cacheInfo(ctx)
	if cfg.BlockSize > 0 {
		blockSize = cfg.BlockSize
	}
	if blockSize == 0 {
		blockSize = 16
	}
	if err := p.tokenizer(ctx); err != nil {
		return nil, err
	}
	budget := cfg.MaxNumBatchedTokens
	if budget == 0 {
		budget = 2048
		p.note("max_num_batched_tokens not given: assumed vLLM's default of 2048 (pass the server's value if it differs)")
	}
	maxPrompt := cfg.MaxPromptTokens
	if maxPrompt == 0 {
		maxPrompt = 8192
	}
	if maxLen > 0 {
		maxPrompt = min(maxPrompt, maxLen-80)
	}
	kvCap := 0 // the design's default
	if numBlocks > 0 {
		// Decode probes may fill three quarters of a known KV cache: the
		// larger the context a batch reads, the better decode_ctx_token
		// stands out of the step time.
		kvCap = numBlocks * blockSize * 3 / 4
		maxPrompt = min(maxPrompt, numBlocks*blockSize/2)
	}
	d, err := NewDesign(DesignOptions{MaxPromptTokens: maxPrompt, MaxNumBatchedTokens: budget, BlockSize: blockSize, MaxBatch: cfg.MaxBatch, MaxKVTokens: kvCap, Repeats: cfg.Repeats})
	if err != nil {
		return nil, err
	}
	res.Design = d

	// A rough plan: scale the default profile by a measured 512-token prefill.
	var est ProfileEstimator
	def := coefs(engine.DefaultConfig().Latency)
	copy(est[:], def[:])
	if m, err := p.single(ctx, 512, 0, true); err == nil && m.TTFTMs[0] > 0 {
		k := m.TTFTMs[0] / dot(PrefillRow(m.PromptTokens[0], 0, budget).X, est)
		for i := range est {
			est[i] *= k
		}
	}
	if w := cfg.Progress; w != nil {
		fmt.Fprintf(w, "calibrate: %d probes against %s (%s), about %v of engine time; stopping at the %v budget\n",
			len(d.Probes), cfg.BaseURL, res.Model, d.Estimate(est).Round(time.Second), cfg.Budget)
	}
	for i, spec := range d.Probes {
		if ctx.Err() != nil {
			res.Skipped = len(d.Probes) - i
			p.note(fmt.Sprintf("budget %v reached: %d of %d probes skipped", cfg.Budget, res.Skipped, len(d.Probes)))
			break
		}
		m, err := p.run(ctx, spec)
		if err != nil {
			if ctx.Err() != nil {
				continue
			}
			return res, fmt.Errorf("probe %d (%s, %d tokens, batch %d): %w", i, spec.Kind, spec.Prompt, spec.Batch, err)
		}
		res.Measurements = append(res.Measurements, m)
		if w := cfg.Progress; w != nil {
			fmt.Fprintf(w, "calibrate: [%d/%d] %s prompt %d cached %d batch %d: ttft %.1f ms (%.0fs elapsed)\n",
				i+1, len(d.Probes), spec.Kind, m.PromptTokens[0], m.CachedTokens[0], spec.Batch, m.TTFTMs[0], time.Since(began).Seconds())
		}
	}
	res.Rows = Rows(res.Measurements, budget)
	res.Config = engine.DefaultConfig()
	res.Config.Name = "probed"
	if res.Model != "" {
		res.Config.Name = "probed-" + shortModel(res.Model)
	}
	res.Config.BlockSize = blockSize
	res.Config.MaxNumBatchedTokens = budget
	if maxLen > 0 {
		res.Config.MaxModelLen = maxLen
	}
	if numBlocks > 0 {
		res.Config.NumGPUBlocks = numBlocks
	} else {
		p.note(fmt.Sprintf("num_gpu_blocks unknown (/metrics has no vllm:cache_config_info): kept %d; set it in the profile", res.Config.NumGPUBlocks))
	}
	p.note(fmt.Sprintf("max_num_seqs cannot be probed: kept %d; set it in the profile", res.Config.MaxNumSeqs))
	res.WallS = math.Round(time.Since(began).Seconds()*100) / 100
	fit, err := FitRows(res.Rows)
	if err != nil {
		if p.dropped > 0 {
			return res, fmt.Errorf("fit %d measurements (%d of %d decode probes were left out: %s): %w", len(res.Rows), p.dropped, p.decodes, p.dropWhy, err)
		}
		return res, fmt.Errorf("fit %d measurements: %w", len(res.Rows), err)
	}
	res.Fit = fit
	res.Config.Latency = roundProfile(fit.Profile)
	if err := res.Config.Validate(); err != nil {
		return res, fmt.Errorf("fitted profile: %w", err)
	}
	return res, nil
}

func (p *prober) note(s string) {
	if !p.noted[s] {
		p.noted[s] = true
		p.res.Notes = append(p.res.Notes, s)
	}
}

func (p *prober) request(ctx context.Context, method, path string, body any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, p.cfg.BaseURL+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if p.cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+p.cfg.APIKey)
	}
	return p.client.Do(req)
}

// models reads /v1/models: the model to use and its max_model_len (0 if not given).
func (p *prober) models(ctx context.Context) (int, error) {
	resp, err := p.request(ctx, http.MethodGet, "/v1/models", nil)
	if err != nil {
		return 0, fmt.Errorf("reach %s/v1/models: %w (is the server up and the URL right?)", p.cfg.BaseURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s/v1/models answered %s; want an OpenAI-compatible server", p.cfg.BaseURL, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, openai.MaxModelsBytes))
	if err != nil {
		return 0, fmt.Errorf("read %s/v1/models: %w", p.cfg.BaseURL, err)
	}
	cards, err := openai.ParseModels(body)
	if err != nil {
		return 0, fmt.Errorf("read %s/v1/models: %w", p.cfg.BaseURL, err)
	}
	var ids []string
	for _, m := range cards {
		if p.cfg.Model == "" || m.ID == p.cfg.Model {
			p.cfg.Model = m.ID
			return m.MaxModelLen, nil
		}
		ids = append(ids, m.ID)
	}
	if p.cfg.Model == "" {
		return 0, fmt.Errorf("%s/v1/models lists no model; pass --model", p.cfg.BaseURL)
	}
	return 0, fmt.Errorf("model %q is not served at %s; it serves %s", p.cfg.Model, p.cfg.BaseURL, strings.Join(ids, ", "))
}

// scrape reads /metrics with fleet/remote's parser (vLLM's or SGLang's
// page, in any of the formats they serve).
func (p *prober) scrape(ctx context.Context) (remote.Load, error) {
	resp, err := p.request(ctx, http.MethodGet, "/metrics", nil)
	if err != nil {
		return remote.Load{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return remote.Load{}, fmt.Errorf("GET /metrics answered %s", resp.Status)
	}
	return remote.ParseMetrics(io.LimitReader(resp.Body, 8<<20), resp.Header.Get("Content-Type"))
}

// cacheInfo reads block_size and num_gpu_blocks from vllm:cache_config_info
// (0 when the page does not say), and whether /metrics can be read at all.
func (p *prober) cacheInfo(ctx context.Context) (blockSize, numBlocks int) {
	l, err := p.scrape(ctx)
	p.metrics = err == nil
	if err != nil {
		p.note(fmt.Sprintf("no usable /metrics (%v): cannot check the engine is idle between probes", err))
		return 0, 0
	}
	return l.BlockSize, l.NumGPUBlocks
}

// waitIdle waits until /metrics shows no running or waiting request.
func (p *prober) waitIdle(ctx context.Context) {
	if !p.metrics {
		return
	}
	deadline := time.Now().Add(p.cfg.IdleWait)
	for {
		l, err := p.scrape(ctx)
		if err != nil {
			return
		}
		if l.Running+l.Waiting == 0 {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			p.note("the engine was still busy before a probe (other traffic?): measurements may be inflated")
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// resetCache asks the server to drop its prefix cache, once the engine is
// idle: vLLM (and inferrail engine) refuse with 409 Conflict while requests
// run, so a refusal is retried after waiting for idle again. A server
// without the endpoint is noted once and not asked again.
func (p *prober) resetCache(ctx context.Context) {
	if p.noReset {
		return
	}
	const attempts = 5
	for range attempts {
		p.waitIdle(ctx)
		resp, err := p.request(ctx, http.MethodPost, "/reset_prefix_cache", nil)
		if err != nil {
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch {
		case resp.StatusCode < 300:
			return
		case resp.StatusCode == http.StatusConflict:
			select {
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed:
			p.noReset = true
		}
		p.note(fmt.Sprintf("POST /reset_prefix_cache answered %d: cold probes rely on fresh prompt words only", resp.StatusCode))
		return
	}
	p.note(fmt.Sprintf("POST /reset_prefix_cache answered 409 (requests running) %d times in a row: other traffic on the server? cold probes rely on fresh prompt words only", attempts))
}

// syllables make words that tokenizers split predictably.
var syllables = []string{"ka", "lo", "mi", "re", "tu", "sa", "ne", "po", "fi", "da", "gu", "be", "zo", "ri", "ta", "mo"}

// words returns n fresh space-terminated words.
func (p *prober) words(n int) string {
	var b strings.Builder
	b.Grow(n * 5)
	for range n {
		for range 2 {
			b.WriteString(syllables[p.rng.IntN(len(syllables))])
		}
		b.WriteByte(' ')
	}
	return b.String()
}

// tokenizer measures tokens per word from two prompt lengths.
func (p *prober) tokenizer(ctx context.Context) error {
	p.res.Tokenizer = Tokenizer{PerWord: 1}
	var pts [2][2]float64
	for i, n := range []int{64, 512} {
		c, err := p.stream(ctx, p.words(n), 1)
		if err != nil {
			return fmt.Errorf("first completion: %w", err)
		}
		if c.promptTokens <= 0 {
			return fmt.Errorf("the server reports no usage.prompt_tokens (it must honour stream_options.include_usage); its stream had %s", c.describe())
		}
		pts[i] = [2]float64{float64(n), float64(c.promptTokens)}
	}
	per := (pts[1][1] - pts[0][1]) / (pts[1][0] - pts[0][0])
	if !(per > 0) {
		return fmt.Errorf("prompt token counts do not grow with prompt length (%v); cannot size prompts", pts)
	}
	p.res.Tokenizer = Tokenizer{PerWord: per, Extra: pts[0][1] - per*pts[0][0]}
	return nil
}

// completion is one streamed request's outcome, times in ms since its probe began.
type completion struct {
	start float64
	// tokens holds the arrival of every chunk that carried generated text.
	tokens       []float64
	promptTokens int
	cachedTokens int // -1 when the server does not say
	outTokens    int
	// What the stream held, to say what was missing or wrong in it.
	events, finishOnly, empty int
	usage, done               bool
}

// describe says what the stream held.
func (c *completion) describe() string {
	var parts []string
	parts = append(parts, fmt.Sprintf("%d with text", len(c.tokens)))
	if c.finishOnly > 0 {
		parts = append(parts, fmt.Sprintf("%d with only a finish reason", c.finishOnly))
	}
	if c.empty > 0 {
		parts = append(parts, fmt.Sprintf("%d with neither text nor usage", c.empty))
	}
	if c.usage {
		parts = append(parts, fmt.Sprintf("usage %d prompt / %d completion tokens", c.promptTokens, c.outTokens))
	} else {
		parts = append(parts, "no usage")
	}
	if c.done {
		parts = append(parts, "then [DONE]")
	} else {
		parts = append(parts, "no [DONE]")
	}
	return fmt.Sprintf("%d events (%s)", c.events, strings.Join(parts, ", "))
}

// take adds one event of the stream.
func (c *completion) take(e *openai.Event) error {
	c.events++
	switch e.Kind {
	case openai.KindDone:
		c.done = true
		return nil
	case openai.KindError:
		return fmt.Errorf("the server wrote an error into the stream after %d chunks with text: %w", len(c.tokens), e.Error)
	}
	if e.HasUsage {
		c.usage = true
		c.promptTokens, c.outTokens, c.cachedTokens = e.Usage.PromptTokens, e.Usage.CompletionTokens, e.Usage.CachedTokens
	}
	switch {
	case e.Generated():
		c.tokens = append(c.tokens, ms(e.At))
	case e.FinishReason != "":
		c.finishOnly++ // llm-d-inference-sim ends with one: no token
	case !e.HasUsage:
		c.empty++
	}
	return nil
}

// stream sends one streamed completion and times every chunk that carries text.
func (p *prober) stream(ctx context.Context, prompt string, maxTokens int) (*completion, error) {
	return p.streamAt(ctx, prompt, maxTokens, time.Now())
}

func (p *prober) streamAt(ctx context.Context, prompt string, maxTokens int, t0 time.Time) (*completion, error) {
	body := map[string]any{
		"model": p.cfg.Model, "prompt": prompt, "max_tokens": maxTokens, "temperature": 0,
		"stream": true, "stream_options": map[string]any{"include_usage": true}, "ignore_eos": true,
	}
	c := &completion{start: ms(time.Since(t0)), cachedTokens: -1}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resp, err := p.request(ctx, http.MethodPost, "/v1/completions", body)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	defer func() {
		if c.done {
			// vLLM's server ends the response in a write of its own after
			// [DONE]: read on to it, so that the connection serves the next
			// probe and no probe's time to first token includes a new
			// connection's set-up (a gateway keeping its connections,
			// inferrail live, never pays it).
			openai.ReadEnd(resp.Body, cancel)
		}
	}()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("/v1/completions answered %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	var r openai.Reader
	buf := make([]byte, 32<<10)
	for !c.done {
		n, rerr := resp.Body.Read(buf)
		at := time.Since(t0)
		var evs []openai.Event
		var err error
		if n > 0 {
			evs, err = r.Feed(buf[:n], at)
		}
		if rerr == io.EOF && err == nil {
			var last []openai.Event
			last, err = r.End(at)
			evs = append(evs, last...)
		}
		for i := range evs {
			if terr := c.take(&evs[i]); terr != nil {
				return nil, terr
			}
		}
		if err != nil {
			return nil, fmt.Errorf("read the stream: %w", err)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return nil, fmt.Errorf("read the stream after %s: %w", c.describe(), rerr)
		}
	}
	if len(c.tokens) == 0 {
		return nil, fmt.Errorf("the stream carried no generated text: %s", c.describe())
	}
	return c, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// probeClient is Probe's HTTP client when the caller gives none: Go's
// default transport keeping up to maxBatch (at least 32) idle connections to
// the engine, one for every request of the widest decode probe, where the
// default keeps 2 and each batch would set up the rest again.
func probeClient(maxBatch int) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = max(maxBatch, 32)
	return &http.Client{Transport: tr}
}

// single runs one cold (cached == 0) or cached-prefix request of about
// prompt new tokens.
func (p *prober) single(ctx context.Context, prompt, cached int, cold bool) (Measurement, error) {
	m := Measurement{Probe: ProbeSpec{Kind: ProbeCold, Prompt: prompt, Cached: cached, Batch: 1, Output: 1}}
	tk := p.res.Tokenizer
	text := ""
	prefixTokens := 0
	if cached > 0 {
		m.Probe.Kind = ProbeCached
		text = p.words(tk.words(cached))
		p.waitIdle(ctx)
		c, err := p.stream(ctx, text, 1)
		if err != nil {
			return m, fmt.Errorf("warm the prefix: %w", err)
		}
		prefixTokens = c.promptTokens
	} else if cold {
		p.resetCache(ctx)
	}
	text += p.words(max(1, int(math.Round(float64(prompt)/tk.PerWord))))
	p.waitIdle(ctx)
	c, err := p.stream(ctx, text, 1)
	if err != nil {
		return m, err
	}
	cachedTok := c.cachedTokens
	if cachedTok < 0 {
		bs := max(p.res.Design.BlockSize, 1)
		cachedTok = min(prefixTokens, c.promptTokens-1) / bs * bs
		if prefixTokens == 0 {
			cachedTok = 0
		}
	}
	m.PromptTokens = []int{c.promptTokens}
	m.CachedTokens = []int{cachedTok}
	m.TTFTMs = []float64{c.tokens[0] - c.start}
	return m, nil
}

// decodeTries is how many times a decode probe runs before it is left out
// for a stream whose chunks are not one token each: a server that merges
// tokens while a busy client has not read them does so now and then, where
// one with a stream interval above 1 does so every time (and once a probe
// was left out with none kept, the others are not tried again).
const decodeTries = 3

// run runs one probe of the design.
func (p *prober) run(ctx context.Context, s ProbeSpec) (Measurement, error) {
	if s.Kind != ProbeDecode {
		m, err := p.single(ctx, s.Prompt, s.Cached, s.Kind == ProbeCold)
		m.Probe = s
		return m, err
	}
	for try := 1; ; try++ {
		m, why, err := p.decode(ctx, s)
		if err != nil {
			return m, err
		}
		if why == "" {
			p.decodes++
			return m, nil
		}
		// Every decode probe so far left out: the server merges every
		// time (a stream interval above 1), and more tries only spend the
		// budget.
		persistent := p.dropped > 0 && p.dropped == p.decodes
		if try < decodeTries && !persistent && ctx.Err() == nil {
			p.note("a decode probe ran again: " + why)
			continue
		}
		p.note("a decode probe was left out: " + why)
		p.decodes++
		if p.dropped == 0 {
			p.dropWhy = why
		}
		p.dropped++
		m.TokenMs = nil
		return m, nil
	}
}

// decode runs a decode probe once; why is not empty when a stream's chunks
// were not one token each, so that the probe cannot time its tokens.
func (p *prober) decode(ctx context.Context, s ProbeSpec) (m Measurement, why string, err error) {
	p.resetCache(ctx)
	p.waitIdle(ctx)
	m = Measurement{Probe: s}
	prompts := make([]string, s.Batch)
	for i := range prompts {
		prompts[i] = p.words(p.res.Tokenizer.words(s.Prompt))
	}
	out := make([]*completion, s.Batch)
	errs := make([]error, s.Batch)
	t0 := time.Now()
	var wg sync.WaitGroup
	for i := range s.Batch {
		wg.Go(func() { out[i], errs[i] = p.streamAt(ctx, prompts[i], s.Output, t0) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return m, "", err
	}
	for _, c := range out {
		m.PromptTokens = append(m.PromptTokens, c.promptTokens)
		m.CachedTokens = append(m.CachedTokens, max(c.cachedTokens, 0))
		m.TTFTMs = append(m.TTFTMs, c.tokens[0]-c.start)
		m.TokenMs = append(m.TokenMs, c.tokens)
		m.StartMs = append(m.StartMs, c.start)
		if c.outTokens > 0 && c.outTokens != len(c.tokens) {
			why = fmt.Sprintf("a stream carried %d chunks with text for %d tokens (usage.completion_tokens), and decode probes time one chunk a token; ", len(c.tokens), c.outTokens)
			if len(c.tokens) < c.outTokens {
				why += "the server put several tokens in a chunk (a stream interval above 1, or tokens merged while the client had not read them)"
			} else {
				why += "the server sent chunks with text that are not tokens"
			}
			break
		}
	}
	return m, why, nil
}
