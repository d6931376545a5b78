package workload

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"reflect"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/inferrail/inferrail/internal/yamlerr"
)

// Limits that keep token arithmetic and up-front allocations sane.
const (
	// maxModelLenLimit bounds Config.MaxModelLen (and so every token count).
	maxModelLenLimit = 1 << 30
	// maxPromptSet bounds the number of pre-generated system prompts,
	// documents and benchmark prefixes.
	maxPromptSet = 1 << 20
	// maxBatchSize bounds w5.batch_size (a batch is generated at once).
	maxBatchSize = 1 << 20
	// maxBurstWindow bounds w5.burst_window.
	maxBurstWindow = 24 * time.Hour
	// maxArrivalCV bounds arrival.cv (gamma shape 1/cv² >= 1e-4).
	maxArrivalCV = 100
	// maxBurstEvery bounds w7.burst_every and w7.first_burst.
	maxBurstEvery = 24 * time.Hour
)

// Arrival processes (ArrivalParams.Process).
const (
	// ArrivalPoisson draws exponential inter-arrival times.
	ArrivalPoisson = "poisson"
	// ArrivalGamma draws gamma inter-arrival times of a given cv.
	ArrivalGamma = "gamma"
)

// Document orders of w4 (W4Params.Order).
const (
	// OrderRank places a prompt's documents most popular first.
	OrderRank = "rank"
	// OrderRandom places them in a uniformly random order.
	OrderRandom = "random"
)

// Config selects and parameterises a workload. Start from DefaultConfig or
// LoadConfig; New validates. Only the section of the selected workload (W1
// to W7) is used and validated; Mix applies to every workload.
type Config struct {
	// Workload is the generator: "w1" to "w7" (see Names).
	Workload string `yaml:"workload"`
	// Seed seeds every random stream of the run. Default 1.
	Seed uint64 `yaml:"seed"`
	// Rate is the offered load in requests per second. Open-loop arrivals
	// follow Arrival. For the closed-loop w2 and w3 it is the mean request
	// rate: sessions (tasks) start at Rate / mean turns (steps) per session,
	// the midpoint of turns_min..turns_max (steps_min..steps_max); sessions
	// cut short by max_model_len make the real rate lower. For w5 batches
	// start at Rate / w5.batch_size. For w7 it is the rate of the light
	// background stream only; the bursts come on top. Default 10 (w7: 2).
	Rate float64 `yaml:"rate"`
	// Arrival is the inter-arrival distribution of every open-loop process:
	// the requests of w1, w4 and w6, the session, task and batch starts
	// of w2, w3 and w5, and the background requests of w7 (not its
	// bursts).
	Arrival ArrivalParams `yaml:"arrival"`
	// Requests stops the run after this many requests in total, 0 for no
	// limit. Default 1000 (w7: 600, two bursts and their background).
	Requests int `yaml:"requests"`
	// Duration admits no arrival after this time, 0 for no limit (YAML: a
	// Go duration such as "10m"). At least one of Requests and Duration
	// must be set. Default 0.
	Duration time.Duration `yaml:"duration"`
	// Model is the model every request asks for. Default "sim-8b".
	Model string `yaml:"model"`
	// MaxModelLen is the context length: prompt + max_tokens never exceed
	// it. Default 32768.
	MaxModelLen int `yaml:"max_model_len"`
	// Output is the output length distribution.
	Output OutputParams `yaml:"output"`
	// Mix is the tenant/priority mix of every workload: each request (for
	// the closed-loop w2 and w3, each session, so that all its turns share
	// one class) draws its class with probability share / (sum of shares)
	// and gets the class's Tenant and Priority. The draws come from a
	// stream of their own, so a mix changes no other draw: the same seed
	// gives the same prompts, outputs and arrivals with or without it.
	// Empty (the default): every request has tenant "" and priority 0. At
	// most 64 classes, each with a distinct (tenant, priority).
	Mix []MixClass `yaml:"mix,omitempty"`
	// Tenants gives tenants of the mix rate limits, as API keys have in
	// live: tenant -> {rpm, tpm, max_concurrency}, 0 meaning unlimited (see
	// TenantLimits). The simulator charges every request of a listed
	// tenant against its tenant's bucket at arrival, before the gateway;
	// a refused request is answered at once (rejected, reason
	// rate_limited). A tenant without an entry, and a request without a
	// tenant, is not limited. Every key must be a tenant of Mix. Empty
	// (the default): no limits.
	Tenants Tenants `yaml:"tenants,omitempty"`
	// WithoutTenants leaves these tenants of Mix out of the run: their
	// requests are still drawn, so every other request (prompt, output,
	// arrival, class) is exactly the one the whole workload sends, but
	// they are never sent. It is the baseline of an isolation experiment,
	// the same traffic without a noisy tenant. With requests, the count
	// includes the left-out requests (a run sends fewer); for the
	// closed-loop w2 and w3 a left-out session ends at its first turn, and
	// the other sessions' later turns still depend on how fast the fleet
	// answers. Each must be a tenant of Mix, listed once, and at least one
	// class must remain. Empty (the default): every tenant is sent.
	WithoutTenants []string `yaml:"without_tenants,omitempty"`
	// W1 parameterises workload w1 (shared system prompts).
	W1 W1Params `yaml:"w1"`
	// W2 parameterises workload w2 (multi-turn chat).
	W2 W2Params `yaml:"w2"`
	// W3 parameterises workload w3 (agent loops).
	W3 W3Params `yaml:"w3"`
	// W4 parameterises workload w4 (RAG over popular documents).
	W4 W4Params `yaml:"w4"`
	// W5 parameterises workload w5 (few-shot evaluation batches).
	W5 W5Params `yaml:"w5"`
	// W6 parameterises workload w6 (no sharing).
	W6 W6Params `yaml:"w6"`
	// W7 parameterises workload w7 (overload bursts).
	W7 W7Params `yaml:"w7"`
}

