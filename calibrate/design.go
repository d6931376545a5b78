package calibrate

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// ProbeKind names what a probe measures.
type ProbeKind string

// The probe kinds.
const (
	// ProbeCold is one prompt of new tokens on an idle engine with an empty
	// prefix cache; it measures TTFT (prefill).
	ProbeCold ProbeKind = "cold"
	// ProbeCached is one prompt whose prefix was sent just before (so it is
	// cached) followed by new tokens; it measures TTFT.
	ProbeCached ProbeKind = "cached"
	// ProbeDecode is a batch of concurrent requests decoding together; it
	// measures the inter-token latency.
	ProbeDecode ProbeKind = "decode"
)

// ProbeSpec is one probe of a Design.
type ProbeSpec struct {
	Kind ProbeKind `json:"kind"`
	// Prompt is the number of new (uncached) prompt tokens of each request.
	Prompt int `json:"prompt"`
	// Cached is the number of prefix tokens sent beforehand (ProbeCached).
	Cached int `json:"cached,omitempty"`
	// Batch is the number of concurrent requests (ProbeDecode; 1 otherwise).
	Batch int `json:"batch"`
	// Output is max_tokens of each request.
	Output int `json:"output"`
}

// Design is a calibration experiment: the probes to run, in order.
type Design struct {
	Probes []ProbeSpec `json:"probes"`
	// MaxNumBatchedTokens is the engine's step token budget the models of
	// long prefills assume (chunked prefill).
	MaxNumBatchedTokens int `json:"max_num_batched_tokens"`
	// BlockSize is the engine's KV block size: cached prefixes count in
	// whole blocks.
	BlockSize int `json:"block_size"`
}

// DesignOptions bound a Design to what the server accepts.
type DesignOptions struct {
	// MaxPromptTokens is the longest prompt to send; 0 means 8192.
	MaxPromptTokens int
	// MaxNumBatchedTokens is the server's --max-num-batched-tokens; 0 means
	// vLLM's default of 2048.
	MaxNumBatchedTokens int
	// BlockSize is the server's KV block size; 0 means 16.
	BlockSize int
	// MaxBatch caps the concurrency of decode probes; 0 means 32.
	MaxBatch int
	// MaxKVTokens caps batch x (prompt+output) of decode probes; 0 means 60000.
	MaxKVTokens int
	// DecodeTokens is max_tokens of decode probes; 0 means 64.
	DecodeTokens int
	// Repeats runs every probe this many times; 0 means 2.
	Repeats int
}

func (o *DesignOptions) defaults() error {
	def := func(v *int, d int, name string) error {
		if *v < 0 {
			return fmt.Errorf("%s: must be 0 (default %d) or positive, got %d", name, d, *v)
		}
		if *v == 0 {
			*v = d
		}
		return nil
	}
	for _, f := range []struct {
		v    *int
		d    int
		name string
	}{
		{&o.MaxPromptTokens, 8192, "max prompt tokens"},
		{&o.MaxNumBatchedTokens, 2048, "max_num_batched_tokens"},
		{&o.BlockSize, 16, "block size"},
		{&o.MaxBatch, 32, "max batch"},
		{&o.MaxKVTokens, 60000, "max KV tokens"},
		{&o.DecodeTokens, 64, "decode tokens"},
		{&o.Repeats, 2, "repeats"},
	} {
		if err := def(f.v, f.d, f.name); err != nil {
			return err
		}
	}
	if o.MaxPromptTokens < 256 {
		return fmt.Errorf("max prompt tokens: need at least 256 to tell prefill costs apart, got %d", o.MaxPromptTokens)
	}
	if o.DecodeTokens < 8 {
		return fmt.Errorf("decode tokens: need at least 8 to measure inter-token latency, got %d", o.DecodeTokens)
	}
	return nil
}

