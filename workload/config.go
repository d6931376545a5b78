package workload

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Limits that keep token arithmetic and up-front allocations sane.
const (
	// maxModelLenLimit bounds Config.MaxModelLen (and so every token count).
	maxModelLenLimit = 1 << 30
	// maxPromptSet bounds the number of pre-generated system prompts.
	maxPromptSet = 1 << 20
)

// Config selects and parameterises a workload. Start from DefaultConfig or
// LoadConfig; New validates. Only the section of the selected workload (W1,
// W2 or W6) is used and validated.
type Config struct {
	// Workload is the generator: "w1", "w2" or "w6" (see Names).
	Workload string `yaml:"workload"`
	// Seed seeds every random stream of the run. Default 1.
	Seed uint64 `yaml:"seed"`
	// Rate is the offered load in requests per second; arrivals are
	// Poisson. For w2 it is the mean request rate: sessions start at
	// Rate / mean turns per session. Default 10.
	Rate float64 `yaml:"rate"`
	// Requests stops the run after this many requests in total, 0 for no
	// limit. Default 1000.
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
	// W1 parameterises workload w1 (shared system prompts).
	W1 W1Params `yaml:"w1"`
	// W2 parameterises workload w2 (multi-turn chat).
	W2 W2Params `yaml:"w2"`
	// W6 parameterises workload w6 (no sharing).
	W6 W6Params `yaml:"w6"`
}

// OutputParams is the output length distribution: log-normal with the given
// median and sigma, rounded and clamped to [Min, MaxTokens]. Every request's
// max_tokens is MaxTokens.
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

// Names returns the workload names New accepts.
func Names() []string { return []string{"w1", "w2", "w6"} }

func knownWorkload(name string) bool {
	for _, n := range Names() {
		if n == name {
			return true
		}
	}
	return false
}

// DefaultConfig returns the default configuration of the named workload.
// Every parameter section is filled, not only the selected one.
func DefaultConfig(workload string) (Config, error) {
	if !knownWorkload(workload) {
		return Config{}, fmt.Errorf("unknown workload %q: want one of %s", workload, strings.Join(Names(), ", "))
	}
	return Config{
		Workload:    workload,
		Seed:        1,
		Rate:        10,
		Requests:    1000,
		Model:       "sim-8b",
		MaxModelLen: 32768,
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
		W6: W6Params{
			InputMedianTokens: 800,
			InputSigma:        0.8,
			InputMinTokens:    32,
			InputMaxTokens:    8192,
		},
	}, nil
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

// Validate checks the common fields and the selected workload's section. The
// error lists every invalid field by its YAML path and what is allowed;
// errors.As finds each *FieldError.
func (c *Config) Validate() error {
	var k checker
	if !knownWorkload(c.Workload) {
		k.fail("workload", "must be one of %s, got %q", strings.Join(Names(), ", "), c.Workload)
	}
	k.positive("rate", c.Rate)
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
	case "w6":
		p := &c.W6
		k.positive("w6.input_median_tokens", p.InputMedianTokens)
		k.nonNegative("w6.input_sigma", p.InputSigma)
		k.span("w6.input_min_tokens", "w6.input_max_tokens", p.InputMinTokens, p.InputMaxTokens, 1, lim)
		if len(k.errs) == 0 {
			k.fits(c, "w6.input_max_tokens", p.InputMaxTokens)
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
		return fmt.Errorf("parse workload config: %w", err)
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
	switch c.Workload {
	case "w1":
		return newW1(&c), nil
	case "w2":
		return newW2(&c), nil
	default: // "w6", by Validate
		return newW6(&c), nil
	}
}
