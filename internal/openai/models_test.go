package openai

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParseModels(t *testing.T) {
	cases := []struct {
		name, body string
		want       []ModelCard
		err        string
	}{
		{name: "vllm", body: `{"object":"list","data":[{"id":"Qwen/Qwen3-8B","object":"model","created":1,"owned_by":"vllm","root":"Qwen/Qwen3-8B","parent":null,"max_model_len":40960,"permission":[]}]}`,
			want: []ModelCard{{ID: "Qwen/Qwen3-8B", MaxModelLen: 40960}}},
		{name: "no length", body: `{"data":[{"id":"a"},{"id":"b","max_model_len":null}]}`, want: []ModelCard{{ID: "a"}, {ID: "b"}}},
		{name: "integral float", body: `{"data":[{"id":"a","max_model_len":32768.0}]}`, want: []ModelCard{{ID: "a", MaxModelLen: 32768}}},
		{name: "empty list", body: `{"object":"list","data":[]}`, want: []ModelCard{}},
		{name: "not json", body: `<html>`, err: "not a model list"},
		{name: "no data", body: `{"object":"list"}`, err: "no data array"},
		{name: "no id", body: `{"data":[{"max_model_len":5}]}`, err: "entry 0 has no id"},
		{name: "zero", body: `{"data":[{"id":"a","max_model_len":0}]}`, err: `model "a": max_model_len 0: want an integer`},
		{name: "negative", body: `{"data":[{"id":"a","max_model_len":-4096}]}`, err: "want an integer from 1"},
		{name: "fraction", body: `{"data":[{"id":"a","max_model_len":4096.5}]}`, err: "want an integer"},
		{name: "huge", body: `{"data":[{"id":"a","max_model_len":1e12}]}`, err: "want an integer"},
		{name: "string", body: `{"data":[{"id":"a","max_model_len":"4096"}]}`, err: "want an integer"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseModels([]byte(c.body))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want one containing %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(c.want) {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Fatalf("got %+v, want %+v", got, c.want)
				}
			}
		})
	}
}

func TestServedCard(t *testing.T) {
	two := []ModelCard{{ID: "a", MaxModelLen: 1}, {ID: "b", MaxModelLen: 2}}
	if c, ok := ServedCard(two, "b"); !ok || c.MaxModelLen != 2 {
		t.Fatalf("by id: %+v %v", c, ok)
	}
	if _, ok := ServedCard(two, "c"); ok {
		t.Fatal("two cards, neither named c: want none")
	}
	if c, ok := ServedCard(two[:1], "c"); !ok || c.ID != "a" {
		t.Fatalf("the only card: %+v %v", c, ok)
	}
	if _, ok := ServedCard(nil, "a"); ok {
		t.Fatal("no cards: want none")
	}
}

// FuzzParseModels: no panic; what parses has ids and lengths in range, and
// reads back the same when written again in vLLM's shape.
func FuzzParseModels(f *testing.F) {
	f.Add([]byte(`{"object":"list","data":[{"id":"m","max_model_len":8192}]}`))
	f.Add([]byte(`{"data":[{"id":"a"},{"id":"b","max_model_len":null}]}`))
	f.Add([]byte(`{"data":[{"id":"a","max_model_len":1e3}]}`))
	f.Add([]byte(`{"data":null}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		cards, err := ParseModels(body)
		if err != nil {
			return
		}
		type card struct {
			ID          string `json:"id"`
			MaxModelLen *int   `json:"max_model_len"`
		}
		out := struct {
			Data []card `json:"data"`
		}{Data: []card{}}
		for _, c := range cards {
			if c.ID == "" || c.MaxModelLen < 0 || c.MaxModelLen > maxContextLen {
				t.Fatalf("card out of range: %+v", c)
			}
			k := card{ID: c.ID}
			if c.MaxModelLen > 0 {
				k.MaxModelLen = &c.MaxModelLen
			}
			out.Data = append(out.Data, k)
		}
		b, err := json.Marshal(out)
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParseModels(b)
		if err != nil || len(again) != len(cards) {
			t.Fatalf("%s: %v, %d cards, want %d", b, err, len(again), len(cards))
		}
		for i := range cards {
			if again[i] != cards[i] {
				t.Fatalf("card %d: %+v, then %+v", i, cards[i], again[i])
			}
		}
	})
}