// ArrivalParams is an open-loop arrival process: a renewal process whose
// inter-arrival times have mean 1/rate. Poisson gaps are exponential (cv 1);
// gamma gaps have shape k = 1/cv² and scale = mean/k, so cv > 1 is burstier
// than Poisson (clumps of arrivals, then lulls) and cv < 1 smoother. Gamma
// with cv 1 has the distribution of Poisson but not its random stream.
type ArrivalParams struct {
	// Process is "poisson" or "gamma". Default "poisson".
	Process string `yaml:"process"`
	// CV is the coefficient of variation (stddev / mean) of the gamma
	// inter-arrival times, in (0, 100]; it must be 1 for poisson.
	// Default 1.
	CV float64 `yaml:"cv"`
}

// OutputParams is the output length distribution: log-normal with the given
// median and sigma, rounded and clamped to [Min, MaxTokens]. Every request's
// max_tokens is MaxTokens. w3 and w5 have short outputs of their own median
// and sigma (w3.output_median_tokens, w5.output_median_tokens, ...) and use
// only Min and MaxTokens from here.
type OutputParams struct {
	// Median is the median output length in tokens. Default 200.
	Median float64 `yaml:"median"`
	// Sigma is the log-normal shape (std. dev. of the log). Default 0.9.
	Sigma float64 `yaml:"sigma"`
	// Min is the shortest output, at least 1. Default 8.
	Min int `yaml:"min"`
	// MaxTokens is every request's max_tokens and the longest output.
	// Default 1024.
	MaxTokens int `yaml:"max_tokens"`
}

// W1Params parameterises w1: each request is one of Prompts system prompts
// (lengths fixed per seed) followed by a fresh question.
type W1Params struct {
	// Prompts is the number of distinct system prompts. Default 32.
	Prompts int `yaml:"prompts"`
	// PromptMinTokens is the shortest system prompt. Default 2048.
	PromptMinTokens int `yaml:"prompt_min_tokens"`
	// PromptMaxTokens is the longest system prompt. Default 8192.
	PromptMaxTokens int `yaml:"prompt_max_tokens"`
	// PopularityZipf is the Zipf exponent of system prompt popularity: 0
	// is uniform, larger skews towards the first prompts. Default 0.
	PopularityZipf float64 `yaml:"popularity_zipf"`
	// QuestionMinTokens is the shortest question. Default 50.
	QuestionMinTokens int `yaml:"question_min_tokens"`
	// QuestionMaxTokens is the longest question. Default 500.
	QuestionMaxTokens int `yaml:"question_max_tokens"`
}

// W2Params parameterises w2: closed-loop multi-turn chat sessions.
type W2Params struct {
	// SystemPrompts is the number of shared system prompts. Default 4.
	SystemPrompts int `yaml:"system_prompts"`
	// SystemMinTokens is the shortest system prompt. Default 200.
	SystemMinTokens int `yaml:"system_min_tokens"`
	// SystemMaxTokens is the longest system prompt. Default 1000.
	SystemMaxTokens int `yaml:"system_max_tokens"`
	// TurnsMin is the fewest turns per session, at least 1. Default 2.
	TurnsMin int `yaml:"turns_min"`
	// TurnsMax is the most turns per session. Default 10.
	TurnsMax int `yaml:"turns_max"`
	// UserMedianTokens is the median user message length. Default 100.
	UserMedianTokens float64 `yaml:"user_median_tokens"`
	// UserSigma is the log-normal shape of user message lengths.
	// Default 0.8.
	UserSigma float64 `yaml:"user_sigma"`
	// UserMinTokens is the shortest user message. Default 10.
	UserMinTokens int `yaml:"user_min_tokens"`
	// UserMaxTokens is the longest user message. Default 1000.
	UserMaxTokens int `yaml:"user_max_tokens"`
	// ThinkMin is the shortest think time between a turn's completion and
	// the next turn's arrival, > 0. Default 10s.
	ThinkMin time.Duration `yaml:"think_min"`
	// ThinkMax is the longest think time. Default 20s.
	ThinkMax time.Duration `yaml:"think_max"`
}

