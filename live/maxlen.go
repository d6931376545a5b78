package live

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/inferrail/inferrail/internal/openai"
)

// This file learns a model's context length from its engines when the
// configuration does not give max_model_len: vLLM's GET /v1/models says it
// (max_model_len in each card). A replica is asked once it passes a health
// probe, and again after its engine restarts; one that cannot say is asked
// again no sooner than contextLenRetry later. The model takes the smallest
// length its replicas gave (model.learnedContextLen): a longer prompt would
// be refused by that engine.

// contextLenRetry is the least time between two questions to a replica
// whose /v1/models did not give its max_model_len.
const contextLenRetry = 10 * time.Second

// learnContextLen asks r's /v1/models for m's max_model_len in the
// background when m's is not configured and r has not said (onProbe calls
// it on each passing probe).
func (s *Server) learnContextLen(m *model, r *replica) {
	s.bgMu.Lock()
	bg := s.bg
	s.bgMu.Unlock()
	if bg == nil || !m.askContextLen(r, time.Now(), s.contextRetry) {
		return
	}
	bg.wg.Go(func() {
		n, err := s.fetchContextLen(bg.ctx, bg.client, m, r)
		m.learnedContextLen(r, n, err)
	})
}

// fetchContextLen reads r's GET /v1/models (within health.timeout, at most
// openai.MaxModelsBytes) and returns the max_model_len of m's card: the
// card named as m is, else the engine's only one.
func (s *Server) fetchContextLen(ctx context.Context, client *http.Client, m *model, r *replica) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Health.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.base.JoinPath("v1", "models").String(), http.NoBody)
	if err != nil {
		return 0, fmt.Errorf("GET /v1/models: %w", err)
	}
	if a := r.authorization(); a != "" {
		req.Header.Set("Authorization", a)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("GET /v1/models: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /v1/models answered %s", resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, openai.MaxModelsBytes+1))
	if err != nil {
		return 0, fmt.Errorf("GET /v1/models: %w", err)
	}
	if len(body) > openai.MaxModelsBytes {
		return 0, fmt.Errorf("GET /v1/models: the body is over %d bytes", openai.MaxModelsBytes)
	}
	cards, err := openai.ParseModels(body)
	if err != nil {
		return 0, fmt.Errorf("GET /v1/models: %w", err)
	}
	c, ok := openai.ServedCard(cards, m.name)
	switch {
	case !ok:
		return 0, fmt.Errorf("GET /v1/models lists %d models, none called %q", len(cards), m.name)
	case c.MaxModelLen == 0:
		return 0, errors.New("GET /v1/models: the model's card has no max_model_len")
	}
	return c.MaxModelLen, nil
}