// NewDesign returns the standard experiment: cold prompts from 32 tokens to
// MaxPromptTokens (long ones chunked by the token budget, which separates
// step_fixed from prefill_token and exposes prefill_pair), cached-prefix
// probes with long prefixes and short or long suffixes (prefill_pair),
// and decode batches of 1 to MaxBatch sequences over short and long contexts
// (decode_seq apart from decode_ctx).
func NewDesign(o DesignOptions) (Design, error) {
	if err := o.defaults(); err != nil {
		return Design{}, err
	}
	d := Design{MaxNumBatchedTokens: o.MaxNumBatchedTokens, BlockSize: o.BlockSize}
	var base []ProbeSpec
	// Cold prompts: a geometric series up to the limit, plus the limit.
	for u := 32; u < o.MaxPromptTokens; u *= 2 {
		base = append(base, ProbeSpec{Kind: ProbeCold, Prompt: u, Batch: 1, Output: 1})
	}
	base = append(base, ProbeSpec{Kind: ProbeCold, Prompt: o.MaxPromptTokens, Batch: 1, Output: 1})
	// Cached prefixes: a short suffix after a long prefix (what a cache hit
	// costs), then one full chunk of new tokens after prefixes of growing
	// length. Those price prefill_pair: the same chunk costs more by
	// prefill_pair x chunk x prefix, tens of ms where a short suffix would
	// show well under a millisecond, below timer jitter.
	blk := func(n int) int { return max(o.BlockSize, n/o.BlockSize*o.BlockSize) }
	chunk := min(o.MaxNumBatchedTokens, o.MaxPromptTokens/4)
	for _, c := range []struct{ cached, prompt int }{
		{blk(o.MaxPromptTokens / 2), 32},
		{blk(o.MaxPromptTokens / 4), chunk},
		{blk(o.MaxPromptTokens / 2), chunk},
		{blk(o.MaxPromptTokens - chunk), chunk},
	} {
		base = append(base, ProbeSpec{Kind: ProbeCached, Prompt: c.prompt, Cached: c.cached, Batch: 1, Output: 1})
	}
	// Decode batches: vary batch size and context independently.
	seen := map[[2]int]bool{}
	for _, b := range []int{1, 4, 8, 16, 32, 64, 128} {
		if b > o.MaxBatch {
			b = o.MaxBatch
		}
		for _, p := range []int{32, 512, 2048} {
			p = min(p, o.MaxPromptTokens)
			for p > 16 && b*(p+o.DecodeTokens) > o.MaxKVTokens {
				p /= 2
			}
			if b*(p+o.DecodeTokens) > o.MaxKVTokens || seen[[2]int{b, p}] {
				continue
			}
			seen[[2]int{b, p}] = true
			base = append(base, ProbeSpec{Kind: ProbeDecode, Prompt: p, Batch: b, Output: o.DecodeTokens})
		}
	}
	for range o.Repeats {
		d.Probes = append(d.Probes, base...)
	}
	return d, nil
}

// Estimate returns roughly how long the design takes on an engine with
// profile p (engine time only, no network), to state a run's length up front.
func (d Design) Estimate(p ProfileEstimator) time.Duration {
	var ms float64
	for _, s := range d.Probes {
		r := PrefillRow(s.Prompt, s.Cached, d.MaxNumBatchedTokens)
		ms += dot(r.X, p)
		if s.Kind == ProbeCached {
			ms += dot(PrefillRow(s.Cached, 0, d.MaxNumBatchedTokens).X, p)
		}
		if s.Kind == ProbeDecode {
			pre := PrefillRow(s.Prompt*s.Batch, 0, d.MaxNumBatchedTokens)
			ms += dot(pre.X, p)
			ms += float64(s.Output) * dot(DecodeRow(s.Batch, float64(s.Batch*(s.Prompt+s.Output/2))).X, p)
		}
	}
	return time.Duration(ms * float64(time.Millisecond))
}

// ProfileEstimator is a profile's coefficients in Row order (and the TTFT overhead).
type ProfileEstimator = [NumCoefs]float64

func dot(x, c [NumCoefs]float64) float64 {
	s := 0.0
	for i := range x {
		s += x[i] * c[i]
	}
	return s
}