// W3Params parameterises w3: closed-loop agent tasks. A task's first step
// sends [system prompt, task description]; every later step resends the
// previous step's prompt followed by that step's output (the model's tool
// call) and a fresh tool result. The next step arrives a tool latency after
// the previous completes. A task's steps are drawn when it starts: a number
// uniform in [steps_min, steps_max], cut to the steps whose prompt plus
// max_tokens fit max_model_len (so a task may run fewer than steps_min); a
// failed step, or a next arrival after duration, ends it early.
type W3Params struct {
	// AgentTypes is the number of agent types; each has one system prompt
	// (lengths fixed per seed), chosen uniformly per task. Default 4.
	AgentTypes int `yaml:"agent_types"`
	// SystemMinTokens is the shortest system prompt. Default 1000.
	SystemMinTokens int `yaml:"system_min_tokens"`
	// SystemMaxTokens is the longest system prompt. Default 4000.
	SystemMaxTokens int `yaml:"system_max_tokens"`
	// TaskMinTokens is the shortest task description (fresh per task).
	// Default 100.
	TaskMinTokens int `yaml:"task_min_tokens"`
	// TaskMaxTokens is the longest task description. Default 1000.
	TaskMaxTokens int `yaml:"task_max_tokens"`
	// ToolResultMinTokens is the shortest tool result (fresh per step,
	// uniform). Default 50.
	ToolResultMinTokens int `yaml:"tool_result_min_tokens"`
	// ToolResultMaxTokens is the longest tool result. Default 2000.
	ToolResultMaxTokens int `yaml:"tool_result_max_tokens"`
	// OutputMedianTokens is the median step output (log-normal, clamped
	// to [output.min, output.max_tokens]). Default 60.
	OutputMedianTokens float64 `yaml:"output_median_tokens"`
	// OutputSigma is the log-normal shape of step outputs. Default 0.6.
	OutputSigma float64 `yaml:"output_sigma"`
	// StepsMin is the fewest planned steps per task, at least 1.
	// Default 3.
	StepsMin int `yaml:"steps_min"`
	// StepsMax is the most planned steps per task (uniform in
	// [steps_min, steps_max]). Default 20.
	StepsMax int `yaml:"steps_max"`
	// ToolLatencyMin is the shortest delay between a step's completion and
	// the next step's arrival, > 0. Default 200ms.
	ToolLatencyMin time.Duration `yaml:"tool_latency_min"`
	// ToolLatencyMax is the longest tool latency (uniform). Default 2s.
	ToolLatencyMax time.Duration `yaml:"tool_latency_max"`
}

// W4Params parameterises w4: retrieval-augmented generation over a corpus
// of documents with Zipf popularity. Each request is [system prompt,
// docs_per_prompt distinct documents, fresh question]. With order "rank" the
// documents are placed most popular first, so two requests that retrieved
// the same most popular documents share the system prompt and those
// documents as a prefix; "random" shuffles them, which keeps the documents
// shared but mostly breaks the prefix after the system prompt.
type W4Params struct {
	// SystemTokens is the length of the one shared system prompt; 0 for
	// none. Default 300.
	SystemTokens int `yaml:"system_tokens"`
	// Documents is the corpus size; document i (from 0) has popularity
	// rank i+1. Default 1000.
	Documents int `yaml:"documents"`
	// DocMinTokens is the shortest document (lengths fixed per seed,
	// uniform). Default 300.
	DocMinTokens int `yaml:"doc_min_tokens"`
	// DocMaxTokens is the longest document. Default 1500.
	DocMaxTokens int `yaml:"doc_max_tokens"`
	// PopularityZipf is the Zipf exponent of document popularity: rank r
	// has weight 1/r^s; 0 is uniform. Default 1.0.
	PopularityZipf float64 `yaml:"popularity_zipf"`
	// DocsPerPrompt is the number of distinct documents per request, in
	// [1, documents], drawn by popularity without replacement. Default 4.
	DocsPerPrompt int `yaml:"docs_per_prompt"`
	// Order is the order of a prompt's documents: "rank" (most popular
	// first) or "random" (uniformly shuffled). Default "rank".
	Order string `yaml:"order"`
	// QuestionMinTokens is the shortest question. Default 20.
	QuestionMinTokens int `yaml:"question_min_tokens"`
	// QuestionMaxTokens is the longest question. Default 200.
	QuestionMaxTokens int `yaml:"question_max_tokens"`
}

// W5Params parameterises w5: few-shot evaluation batches. Batch starts are
// the open-loop arrival process at Rate / batch_size; a batch's requests
// arrive uniformly within burst_window of its start and share one long
// few-shot prefix, each followed by a fresh question. Requests are handed
// out in arrival order, merged across overlapping batches.
type W5Params struct {
	// BatchSize is the number of requests per batch. Default 64.
	BatchSize int `yaml:"batch_size"`
	// BurstWindow is how long after its start a batch's requests arrive
	// (uniform), in [0, 24h]; 0 puts them all at the start. Default 1s.
	BurstWindow time.Duration `yaml:"burst_window"`
	// Benchmarks is the number of few-shot prefixes (lengths fixed per
	// seed), one chosen uniformly per batch and so reused across batches;
	// 0 gives every batch a fresh prefix. Default 8.
	Benchmarks int `yaml:"benchmarks"`
	// PrefixMinTokens is the shortest few-shot prefix. Default 2000.
	PrefixMinTokens int `yaml:"prefix_min_tokens"`
	// PrefixMaxTokens is the longest few-shot prefix. Default 6000.
	PrefixMaxTokens int `yaml:"prefix_max_tokens"`
	// QuestionMinTokens is the shortest question. Default 50.
	QuestionMinTokens int `yaml:"question_min_tokens"`
	// QuestionMaxTokens is the longest question. Default 300.
	QuestionMaxTokens int `yaml:"question_max_tokens"`
	// OutputMedianTokens is the median answer (log-normal, clamped to
	// [output.min, output.max_tokens]). Default 20.
	OutputMedianTokens float64 `yaml:"output_median_tokens"`
	// OutputSigma is the log-normal shape of answers. Default 0.5.
	OutputSigma float64 `yaml:"output_sigma"`
}

