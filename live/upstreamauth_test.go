package live

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/live/config"
)

// Engines started with an API key (vLLM's --api-key): with the model's
// api_key_file every request the gateway sends them carries the key, in
// place of the client's Authorization (a client's own key never reaches
// them), and max_model_len is learnt from their /v1/models; a wrong key is
// the engines' 401; the file is read again on reload (a rotated key).
func TestUpstreamAPIKey(t *testing.T) {
	const key = "sk-engine-0123456789"
	up := newUpstream(t, server.Config{Engine: testEngineConfig(), APIKey: key, ResponsesStore: 16})
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "engine.key")
	writeFile(t, keyFile, key+"\n")
	f := newFileConfig(t, up)
	f.ModelExtra = "    api_key_file: " + keyFile + "\n"
	g, path := startFromFile(t, f)

	// A client's Authorization is not the engine's key: replaced.
	resp, err := g.post(context.Background(), "/v1/completions", map[string]any{"prompt": words(10, 20), "max_tokens": 2}, map[string]string{"Authorization": "Bearer client-key"})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a completion with the engines' key: %d", resp.StatusCode)
	}
	if _, _, err := g.complete(context.Background(), words(30, 20), 3); err != nil {
		t.Fatalf("a stream: %v", err)
	}
	rresp, r, body := g.respond(t, map[string]any{"input": words(50, 20), "max_output_tokens": 2})
	if rresp.StatusCode != http.StatusOK {
		t.Fatalf("the Responses API: %d %s", rresp.StatusCode, body)
	}
	get, err := g.client.Get(g.base + "/v1/responses/" + r.ID)
	if err != nil {
		t.Fatal(err)
	}
	get.Body.Close()
	if get.StatusCode != http.StatusOK {
		t.Fatalf("a stored response: %d", get.StatusCode)
	}
	m := g.models[0]
	waitAnswered(t, m, 1) // its GET /v1/models carried the key
	if cc := m.coreConfig(); cc.ContextLen != testEngineConfig().MaxModelLen {
		t.Fatalf("max_model_len from the engines' /v1/models: %d, want %d", cc.ContextLen, testEngineConfig().MaxModelLen)
	}

	// The key rotated in the file, read again on reload: the engines
	// refuse the new one (they still hold the old).
	writeFile(t, keyFile, "sk-rotated-0123456789\n")
	g.reload(t, path, f)
	resp, _, err = g.complete(context.Background(), words(70, 20), 2)
	if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("with a key the engines do not hold: %v, want their 401", err)
	}
	writeFile(t, keyFile, key+"\n")
	g.reload(t, path, f)
	if _, _, err := g.complete(context.Background(), words(90, 20), 2); err != nil {
		t.Fatalf("the key back: %v", err)
	}
}

// api_key_file is checked: a missing file, and beside forward_client_auth.
func TestUpstreamAPIKeyConfig(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "k")
	if err := os.WriteFile(keyFile, []byte("sk-x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		mutate func(*config.Config)
		want   string
	}{
		{func(c *config.Config) { c.Models[0].APIKeyFile = filepath.Join(dir, "none") }, "models[0].api_key_file"},
		{func(c *config.Config) { c.Models[0].APIKeyFile, c.ForwardClientAuth = keyFile, true }, "not with forward_client_auth"},
	} {
		cfg := testConfig(t, newUpstream(t, server.Config{Engine: testEngineConfig()}))
		c.mutate(cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v, want an error naming %q", err, c.want)
		}
	}
}
