package semcache

import (
	"testing"
)

func TestSplit(t *testing.T) {
	text, p1, why := Split(PathChatCompletions, []byte(`{"model":"m","temperature":0,"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`))
	if why != "" || text != "a\nb" || len(p1) != 64 {
		t.Fatalf("%q %q %q", text, p1, why)
	}
	// Key order, white space and the text itself do not change the
	// partition; any other field does; and so does the path.
	_, p2, _ := Split(PathChatCompletions, []byte(`{ "messages" : [ {"content":"s","role":"system"}, {"content":"other text","role":"user"} ], "temperature":0, "model":"m" }`))
	if p2 != p1 {
		t.Fatal("the partition depends on key order or on the embedded text")
	}
	for _, body := range []string{
		`{"model":"m","temperature":0,"messages":[{"role":"system","content":"S"},{"role":"user","content":"a"}]}`,
		`{"model":"m","temperature":0.0,"messages":[{"role":"system","content":"s"},{"role":"user","content":"a"}]}`,
		`{"model":"m2","temperature":0,"messages":[{"role":"system","content":"s"},{"role":"user","content":"a"}]}`,
		`{"model":"m","temperature":0,"messages":[{"role":"system","content":"s"},{"role":"user","content":"a","name":"bob"}]}`,
	} {
		if _, p, _ := Split(PathChatCompletions, []byte(body)); p == p1 {
			t.Errorf("%s: same partition", body)
		}
	}
	text, pc, why := Split(PathCompletions, []byte(`{"prompt":["once upon a time"],"temperature":0}`))
	_, pc2, _ := Split(PathCompletions, []byte(`{"prompt":"x","temperature":0}`))
	if why != "" || text != "once upon a time" || pc != pc2 {
		t.Fatalf("completions: %q %q %q", text, pc, why)
	}
	if _, pchat, _ := Split(PathChatCompletions, []byte(`{"prompt":"x","temperature":0,"messages":[{"role":"user","content":"x"}]}`)); pchat == pc {
		t.Fatal("chat and completions share a partition")
	}
	for body, want := range map[string]string{
		`[]`:              ReasonInvalidBody,
		`{"messages":[]}`: ReasonInvalidBody,
		`{"messages":[{"role":"user","content":"a"}]} {}`:                   ReasonInvalidBody,
		`{"messages":[{"role":"user","content":null}]}`:                     ReasonEmptyText,
		`{"messages":[{"role":"user","content":[{"type":"input_audio"}]}]}`: ReasonNotText,
		`{"messages":[{"role":"tool","content":"a"}]}`:                      ReasonNoUserMessage,
		`{"messages":[1]}`: ReasonInvalidBody,
	} {
		if _, _, why := Split(PathChatCompletions, []byte(body)); why != want {
			t.Errorf("%s: %q, want %q", body, why, want)
		}
	}
	for body, want := range map[string]string{
		`{"prompt":[]}`:        ReasonNotText,
		`{"prompt":["a","b"]}`: ReasonNotText,
		`{"prompt":[[1,2]]}`:   ReasonNotText,
		`{}`:                   ReasonNotText,
		`{"prompt":""}`:        ReasonEmptyText,
	} {
		if _, _, why := Split(PathCompletions, []byte(body)); why != want {
			t.Errorf("%s: %q, want %q", body, why, want)
		}
	}
}

func FuzzSplit(f *testing.F) {
	f.Add([]byte(`{"messages":[{"role":"user","content":"hi"}],"temperature":0}`), true)
	f.Add([]byte(`{"prompt":["a"],"n":1}`), false)
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`), true)
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		path := PathCompletions
		if chat {
			path = PathChatCompletions
		}
		text, part, why := Split(path, body)
		text2, part2, why2 := Split(path, body)
		if text != text2 || part != part2 || why != why2 {
			t.Fatal("not deterministic")
		}
		if why == "" && (len(part) != 64 || text == "") {
			t.Fatalf("ok with text %q, partition %q", text, part)
		}
		if why != "" && (text != "" || part != "") {
			t.Fatalf("reason %q with text %q, partition %q", why, text, part)
		}
	})
}