// W6Params parameterises w6: every prompt is one fresh segment.
type W6Params struct {
	// InputMedianTokens is the median prompt length. Default 800.
	InputMedianTokens float64 `yaml:"input_median_tokens"`
	// InputSigma is the log-normal shape of prompt lengths. Default 0.8.
	InputSigma float64 `yaml:"input_sigma"`
	// InputMinTokens is the shortest prompt. Default 32.
	InputMinTokens int `yaml:"input_min_tokens"`
	// InputMaxTokens is the longest prompt. Default 8192.
	InputMaxTokens int `yaml:"input_max_tokens"`
}

// W7Params parameterises w7, overload bursts: bursts of heavy requests, each
// burst far more than the fleet's KV cache holds, over a light background
// stream. Burst k (from 0) starts at first_burst + k × burst_every and its
// burst_requests heavy requests arrive uniformly at random within
// [start, start + burst_window]. A heavy prompt is [shared system prompt of
// heavy_shared_tokens (one segment for the whole run), fresh text], of
// total length uniform in [heavy_prompt_min_tokens,
// heavy_prompt_max_tokens]; its max_tokens is heavy_max_tokens and its true
// output is drawn from Output (log-normal) clamped to [output.min,
// heavy_max_tokens]. The background is the open-loop process of Config.Rate
// and Config.Arrival, of light requests whose prompt is one fresh segment
// uniform in [light_prompt_min_tokens, light_prompt_max_tokens], with
// Output's lengths and max_tokens. Both streams are merged in arrival order
// (a heavy request first on a tie); Session and Turn are always 0.
//
// Sizing of the defaults against the default fleet: engine.DefaultConfig
// has BlockSize 16 and NumGPUBlocks 4096 (64Ki tokens) per replica, so 4
// default replicas hold 16,384 blocks (262,144 tokens). One default burst
// asks for 200 × (mean prompt 7,350 + max_tokens 512) = 1,572,400 tokens =
// 98,275 blocks ≈ 6.0 × 16,384 (5.998×; with each request rounded up to
// whole blocks as engine.Add sizes it, ≈ 98,360; seed 1's first burst
// draws 98,748, 6.03×). Less is really resident: the shared 256-token
// prefix (16 blocks) is cached once per replica, which leaves ≈ 5.8× in
// distinct blocks, and outputs have median 200 (mean ≈ 243 after the clamp
// at 512), so a burst's prompts plus true outputs are ≈ 5.8× too. One heavy
// request needs ≈ 492 blocks (545 at most), so a default replica holds
// about 8 at once.
// (Prompts of 1,200..1,600 tokens would give only 200 × 1,912 / 16 =
// 23,900 blocks ≈ 1.46×, hence the longer prompts.) The background adds
// 2 req/s of ≈ 250-token prompts. With Requests 600 a default run has two
// full bursts (at 10s and 70s) and 200 background requests, ending at
// about 100s (92s with seed 1), well before a third burst at 130s.
type W7Params struct {
	// BurstRequests is the number of heavy requests per burst.
	// Default 200.
	BurstRequests int `yaml:"burst_requests"`
	// BurstEvery is the time between burst starts, in (0, 24h].
	// Default 60s.
	BurstEvery time.Duration `yaml:"burst_every"`
	// BurstWindow is the span over which one burst's arrivals are spread
	// (uniform), in [0, burst_every]: bursts never overlap. 0 puts a
	// burst's requests all at its start. Default 1s.
	BurstWindow time.Duration `yaml:"burst_window"`
	// FirstBurst is the start of the first burst, in [0, 24h]; before it
	// only the background runs. Default 10s.
	FirstBurst time.Duration `yaml:"first_burst"`
	// HeavySharedTokens is the length of the system prompt every heavy
	// prompt starts with, in [0, heavy_prompt_min_tokens); 0 for none (a
	// heavy prompt is then one fresh segment). Default 256.
	HeavySharedTokens int `yaml:"heavy_shared_tokens"`
	// HeavyPromptMinTokens is the shortest heavy prompt, shared system
	// prompt included. Default 6500.
	HeavyPromptMinTokens int `yaml:"heavy_prompt_min_tokens"`
	// HeavyPromptMaxTokens is the longest heavy prompt. Default 8200.
	HeavyPromptMaxTokens int `yaml:"heavy_prompt_max_tokens"`
	// HeavyMaxTokens is every heavy request's max_tokens and its longest
	// output, at least output.min. Default 512.
	HeavyMaxTokens int `yaml:"heavy_max_tokens"`
	// LightPromptMinTokens is the shortest background prompt. Default 100.
	LightPromptMinTokens int `yaml:"light_prompt_min_tokens"`
	// LightPromptMaxTokens is the longest background prompt. Default 400.
	LightPromptMaxTokens int `yaml:"light_prompt_max_tokens"`
}

