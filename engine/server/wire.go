package server

// The JSON bodies vLLM's OpenAI-compatible server writes, field for field and
// in its order. Sources (vLLM main, late 2026): entrypoints/openai/
// completion/protocol.py and serving.py, chat_completion/protocol.py and
// serving.py, engine/protocol.py. Non-streaming bodies are pydantic
// model_dump() (every field, None as null); stream chunks are
// model_dump_json(exclude_unset=True) (only the fields the serving code
// passes, even when None); the usage chunk is dumped with exclude_none.

type errorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

type errorResponse struct {
	Error errorInfo `json:"error"`
}

type promptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// usage is UsageInfo as a non-streaming body carries it.
type usage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	PromptTokensDetails *promptTokensDetails `json:"prompt_tokens_details"`
}

// streamUsage is UsageInfo dumped with exclude_none (the final usage chunk).
type streamUsage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	PromptTokensDetails *promptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

// usageChunk is the final usage chunk of both endpoints.
type usageChunk struct {
	ID      string      `json:"id"`
	Object  string      `json:"object"`
	Created int64       `json:"created"`
	Model   string      `json:"model"`
	Choices []struct{}  `json:"choices"`
	Usage   streamUsage `json:"usage"`
}

// --- /v1/completions ---

type completionChoice struct {
	Index          int     `json:"index"`
	Text           string  `json:"text"`
	Logprobs       *string `json:"logprobs"`
	FinishReason   *string `json:"finish_reason"`
	StopReason     *string `json:"stop_reason"`
	TokenIDs       *[]int  `json:"token_ids"`
	PromptLogprobs *string `json:"prompt_logprobs"`
	PromptTokenIDs *[]int  `json:"prompt_token_ids"`
	RoutedExperts  *string `json:"routed_experts"`
}

type completionResponse struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	Created           int64              `json:"created"`
	Model             string             `json:"model"`
	Choices           []completionChoice `json:"choices"`
	ServiceTier       *string            `json:"service_tier"`
	SystemFingerprint *string            `json:"system_fingerprint"`
	Usage             usage              `json:"usage"`
	KVTransferParams  *kvParamsOut       `json:"kv_transfer_params"`
	ECTransferParams  *string            `json:"ec_transfer_params"`
	Metrics           *string            `json:"metrics"`
}

type completionStreamChoice struct {
	Index          int     `json:"index"`
	Text           string  `json:"text"`
	Logprobs       *string `json:"logprobs"`
	FinishReason   *string `json:"finish_reason"`
	StopReason     *string `json:"stop_reason"`
	PromptTokenIDs *[]int  `json:"prompt_token_ids"`
	TokenIDs       *[]int  `json:"token_ids"`
}

type completionChunk struct {
	ID      string                   `json:"id"`
	Object  string                   `json:"object"`
	Created int64                    `json:"created"`
	Model   string                   `json:"model"`
	Choices []completionStreamChoice `json:"choices"`
}

// --- /v1/chat/completions ---

type chatMessage struct {
	Role         string  `json:"role"`
	Content      string  `json:"content"`
	Refusal      *string `json:"refusal"`
	Annotations  *string `json:"annotations"`
	Audio        *string `json:"audio"`
	FunctionCall *string `json:"function_call"`
	Reasoning    *string `json:"reasoning"`
}

type chatChoice struct {
	Index         int         `json:"index"`
	Message       chatMessage `json:"message"`
	Logprobs      *string     `json:"logprobs"`
	FinishReason  string      `json:"finish_reason"`
	StopReason    *string     `json:"stop_reason"`
	TokenIDs      *[]int      `json:"token_ids"`
	RoutedExperts *string     `json:"routed_experts"`
}

type chatResponse struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	Choices           []chatChoice `json:"choices"`
	ServiceTier       *string      `json:"service_tier"`
	SystemFingerprint *string      `json:"system_fingerprint"`
	Usage             usage        `json:"usage"`
	PromptLogprobs    *string      `json:"prompt_logprobs"`
	PromptTokenIDs    *[]int       `json:"prompt_token_ids"`
	PromptText        *string      `json:"prompt_text"`
	KVTransferParams  *kvParamsOut `json:"kv_transfer_params"`
	ECTransferParams  *string      `json:"ec_transfer_params"`
	Metrics           *string      `json:"metrics"`
}

// The first chat chunk: the role, empty content.
type roleDelta struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatRoleChoice struct {
	Index        int       `json:"index"`
	Delta        roleDelta `json:"delta"`
	Logprobs     *string   `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
}

type chatRoleChunk struct {
	ID             string           `json:"id"`
	Object         string           `json:"object"`
	Created        int64            `json:"created"`
	Model          string           `json:"model"`
	Choices        []chatRoleChoice `json:"choices"`
	PromptTokenIDs *[]int           `json:"prompt_token_ids"`
	PromptText     *string          `json:"prompt_text"`
}

type contentDelta struct {
	Content string `json:"content"`
}

// A content chunk; the last one also carries finish and stop reasons.
type chatContentChoice struct {
	Index        int          `json:"index"`
	Delta        contentDelta `json:"delta"`
	Logprobs     *string      `json:"logprobs"`
	FinishReason *string      `json:"finish_reason"`
	TokenIDs     *[]int       `json:"token_ids"`
}

type chatFinalChoice struct {
	Index        int          `json:"index"`
	Delta        contentDelta `json:"delta"`
	Logprobs     *string      `json:"logprobs"`
	FinishReason string       `json:"finish_reason"`
	StopReason   *string      `json:"stop_reason"`
	TokenIDs     *[]int       `json:"token_ids"`
}

type chatContentChunk[C any] struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []C    `json:"choices"`
}

// --- /v1/models ---

type modelPermission struct {
	ID                 string  `json:"id"`
	Object             string  `json:"object"`
	Created            int64   `json:"created"`
	AllowCreateEngine  bool    `json:"allow_create_engine"`
	AllowSampling      bool    `json:"allow_sampling"`
	AllowLogprobs      bool    `json:"allow_logprobs"`
	AllowSearchIndices bool    `json:"allow_search_indices"`
	AllowView          bool    `json:"allow_view"`
	AllowFineTuning    bool    `json:"allow_fine_tuning"`
	Organization       string  `json:"organization"`
	Group              *string `json:"group"`
	IsBlocking         bool    `json:"is_blocking"`
}

type modelCard struct {
	ID          string            `json:"id"`
	Object      string            `json:"object"`
	Created     int64             `json:"created"`
	OwnedBy     string            `json:"owned_by"`
	Root        *string           `json:"root"`
	Parent      *string           `json:"parent"`
	MaxModelLen *int              `json:"max_model_len"`
	Permission  []modelPermission `json:"permission"`
}

type modelList struct {
	Object string      `json:"object"`
	Data   []modelCard `json:"data"`
}