// Measurement is what one probe measured.
type Measurement struct {
	Probe ProbeSpec `json:"probe"`
	// PromptTokens is each request's prompt length as the server reported it
	// (usage.prompt_tokens); CachedTokens the cached part (reported, or the
	// block-aligned prefix when the server does not say).
	PromptTokens []int `json:"prompt_tokens"`
	CachedTokens []int `json:"cached_tokens"`
	// TTFTMs is each request's time to first token, in ms.
	TTFTMs []float64 `json:"ttft_ms"`
	// TokenMs is, per request, the arrival time of every token in ms since
	// the probe started (decode probes only).
	TokenMs [][]float64 `json:"token_ms,omitempty"`
	// StartMs is, per request, when it was sent, ms since the probe started.
	StartMs []float64 `json:"start_ms,omitempty"`
}

// Rows turns measurements into least-squares rows: one per cold or cached
// request (its TTFT as a chain of prefill chunks of at most budget tokens),
// and one per decode probe (the mean step time over the window where every
// sequence of the batch was decoding).
func Rows(ms []Measurement, budget int) []Row {
	var rows []Row
	for i, m := range ms {
		switch m.Probe.Kind {
		case ProbeCold, ProbeCached:
			for k := range m.TTFTMs {
				if k >= len(m.PromptTokens) || m.TTFTMs[k] <= 0 {
					continue
				}
				c := 0
				if k < len(m.CachedTokens) {
					c = m.CachedTokens[k]
				}
				r := PrefillRow(m.PromptTokens[k]-c, c, budget)
				r.Y, r.Probe = m.TTFTMs[k], i
				rows = append(rows, r)
			}
		case ProbeDecode:
			if r, ok := decodeWindow(m); ok {
				r.Probe = i
				rows = append(rows, r)
			}
		}
	}
	return rows
}

// decodeWindow finds the window where every sequence of a decode probe was
// past its first token and none had finished, and models its steps: the
// step count comes from the first sequence's tokens in the window, the
// context from every sequence's prompt plus the tokens it had. Its time is
// from the window's first to its last reference token, so the jitter of
// each token's delivery cancels out but at the ends.
func decodeWindow(m Measurement) (Row, bool) {
	b := len(m.TokenMs)
	if b == 0 || b != len(m.PromptTokens) {
		return Row{}, false
	}
	lo, hi := math.Inf(-1), math.Inf(1)
	for _, ts := range m.TokenMs {
		if len(ts) < 3 {
			return Row{}, false
		}
		lo = math.Max(lo, ts[0])
		hi = math.Min(hi, ts[len(ts)-1])
	}
	// The reference sequence: the first one; its tokens strictly inside the window.
	ref := m.TokenMs[0]
	ia := firstAtOrAfter(ref, lo)
	ib := lastAtOrBefore(ref, hi)
	// Leave the last token out: after it the sequence leaves the batch.
	if ib >= len(ref)-1 {
		ib = len(ref) - 2
	}
	if ib-ia < 2 {
		return Row{}, false
	}
	ta, tb := ref[ia], ref[ib]
	steps := float64(ib - ia)
	// Mean context over the steps: sequence i produced token k+1 from
	// prompt+k context tokens (k tokens so far).
	ctx := 0.0
	for i, ts := range m.TokenMs {
		na := countAtOrBefore(ts, ta)
		nb := countAtOrBefore(ts, tb)
		ctx += float64(m.PromptTokens[i]) + float64(na+nb-1)/2
	}
	r := DecodeRow(b, ctx)
	for j := range r.X {
		r.X[j] *= steps
	}
	r.Y = tb - ta
	return r, true
}

func firstAtOrAfter(ts []float64, t float64) int {
	i, _ := slices.BinarySearch(ts, t)
	return i
}

func lastAtOrBefore(ts []float64, t float64) int { return countAtOrBefore(ts, t) - 1 }

func countAtOrBefore(ts []float64, t float64) int {
	i, found := slices.BinarySearch(ts, t)
	for found && i < len(ts) && ts[i] == t {
		i++
	}
	return i
}