// Names returns the workload names New accepts.
func Names() []string { return []string{"w1", "w2", "w3", "w4", "w5", "w6", "w7"} }

// ClosedLoop reports whether a workload's requests come from sessions that
// react to completions (w2's chats, w3's agent tasks): its rate ramps up
// over a session's lifetime and winds down once no session starts, so a
// short run never holds Config.Rate.
func ClosedLoop(name string) bool { return name == "w2" || name == "w3" }

func knownWorkload(name string) bool {
	for _, n := range Names() {
		if n == name {
			return true
		}
	}
	return false
}

// DefaultConfig returns the default configuration of the named workload.
// Every parameter section is filled, not only the selected one. The common
// fields are the same for every workload except Rate and Requests of w7.
func DefaultConfig(workload string) (Config, error) {
	if !knownWorkload(workload) {
		return Config{}, fmt.Errorf("unknown workload %q: want one of %s", workload, strings.Join(Names(), ", "))
	}
	c := Config{
		Workload:    workload,
		Seed:        1,
		Rate:        10,
		Requests:    1000,
		Model:       "sim-8b",
		MaxModelLen: 32768,
		Arrival:     ArrivalParams{Process: ArrivalPoisson, CV: 1},
		Output:      OutputParams{Median: 200, Sigma: 0.9, Min: 8, MaxTokens: 1024},
		W1: W1Params{
			Prompts:           32,
			PromptMinTokens:   2048,
			PromptMaxTokens:   8192,
			QuestionMinTokens: 50,
			QuestionMaxTokens: 500,
		},
		W2: W2Params{
			SystemPrompts:    4,
			SystemMinTokens:  200,
			SystemMaxTokens:  1000,
			TurnsMin:         2,
			TurnsMax:         10,
			UserMedianTokens: 100,
			UserSigma:        0.8,
			UserMinTokens:    10,
			UserMaxTokens:    1000,
			ThinkMin:         10 * time.Second,
			ThinkMax:         20 * time.Second,
		},
		W3: W3Params{
			AgentTypes:          4,
			SystemMinTokens:     1000,
			SystemMaxTokens:     4000,
			TaskMinTokens:       100,
			TaskMaxTokens:       1000,
			ToolResultMinTokens: 50,
			ToolResultMaxTokens: 2000,
			OutputMedianTokens:  60,
			OutputSigma:         0.6,
			StepsMin:            3,
			StepsMax:            20,
			ToolLatencyMin:      200 * time.Millisecond,
			ToolLatencyMax:      2 * time.Second,
		},
		W4: W4Params{
			SystemTokens:      300,
			Documents:         1000,
			DocMinTokens:      300,
			DocMaxTokens:      1500,
			PopularityZipf:    1.0,
			DocsPerPrompt:     4,
			Order:             OrderRank,
			QuestionMinTokens: 20,
			QuestionMaxTokens: 200,
		},
		W5: W5Params{
			BatchSize:          64,
			BurstWindow:        time.Second,
			Benchmarks:         8,
			PrefixMinTokens:    2000,
			PrefixMaxTokens:    6000,
			QuestionMinTokens:  50,
			QuestionMaxTokens:  300,
			OutputMedianTokens: 20,
			OutputSigma:        0.5,
		},
		W6: W6Params{
			InputMedianTokens: 800,
			InputSigma:        0.8,
			InputMinTokens:    32,
			InputMaxTokens:    8192,
		},
		W7: W7Params{
			BurstRequests:        200,
			BurstEvery:           60 * time.Second,
			BurstWindow:          time.Second,
			FirstBurst:           10 * time.Second,
			HeavySharedTokens:    256,
			HeavyPromptMinTokens: 6500,
			HeavyPromptMaxTokens: 8200,
			HeavyMaxTokens:       512,
			LightPromptMinTokens: 100,
			LightPromptMaxTokens: 400,
		},
	}
	if workload == "w7" {
		c.Rate = 2
		c.Requests = 600
	}
	return c, nil
}

// FieldError is one invalid configuration field. Field is its YAML path,
// such as "w1.prompt_min_tokens".
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// fieldErrors is every FieldError of one Validate call.
type fieldErrors []error

func (es fieldErrors) Error() string {
	msgs := make([]string, len(es))
	for i, e := range es {
		msgs[i] = e.Error()
	}
	return "invalid workload config: " + strings.Join(msgs, "; ")
}

func (es fieldErrors) Unwrap() []error { return es }

// checker collects FieldErrors.
type checker struct{ errs fieldErrors }

func (k *checker) fail(field, format string, args ...any) {
	k.errs = append(k.errs, &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)})
}

// count checks lo <= v <= hi.
func (k *checker) count(field string, v, lo, hi int) {
	if v < lo || v > hi {
		k.fail(field, "must be in [%d, %d], got %d", lo, hi, v)
	}
}

