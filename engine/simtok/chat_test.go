package simtok

import (
	"encoding/json"
	"testing"
)

func TestRenderChat(t *testing.T) {
	msgs := []Message{
		{Role: "system", Content: json.RawMessage(`"be brief"`)},
		{Role: "user", Content: json.RawMessage(`[{"type":"text","text":"a"},{"type":"text","text":"b"}]`)},
		{Role: "assistant", Content: json.RawMessage(`null`)},
	}
	for _, tc := range []struct {
		add, cont bool
		want      string
	}{
		{true, false, "system: be brief\nuser: a\nb\nassistant: \nassistant: "},
		{false, false, "system: be brief\nuser: a\nb\nassistant: \n"},
		{true, true, "system: be brief\nuser: a\nb\nassistant: "},
	} {
		got, err := RenderChat(msgs, tc.add, tc.cont)
		if err != nil || got != tc.want {
			t.Errorf("add %v cont %v: %q, %v; want %q", tc.add, tc.cont, got, err, tc.want)
		}
	}
	for _, bad := range []Message{{Content: json.RawMessage(`"x"`)}, {Role: "user", Content: json.RawMessage(`[{"type":"image_url"}]`)}, {Role: "user", Content: json.RawMessage(`5`)}} {
		if _, err := RenderChat([]Message{bad}, true, false); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
