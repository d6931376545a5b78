package live

import (
	"testing"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvevents"
)

// vLLM's events name a prefix's LoRA adapter (lora_name) and its
// cache_salt (among the first block's extra keys, after the LoRA name and
// the multimodal items' pairs): both reach the core, which keys the
// prefix's blocks by them (gateway's TestKVEventsSaltedPrefixes). A
// block with a parent inherits its chain's keys.
func TestToGatewayReadsSaltKeys(t *testing.T) {
	mm := []any{"img-digest", int64(3)}
	for _, tc := range []struct {
		name     string
		lora     string
		keys     [][]any
		parent   bool
		wantSalt string
	}{
		{"plain", "", nil, false, ""},
		{"no keys for the block", "", [][]any{nil}, false, ""},
		{"salt", "", [][]any{{"s1"}}, false, "s1"},
		{"adapter", "a1", [][]any{{"a1"}}, false, ""},
		{"adapter and salt", "a1", [][]any{{"a1", "s1"}}, false, "s1"},
		{"salt named as the adapter", "x", [][]any{{"x", "x"}}, false, "x"},
		{"image, adapter and salt", "a1", [][]any{{"a1", mm, "s1", []byte{1, 2}}}, false, "s1"},
		{"image only", "", [][]any{{mm}}, false, ""},
		{"a child block", "a1", [][]any{{"a1"}}, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := kvevents.Event{Kind: engine.BlockStored, BlockHashes: []kvevents.BlockHash{{V: 7}}, TokenIDs: make([]uint32, 16), BlockSize: 16, LoRAName: tc.lora, ExtraKeys: tc.keys}
			if tc.parent {
				ev.ParentBlockHash = &kvevents.BlockHash{V: 6}
			}
			out, _ := toGateway([]kvevents.Event{ev}, nil, nil)
			if len(out) != 1 || out[0].LoRA != tc.lora || out[0].CacheSalt != tc.wantSalt || out[0].HasParent != tc.parent {
				t.Fatalf("%+v: want LoRA %q, cache salt %q", out, tc.lora, tc.wantSalt)
			}
		})
	}
}