// span checks a [min, max] pair of token counts within [lo, hi].
func (k *checker) span(minField, maxField string, vmin, vmax, lo, hi int) {
	k.count(minField, vmin, lo, hi)
	k.count(maxField, vmax, lo, hi)
	if vmin > vmax {
		k.fail(minField, "must be at most %s (%d), got %d", maxField, vmax, vmin)
	}
}

// positive checks a finite v > 0.
func (k *checker) positive(field string, v float64) {
	if !(v > 0) || math.IsInf(v, 0) {
		k.fail(field, "must be a finite number > 0, got %v", v)
	}
}

// nonNegative checks a finite v >= 0.
func (k *checker) nonNegative(field string, v float64) {
	if !(v >= 0) || math.IsInf(v, 0) {
		k.fail(field, "must be a finite number >= 0, got %v", v)
	}
}

// fits checks that the longest prompt plus max_tokens fits max_model_len.
func (k *checker) fits(c *Config, what string, longest int) {
	if longest+c.Output.MaxTokens > c.MaxModelLen {
		k.fail("max_model_len", "must be at least %s + output.max_tokens = %d, got %d",
			what, longest+c.Output.MaxTokens, c.MaxModelLen)
	}
}

// Bounds of a run that keeps every request's record (a simulation, a
// bench run), far above any real study: they stop a typo (1e12 for 1e2)
// from running for days or exhausting memory. A generator alone is not
// bounded (Validate does not check them): its requests can be drawn
// without end.
const (
	// MaxRequests bounds one run's requests, far above any real study, so a
	// typo (1e12 for 1e2) does not run for days; a simulation's memory does
	// not grow with its length (results.Accumulator), a comparison's does
	// (it keeps each request's record for its charts).
	MaxRequests = 10_000_000
	// MaxRate bounds the offered load, in requests per second.
	MaxRate = 1_000_000
)

// CheckLength reports a run longer than MaxRequests: requests (0: no
// limit) or, without a limit, duration at rate. fleet.Config.Validate and
// compare.Spec.Validate call it.
func CheckLength(requests int, duration time.Duration, rate float64) error {
	if requests > MaxRequests {
		return fmt.Errorf("requests: must be at most %d, got %d (split a longer study into runs, or shard it: compare plan)", MaxRequests, requests)
	}
	if requests == 0 && duration > 0 {
		if n := rate * duration.Seconds(); n > MaxRequests {
			return fmt.Errorf("duration: %v at %g requests per second is about %.3g requests, more than the %d one run holds: shorten the duration, lower the rate or cap the requests", duration, rate, n, MaxRequests)
		}
	}
	return nil
}

