package live

import (
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/live/config"
)

// NewLogger builds the process logger that c describes (text or JSON, at
// its level), writing to w.
func NewLogger(c config.Log, w io.Writer) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(c.Level)); err != nil {
		return nil, fmt.Errorf("log.level: %w", err)
	}
	o := &slog.HandlerOptions{Level: lv}
	switch c.Format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, o)), nil
	case "text", "":
		return slog.New(slog.NewTextHandler(w, o)), nil
	}
	return nil, fmt.Errorf("log.format: want text or json, got %q", c.Format)
}

// accessRecord is what the access log says of one request: never a prompt,
// a completion or a header value.
type accessRecord struct {
	began        time.Time
	method, path string
	status       int
	model        string
	replica      string
	promptTokens int
	// promptCounted: promptTokens is the engine's count (its usage's
	// prompt_tokens), not the edge tokenizer's.
	promptCounted bool
	cachedTokens  int
	outputTokens  int
	queued        time.Duration
	ttft          time.Duration // to the first byte sent (0: none)
	// For the recording: the outcome counted in inferrail_requests_total,
	// the prediction for the chosen replica, and whether the engine
	// reported cachedTokens.
	outcome     string
	predicted   int
	cachedKnown bool
	// prefill names the prefill replica of a request disaggregated (P/D)
	// and pd how it went: "remote" (prefilled there), "fallback"
	// (prefilled on the decode replica after the prefill failed).
	prefill, pd string
}

// enginePrompt takes the prompt's length from the engine's answer when it
// says (usage.prompt_tokens): the access log, the trace, the limiter's
// true-up and the metered usage then count what the engine computed, not
// what the edge tokenizer (builtin:sim by default) made of the prompt.
func (a *accessRecord) enginePrompt(ans *answer) {
	if n, ok := ans.promptTokens(); ok {
		a.promptTokens, a.promptCounted = n, true
	}
}

// sampled reports whether the n-th request is in a share of them, spread
// evenly (a hash of n against the share).
func sampled(n uint64, share float64) bool {
	switch {
	case share >= 1:
		return true
	case share <= 0:
		return false
	}
	return float64(kvblock.Mix64(n)>>11) < share*float64(uint64(1)<<53)
}

// logAccess writes a's access log line: every failure the proxy or an
// engine answered with 5xx at warn level, the rest at info level for
// log.access_sample of the requests.
func (s *Server) logAccess(r *http.Request, a *accessRecord) {
	lv := slog.LevelInfo
	if a.status >= 500 {
		lv = slog.LevelWarn
	}
	if !s.log.Enabled(r.Context(), lv) {
		return
	}
	if lv == slog.LevelInfo && !sampled(s.accessSeq.Add(1), s.cfg.Log.AccessSample) {
		return
	}
	status := a.status
	if status == 0 {
		status = http.StatusOK
	}
	attrs := []slog.Attr{
		slog.String("method", a.method), slog.String("path", a.path), slog.Int("status", status),
		slog.Float64("duration_ms", math.Round(float64(time.Since(a.began))/1e3)/1e3),
		slog.String("model", a.model), slog.String("replica", a.replica),
		slog.Int("prompt_tokens", a.promptTokens), slog.Int("cached_tokens", a.cachedTokens), slog.Int("output_tokens", a.outputTokens),
		slog.Float64("queue_ms", math.Round(float64(a.queued)/1e3)/1e3),
		slog.String("remote", remoteHost(r.RemoteAddr)),
	}
	if a.prefill != "" {
		attrs = append(attrs, slog.String("prefill_replica", a.prefill), slog.String("pd", a.pd))
	}
	s.log.LogAttrs(r.Context(), lv, "access", attrs...)
}
