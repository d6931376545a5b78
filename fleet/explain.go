package fleet

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/inferrail/inferrail/router/gateway"
)

// This file is the simulator's side of explain and shadow mode
// (docs/explain-shadow.md): Config.Explain receives the explanation of a
// sampled share of the routing decisions, in the schema of live's POST
// /admin/explain, and Config.ShadowPolicy makes every gateway core ask a
// second policy about each decision (Output.Shadow holds their tallies).

// validateExplain checks the explain settings.
func (c *Config) validateExplain() error {
	if !(c.ExplainSample >= 0 && c.ExplainSample <= 1) {
		return fmt.Errorf("explain-sample: must be in [0, 1], got %v", c.ExplainSample)
	}
	if c.ExplainSample > 0 && c.Explain == nil {
		return fmt.Errorf("explain-sample: %v asks for explanations but nothing receives them (explain-out)", c.ExplainSample)
	}
	if c.ExplainSample == 0 && c.Explain != nil {
		return fmt.Errorf("explain-sample: 0 explains no decision; give the share to explain, in (0, 1], with explain-out")
	}
	return nil
}

// ExplainLines returns a Config.Explain that writes each explanation to w
// as one line of JSON (sim --explain-out's format, the schema of live's
// POST /admin/explain).
func ExplainLines(w io.Writer) func(gateway.Explanation) error {
	enc := json.NewEncoder(w)
	return func(ex gateway.Explanation) error { return enc.Encode(ex) }
}

// explain hands the explanation of req's decision at its arrival on gateway
// g, before it is submitted (in the same state), to Config.Explain, when
// its id is sampled (gateway.Sampled: the same requests in every run).
// Explaining changes nothing, so a run's results are the same with and
// without it.
func (s *sim) explain(g int, req gateway.Request) {
	if s.cfg.Explain == nil || s.err != nil || !gateway.Sampled(req.ID, s.cfg.ExplainSample) {
		return
	}
	if err := s.cfg.Explain(s.gws[g].core.Explain(s.now, req)); err != nil {
		s.err = fmt.Errorf("explain: %w", err)
	}
}

// shadowStats is each gateway's shadow tally, nil without a shadow policy.
func (s *sim) shadowStats() []gateway.ShadowStats {
	if s.cfg.ShadowPolicy == "" {
		return nil
	}
	out := make([]gateway.ShadowStats, len(s.gws))
	for i, g := range s.gws {
		out[i], _ = g.core.ShadowStats()
	}
	return out
}