// Validate checks the common fields and the selected workload's section. The
// error lists every invalid field by its YAML path and what is allowed;
// errors.As finds each *FieldError.
func (c *Config) Validate() error {
	var k checker
	if !knownWorkload(c.Workload) {
		k.fail("workload", "must be one of %s, got %q", strings.Join(Names(), ", "), c.Workload)
	}
	k.positive("rate", c.Rate)
	if c.Rate > MaxRate {
		k.fail("rate", "must be at most %d requests per second, got %v", MaxRate, c.Rate)
	}
	if c.Requests < 0 {
		k.fail("requests", "must be >= 0 (0 = no limit), got %d", c.Requests)
	}
	if c.Duration < 0 {
		k.fail("duration", "must be >= 0 (0 = no limit), got %v", c.Duration)
	}
	if c.Requests == 0 && c.Duration == 0 {
		k.fail("requests", "requests or duration must be set (> 0)")
	}
	if c.Model == "" {
		k.fail("model", "must not be empty")
	}
	k.count("max_model_len", c.MaxModelLen, 2, maxModelLenLimit)
	lim := max(c.MaxModelLen, 1)
	k.positive("output.median", c.Output.Median)
	k.nonNegative("output.sigma", c.Output.Sigma)
	k.span("output.min", "output.max_tokens", c.Output.Min, c.Output.MaxTokens, 1, lim)
	switch c.Arrival.Process {
	case ArrivalPoisson:
		if c.Arrival.CV != 1 {
			k.fail("arrival.cv", "must be 1 with arrival.process %s (use %s for another cv), got %v",
				ArrivalPoisson, ArrivalGamma, c.Arrival.CV)
		}
	case ArrivalGamma:
		if !(c.Arrival.CV > 0 && c.Arrival.CV <= maxArrivalCV) {
			k.fail("arrival.cv", "must be in (0, %d], got %v", maxArrivalCV, c.Arrival.CV)
		}
	default:
		k.fail("arrival.process", "must be %s or %s, got %q", ArrivalPoisson, ArrivalGamma, c.Arrival.Process)
	}
	k.mix(c.Mix)
	k.tenants(c)
	if len(k.errs) > 0 {
		// Per-workload checks below rely on sane common fields.
		return k.errs
	}
	switch c.Workload {
	case "w1":
		p := &c.W1
		k.count("w1.prompts", p.Prompts, 1, maxPromptSet)
		k.span("w1.prompt_min_tokens", "w1.prompt_max_tokens", p.PromptMinTokens, p.PromptMaxTokens, 1, lim)
		k.nonNegative("w1.popularity_zipf", p.PopularityZipf)
		k.span("w1.question_min_tokens", "w1.question_max_tokens", p.QuestionMinTokens, p.QuestionMaxTokens, 1, lim)
		if len(k.errs) == 0 {
			k.fits(c, "w1.prompt_max_tokens + w1.question_max_tokens", p.PromptMaxTokens+p.QuestionMaxTokens)
		}
	case "w2":
		p := &c.W2
		k.count("w2.system_prompts", p.SystemPrompts, 1, maxPromptSet)
		k.span("w2.system_min_tokens", "w2.system_max_tokens", p.SystemMinTokens, p.SystemMaxTokens, 1, lim)
		k.span("w2.turns_min", "w2.turns_max", p.TurnsMin, p.TurnsMax, 1, maxModelLenLimit)
		k.positive("w2.user_median_tokens", p.UserMedianTokens)
		k.nonNegative("w2.user_sigma", p.UserSigma)
		k.span("w2.user_min_tokens", "w2.user_max_tokens", p.UserMinTokens, p.UserMaxTokens, 1, lim)
		if p.ThinkMin <= 0 {
			k.fail("w2.think_min", "must be > 0 (a follow-up arrives after its predecessor completes), got %v", p.ThinkMin)
		}
		if p.ThinkMax < p.ThinkMin {
			k.fail("w2.think_max", "must be at least w2.think_min (%v), got %v", p.ThinkMin, p.ThinkMax)
		}
		if len(k.errs) == 0 {
			k.fits(c, "w2.system_max_tokens + w2.user_max_tokens", p.SystemMaxTokens+p.UserMaxTokens)
		}
	case "w3":
		p := &c.W3
		k.count("w3.agent_types", p.AgentTypes, 1, maxPromptSet)
		k.span("w3.system_min_tokens", "w3.system_max_tokens", p.SystemMinTokens, p.SystemMaxTokens, 1, lim)
		k.span("w3.task_min_tokens", "w3.task_max_tokens", p.TaskMinTokens, p.TaskMaxTokens, 1, lim)
		k.span("w3.tool_result_min_tokens", "w3.tool_result_max_tokens", p.ToolResultMinTokens, p.ToolResultMaxTokens, 1, lim)
		k.positive("w3.output_median_tokens", p.OutputMedianTokens)
		k.nonNegative("w3.output_sigma", p.OutputSigma)
		k.span("w3.steps_min", "w3.steps_max", p.StepsMin, p.StepsMax, 1, maxModelLenLimit)
		if p.ToolLatencyMin <= 0 {
			k.fail("w3.tool_latency_min", "must be > 0 (a step arrives after its predecessor completes), got %v", p.ToolLatencyMin)
		}
		if p.ToolLatencyMax < p.ToolLatencyMin {
			k.fail("w3.tool_latency_max", "must be at least w3.tool_latency_min (%v), got %v", p.ToolLatencyMin, p.ToolLatencyMax)
		}
		if len(k.errs) == 0 {
			k.fits(c, "w3.system_max_tokens + w3.task_max_tokens", p.SystemMaxTokens+p.TaskMaxTokens)
		}
	case "w4":
		p := &c.W4
		k.count("w4.system_tokens", p.SystemTokens, 0, lim)
		k.count("w4.documents", p.Documents, 1, maxPromptSet)
		k.span("w4.doc_min_tokens", "w4.doc_max_tokens", p.DocMinTokens, p.DocMaxTokens, 1, lim)
		k.nonNegative("w4.popularity_zipf", p.PopularityZipf)
		k.count("w4.docs_per_prompt", p.DocsPerPrompt, 1, max(min(p.Documents, maxPromptSet), 1))
		if p.Order != OrderRank && p.Order != OrderRandom {
			k.fail("w4.order", "must be %s or %s, got %q", OrderRank, OrderRandom, p.Order)
		}
		k.span("w4.question_min_tokens", "w4.question_max_tokens", p.QuestionMinTokens, p.QuestionMaxTokens, 1, lim)
		if len(k.errs) == 0 {
			k.fits(c, "w4.system_tokens + w4.docs_per_prompt × w4.doc_max_tokens + w4.question_max_tokens",
				p.SystemTokens+p.DocsPerPrompt*p.DocMaxTokens+p.QuestionMaxTokens)
		}
	case "w5":
		p := &c.W5
		k.count("w5.batch_size", p.BatchSize, 1, maxBatchSize)
		if p.BurstWindow < 0 || p.BurstWindow > maxBurstWindow {
			k.fail("w5.burst_window", "must be in [0, %v], got %v", maxBurstWindow, p.BurstWindow)
		}
		k.count("w5.benchmarks", p.Benchmarks, 0, maxPromptSet)
		k.span("w5.prefix_min_tokens", "w5.prefix_max_tokens", p.PrefixMinTokens, p.PrefixMaxTokens, 1, lim)
		k.span("w5.question_min_tokens", "w5.question_max_tokens", p.QuestionMinTokens, p.QuestionMaxTokens, 1, lim)
		k.positive("w5.output_median_tokens", p.OutputMedianTokens)
		k.nonNegative("w5.output_sigma", p.OutputSigma)
		if len(k.errs) == 0 {
			k.fits(c, "w5.prefix_max_tokens + w5.question_max_tokens", p.PrefixMaxTokens+p.QuestionMaxTokens)
		}
	case "w6":
		p := &c.W6
		k.positive("w6.input_median_tokens", p.InputMedianTokens)
		k.nonNegative("w6.input_sigma", p.InputSigma)
		k.span("w6.input_min_tokens", "w6.input_max_tokens", p.InputMinTokens, p.InputMaxTokens, 1, lim)
		if len(k.errs) == 0 {
			k.fits(c, "w6.input_max_tokens", p.InputMaxTokens)
		}
	case "w7":
		p := &c.W7
		k.count("w7.burst_requests", p.BurstRequests, 1, maxBatchSize)
		if p.BurstEvery <= 0 || p.BurstEvery > maxBurstEvery {
			k.fail("w7.burst_every", "must be in (0, %v], got %v", maxBurstEvery, p.BurstEvery)
		}
		if p.BurstWindow < 0 || p.BurstWindow > max(p.BurstEvery, 0) {
			k.fail("w7.burst_window", "must be in [0, w7.burst_every (%v)] (bursts must not overlap), got %v", p.BurstEvery, p.BurstWindow)
		}
		if p.FirstBurst < 0 || p.FirstBurst > maxBurstEvery {
			k.fail("w7.first_burst", "must be in [0, %v], got %v", maxBurstEvery, p.FirstBurst)
		}
		k.span("w7.heavy_prompt_min_tokens", "w7.heavy_prompt_max_tokens", p.HeavyPromptMinTokens, p.HeavyPromptMaxTokens, 1, lim)
		if p.HeavySharedTokens < 0 || p.HeavySharedTokens >= p.HeavyPromptMinTokens {
			k.fail("w7.heavy_shared_tokens", "must be in [0, w7.heavy_prompt_min_tokens (%d)), got %d", p.HeavyPromptMinTokens, p.HeavySharedTokens)
		}
		if p.HeavyMaxTokens < c.Output.Min || p.HeavyMaxTokens > lim {
			k.fail("w7.heavy_max_tokens", "must be in [output.min (%d), max_model_len (%d)], got %d", c.Output.Min, lim, p.HeavyMaxTokens)
		}
		k.span("w7.light_prompt_min_tokens", "w7.light_prompt_max_tokens", p.LightPromptMinTokens, p.LightPromptMaxTokens, 1, lim)
		if len(k.errs) == 0 {
			if n := p.HeavyPromptMaxTokens + p.HeavyMaxTokens; n > c.MaxModelLen {
				k.fail("max_model_len", "must be at least w7.heavy_prompt_max_tokens + w7.heavy_max_tokens = %d, got %d", n, c.MaxModelLen)
			}
			k.fits(c, "w7.light_prompt_max_tokens", p.LightPromptMaxTokens)
		}
	}
	if len(k.errs) > 0 {
		return k.errs
	}
	return nil
}

