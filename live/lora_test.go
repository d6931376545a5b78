package live

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"testing"

	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/respcache"
)

// A model's LoRA adapters are names of their own: a request for one goes
// to the model's replicas with its model field as the client wrote it
// (an alias is rewritten, an adapter never), and its prompt's blocks are
// keyed by the adapter, as vLLM keys them: the same prompt under the base
// model or another adapter is not predicted cached, under the same
// adapter it is. /v1/models lists the adapters under their model.
func TestLoRAAdapters(t *testing.T) {
	eng := newSeenEngine(t, server.Config{Engine: testEngineConfig(), ServedModelNames: []string{server.DefaultModelName, "a1", "a2"}})
	c := testConfig(t)
	c.Models[0].Replicas = []config.Replica{{Name: "a", URL: eng.url}}
	c.Models[0].Adapters = []string{"a1", "a2"}
	c.Models[0].ResponseCache.Enabled, c.Models[0].ResponseCache.TenantHeader = true, HeaderTenant
	g := startGateway(t, c)
	prompt := words(100, 200)
	for i, step := range []struct {
		model, predicted, sent, cache string
	}{
		{"a1", "0", "a1", "miss"},
		{"sim", "0", server.DefaultModelName, "miss"}, // the base model: the adapter's blocks and answer are not its
		{"a2", "0", "a2", "miss"},
		{"a1", "", "", "hit"},
		{server.DefaultModelName, "", "", "hit"}, // the alias's answer: the same model
	} {
		resp, err := g.post(t.Context(), "/v1/completions", map[string]any{"model": step.model, "prompt": prompt, "max_tokens": 2, "temperature": 0}, map[string]string{HeaderTenant: "t"})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		last := eng.lastModel()
		// The exact cache keys answers by the engine's model: the base
		// model's answer is never an adapter's.
		want := step.cache
		if resp.StatusCode != http.StatusOK || resp.Header.Get(respcache.HeaderCache) != want {
			t.Fatalf("request %d (%s): %d, cache %q, want %q", i, step.model, resp.StatusCode, resp.Header.Get(respcache.HeaderCache), want)
		}
		if want == "hit" {
			continue // answered by the cache: no prediction, nothing sent
		}
		if resp.Header.Get(HeaderPredicted) != step.predicted || last != step.sent {
			t.Fatalf("request %d (%s): %d, predicted %q (want %s), the engine got model %q (want %q): %s",
				i, step.model, resp.StatusCode, resp.Header.Get(HeaderPredicted), step.predicted, last, step.sent, b)
		}
	}
	resp, err := g.client.Get(g.base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []modelCard `json:"data"`
	}
	json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
		if m.Root != server.DefaultModelName {
			t.Errorf("%s: root %q", m.ID, m.Root)
		}
	}
	if !slices.Contains(ids, "a1") || !slices.Contains(ids, "a2") {
		t.Fatalf("/v1/models lists %v", ids)
	}
}
