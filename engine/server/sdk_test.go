package server

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// nodeModules finds the OpenAI SDK that `make node-deps` installs.
func nodeModules(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("INFERRAIL_NODE_MODULES")
	if dir == "" {
		dir = filepath.Join("..", "..", ".cache", "node", "node_modules")
	}
	if _, err := os.Stat(filepath.Join(dir, "openai")); err != nil {
		t.Skipf("OpenAI Node SDK not installed in %s: run `make node-deps` (make test does)", dir)
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node not found")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// The official OpenAI Node SDK talks to the engine: models, chat and
// completions, streaming and not, errors and request ids.
func TestOpenAINodeSDK(t *testing.T) {
	modules := nodeModules(t)
	ts := startTCP(t, Config{Engine: testEngine(), EnablePromptTokensDetails: true})
	defer ts.stop()
	cmd := exec.Command("node", filepath.Join("testdata", "openai_sdk.cjs"))
	cmd.Env = append(os.Environ(), "BASE_URL="+ts.base, "NODE_PATH="+modules)
	outb, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("node: %v\n%s", err, ee.Stderr)
		}
		t.Fatal(err)
	}
	type usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		TotalTokens         int `json:"total_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	}
	var out struct {
		Models []string `json:"models"`
		Chat   struct {
			ID, Object, Content, Role, Finish string
			Usage                             usage
		} `json:"chat"`
		ChatStream struct {
			Text, Finish, Role string
			Chunks             int
			Usage              *usage
		} `json:"chatStream"`
		Completion struct {
			ID, Object, Text, Finish string
			Usage                    usage
		} `json:"completion"`
		CompletionStream struct {
			Text, Finish string
			Chunks       int
			Usage        *usage
		} `json:"completionStream"`
		Error *struct {
			Status  int    `json:"status"`
			Message string `json:"message"`
		} `json:"error"`
		RequestID struct{ Header, ID string } `json:"requestId"`
	}
	if err := json.Unmarshal(outb, &out); err != nil {
		t.Fatalf("%v: %s", err, outb)
	}
	words := func(s string) int { return len(ts.tok.Encode(s)) }
	switch {
	case len(out.Models) != 1 || out.Models[0] != DefaultModelName:
		t.Errorf("models %v", out.Models)
	case out.Chat.Object != "chat.completion" || out.Chat.Role != "assistant" || words(out.Chat.Content) != 5 || out.Chat.Finish != "length" || out.Chat.Usage.CompletionTokens != 5:
		t.Errorf("chat %+v", out.Chat)
	case out.ChatStream.Role != "assistant" || words(out.ChatStream.Text) != 6 || out.ChatStream.Finish != "length" || out.ChatStream.Usage == nil || out.ChatStream.Usage.CompletionTokens != 6 || out.ChatStream.Chunks < 3:
		t.Errorf("chat stream %+v", out.ChatStream)
	case out.Completion.Object != "text_completion" || words(out.Completion.Text) != 4 || out.Completion.Usage.PromptTokens != 3:
		t.Errorf("completion %+v", out.Completion)
	case words(out.CompletionStream.Text) != 7 || out.CompletionStream.Usage == nil || out.CompletionStream.Usage.PromptTokensDetails == nil || out.CompletionStream.Chunks < 3:
		t.Errorf("completion stream %+v", out.CompletionStream)
	case out.Error == nil || out.Error.Status != 404 || !strings.Contains(out.Error.Message, "no-such-model"):
		t.Errorf("error %+v", out.Error)
	case out.RequestID.Header != "sdk-1" || out.RequestID.ID != "chatcmpl-sdk-1":
		t.Errorf("request id %+v", out.RequestID)
	}
}