// LoadConfig reads a YAML workload config: it starts from the DefaultConfig
// of the file's `workload:` key and overlays the file. Decoding is strict
// (an unknown key is an error naming it) and the result is validated.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("load workload config: %w", err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("load workload config %s: %w", path, err)
	}
	return c, nil
}

// ParseConfig is LoadConfig on YAML text.
func ParseConfig(data []byte) (Config, error) {
	var head struct {
		Workload string `yaml:"workload"`
	}
	if err := yaml.Unmarshal(data, &head); err != nil {
		return Config{}, fmt.Errorf("parse workload config: %w", err)
	}
	if head.Workload == "" {
		return Config{}, fmt.Errorf("parse workload config: workload: missing, want one of %s", strings.Join(Names(), ", "))
	}
	c, err := DefaultConfig(head.Workload)
	if err != nil {
		return Config{}, fmt.Errorf("parse workload config: workload: %w", err)
	}
	if err := Overlay(&c, data); err != nil {
		return Config{}, err
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Overlay decodes one YAML document onto c: fields the document sets are
// replaced, the others kept. Decoding is strict (an unknown key is an error
// naming it); on error c is unchanged. Overlay does not validate, so several
// overlays may pass through invalid states: call Validate after the last.
func Overlay(c *Config, data []byte) error {
	next := *c
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&next); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("parse workload config: %w", yamlerr.Explain(err, reflect.TypeFor[Config]()))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return errors.New("parse workload config: more than one YAML document")
	}
	*c = next
	return nil
}

// New validates c and returns a Source for its workload.
func New(c Config) (Source, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	var src Source
	switch c.Workload {
	case "w1":
		src = newW1(&c)
	case "w2":
		src = newW2(&c)
	case "w3":
		src = newW3(&c)
	case "w4":
		src = newW4(&c)
	case "w5":
		src = newW5(&c)
	case "w6":
		src = newW6(&c)
	default: // "w7", by Validate
		src = newW7(&c)
	}
	if len(c.WithoutTenants) > 0 {
		src = newWithoutTenants(src, c.WithoutTenants)
	}
	return src, nil
}
