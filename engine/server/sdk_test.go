package server

import (
	"encoding/json"
	"fmt"
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
// completions, streaming and not, the Responses API, errors and request
// ids.
func TestOpenAINodeSDK(t *testing.T) {
	modules := nodeModules(t)
	ts := startTCP(t, Config{Engine: testEngine(), EnablePromptTokensDetails: true, ResponsesStore: 16})
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
		// n = 2, whole and through the SDK's stream helper.
		ChatN, ChatNStream sdkChoices
		sdkResponses
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
	if bad := out.check(); bad != "" {
		t.Errorf("the Responses API: %s", bad)
	}
	for _, c := range []sdkChoices{out.ChatN, out.ChatNStream} {
		if bad := c.check(4); bad != "" {
			t.Errorf("n = 2: %s", bad)
		}
	}
}

// sdkChoices is what openai_sdk.cjs reports of a chat of n = 2 (live's
// test keeps its own copy).
type sdkChoices struct {
	Choices []struct {
		Index, Words int
		Finish       string
	}
	Distinct bool
	Usage    struct {
		CompletionTokens int `json:"completion_tokens"`
	}
}

// check says what is wrong with c, an answer of two choices of
// maxTokens each ("" for nothing).
func (c sdkChoices) check(maxTokens int) string {
	if len(c.Choices) != 2 || !c.Distinct || c.Usage.CompletionTokens != 2*maxTokens {
		return fmt.Sprintf("%+v", c)
	}
	for i, ch := range c.Choices {
		if ch.Index != i || ch.Words != maxTokens || ch.Finish != "length" {
			return fmt.Sprintf("choice %d of %+v", i, c)
		}
	}
	return ""
}

// sdkResponses is what openai_sdk.cjs reports of the Responses API.
//
// It is exported to package live's tests through testdata only: live
// keeps its own copy of the fields it checks.
type sdkResponses struct {
	Response struct {
		ID, Object, Status, Text string
		Usage                    struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		}
	} `json:"response"`
	ResponseStream struct {
		Text, Last     string
		Deltas, Events int
		Usage          *struct {
			OutputTokens int `json:"output_tokens"`
		}
	} `json:"responseStream"`
	ResponseNext struct {
		Previous            string
		InputTokens, Cached int
	} `json:"responseNext"`
	Retrieved  string `json:"retrieved"`
	Background struct {
		Status, Cancelled string
		Background        bool
	} `json:"background"`
	BackgroundStream struct {
		FirstType, Last                         string
		FirstSeq, ResumedFirstSeq, OutputTokens int
	} `json:"backgroundStream"`
}

// check reports what the SDK got wrong of the Responses API, "" for
// nothing: an answer, a stream of six tokens ending with
// response.completed and its usage, a continuation whose prompt holds the
// first turn (cached), the stored response read back, a background
// response queued and cancelled, and a background stream left after its
// first event and resumed from the next to its end.
func (r *sdkResponses) check() string {
	switch {
	case r.Response.Object != "response" || r.Response.Status != "incomplete" || len(strings.Fields(r.Response.Text)) != 5 || r.Response.Usage.OutputTokens != 5:
		return fmt.Sprintf("response %+v", r.Response)
	case r.ResponseStream.Deltas < 2 || len(strings.Fields(r.ResponseStream.Text)) != 6 || r.ResponseStream.Last != "response.completed" || r.ResponseStream.Usage == nil || r.ResponseStream.Usage.OutputTokens != 6:
		return fmt.Sprintf("stream %+v", r.ResponseStream)
	case r.ResponseNext.Previous != r.Response.ID || r.ResponseNext.InputTokens <= r.Response.Usage.InputTokens+r.Response.Usage.OutputTokens || r.ResponseNext.Cached == 0:
		return fmt.Sprintf("continued %+v after %+v", r.ResponseNext, r.Response)
	case r.Retrieved != r.Response.ID:
		return "retrieved " + r.Retrieved
	case r.Background.Status != "queued" || !r.Background.Background || r.Background.Cancelled != "cancelled":
		return fmt.Sprintf("background %+v", r.Background)
	case r.BackgroundStream.FirstType != "response.created" || r.BackgroundStream.ResumedFirstSeq != r.BackgroundStream.FirstSeq+1 ||
		r.BackgroundStream.Last != "response.completed" || r.BackgroundStream.OutputTokens != 200:
		return fmt.Sprintf("background stream left and resumed %+v", r.BackgroundStream)
	}
	return ""
}
