package workload

import (
	"errors"
	"math"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestDefaultConfig(t *testing.T) {
	for _, name := range Names() {
		c, err := DefaultConfig(name)
		if err != nil {
			t.Fatal(err)
		}
		if c.Workload != name {
			t.Fatalf("DefaultConfig(%q).Workload = %q", name, c.Workload)
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("%s defaults invalid: %v", name, err)
		}
	}
	_, err := DefaultConfig("w9")
	if err == nil {
		t.Fatal("DefaultConfig(w9) succeeded")
	}
	for _, want := range append(Names(), "w9") {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not mention %q", err, want)
		}
	}
	if _, err := New(Config{Workload: "w9"}); err == nil {
		t.Fatal("New accepted an unknown workload")
	}
}

func TestLoadConfigSamples(t *testing.T) {
	for _, name := range Names() {
		path := filepath.Join("testdata", name+".yaml")
		c, err := LoadConfig(path)
		if err != nil {
			t.Fatal(err)
		}
		if c.Workload != name || c.Seed != 7 {
			t.Fatalf("%s: workload %q seed %d", path, c.Workload, c.Seed)
		}
		if _, err := New(c); err != nil {
			t.Fatal(err)
		}
	}
	c, err := LoadConfig("testdata/w2.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.W2.ThinkMin != 5*time.Second || c.W2.ThinkMax != 30*time.Second || c.Duration != 30*time.Minute || c.Requests != 0 {
		t.Fatalf("durations not decoded: %+v", c)
	}
	c, err = LoadConfig("testdata/w3.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.W3.ToolLatencyMin != 200*time.Millisecond || c.W3.ToolLatencyMax != 2*time.Second {
		t.Fatalf("w3 durations not decoded: %+v", c.W3)
	}
	c, err = LoadConfig("testdata/w4.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Arrival != (ArrivalParams{Process: ArrivalGamma, CV: 3}) {
		t.Fatalf("arrival not decoded: %+v", c.Arrival)
	}
	// The samples spell out the defaults of w3, w4, w5 and w7.
	for _, name := range []string{"w3", "w4", "w5", "w7"} {
		c, err := LoadConfig(filepath.Join("testdata", name+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		d := mustConfig(t, name)
		if !reflect.DeepEqual([]any{c.W3, c.W4, c.W5, c.W7}, []any{d.W3, d.W4, d.W5, d.W7}) {
			t.Fatalf("%s sample differs from the defaults:\n got %+v %+v %+v %+v\nwant %+v %+v %+v %+v", name, c.W3, c.W4, c.W5, c.W7, d.W3, d.W4, d.W5, d.W7)
		}
	}
	c, err = LoadConfig("testdata/w7.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if d := mustConfig(t, "w7"); c.Rate != d.Rate || c.Requests != d.Requests {
		t.Fatalf("w7 sample: rate %v requests %d, defaults %v %d", c.Rate, c.Requests, d.Rate, d.Requests)
	}
	wantMix := []MixClass{{Tenant: "batch", Priority: 0, Share: 0.7}, {Tenant: "interactive", Priority: 10, Share: 0.3}}
	if !reflect.DeepEqual(c.Mix, wantMix) {
		t.Fatalf("mix not decoded: %+v", c.Mix)
	}
}

func TestLoadConfigOverlay(t *testing.T) {
	c, err := LoadConfig("testdata/w1_partial.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := mustConfig(t, "w1")
	want.Rate = 50
	want.Output.Median = 300
	want.W1.Prompts = 8
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("overlay:\n got %+v\nwant %+v", c, want)
	}
}

func TestLoadConfigErrors(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"unknown_key.yaml", "prompt_count"},
		{"invalid.yaml", "w1.prompt_min_tokens"},
		{"no_workload.yaml", "workload"},
		{"missing.yaml", "missing.yaml"},
	} {
		_, err := LoadConfig(filepath.Join("testdata", tc.file))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s: error %v, want one mentioning %q", tc.file, err, tc.want)
		}
	}
	for _, tc := range []struct{ yaml, want string }{
		{"workload: w9\n", "w9"},
		{"workload: w1\nmix:\n  - {tenant: a, priority: 0, share: -1}\n", "mix[0].share: must be positive, got -1"},
		{"workload: w1\nmix:\n  - {tenant: a, weight: 1}\n", "weight"},
		{"workload: w1\nmix: a:0:1\n", "line 2"},
		{"workload: w7\nw7:\n  burst_every: 1\n", "line 3"},
		{"workload: w7\nw7:\n  burst_size: 1\n", "burst_size"},
		{"workload: w1\nrate: fast\n", "fast"},
		{"workload: w1\nrate: 1\nrate: 2\n", "rate"},
		{"workload: w1\n---\nworkload: w1\n", "more than one"},
		{"workload: w2\nw2:\n  think_min: 3\n", "line 3"},
		{"workload: w4\narrival:\n  shape: 2\n", "shape"},
		{"workload: w4\narrival:\n  process: bursty\n", "arrival.process"},
		{"workload: w5\nw5:\n  burst_window: 1\n", "line 3"},
	} {
		_, err := ParseConfig([]byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%q: error %v, want one mentioning %q", tc.yaml, err, tc.want)
		}
	}
}

func TestValidateNamesField(t *testing.T) {
	for _, tc := range []struct {
		workload, field string
		edit            func(*Config)
	}{
		{"w1", "workload", func(c *Config) { c.Workload = "W1" }},
		{"w1", "rate", func(c *Config) { c.Rate = 0 }},
		{"w1", "rate", func(c *Config) { c.Rate = -3 }},
		{"w1", "rate", func(c *Config) { c.Rate = math.NaN() }},
		{"w1", "rate", func(c *Config) { c.Rate = math.Inf(1) }},
		{"w1", "requests", func(c *Config) { c.Requests = -1 }},
		{"w1", "requests", func(c *Config) { c.Requests, c.Duration = 0, 0 }},
		{"w1", "duration", func(c *Config) { c.Duration = -time.Second }},
		{"w1", "model", func(c *Config) { c.Model = "" }},
		{"w1", "max_model_len", func(c *Config) { c.MaxModelLen = 0 }},
		{"w1", "output.median", func(c *Config) { c.Output.Median = 0 }},
		{"w1", "output.sigma", func(c *Config) { c.Output.Sigma = -0.1 }},
		{"w1", "output.min", func(c *Config) { c.Output.Min = 0 }},
		{"w1", "output.min", func(c *Config) { c.Output.Min = 2000 }},
		{"w1", "w1.prompts", func(c *Config) { c.W1.Prompts = 0 }},
		{"w1", "w1.prompt_min_tokens", func(c *Config) { c.W1.PromptMinTokens = 9000 }},
		{"w1", "w1.prompt_min_tokens", func(c *Config) { c.W1.PromptMinTokens = 0 }},
		{"w1", "w1.popularity_zipf", func(c *Config) { c.W1.PopularityZipf = -1 }},
		{"w1", "w1.question_min_tokens", func(c *Config) { c.W1.QuestionMinTokens = 501 }},
		{"w1", "max_model_len", func(c *Config) { c.MaxModelLen = 8192 }},
		{"w2", "w2.system_prompts", func(c *Config) { c.W2.SystemPrompts = 0 }},
		{"w2", "w2.system_min_tokens", func(c *Config) { c.W2.SystemMinTokens = 1001 }},
		{"w2", "w2.turns_min", func(c *Config) { c.W2.TurnsMin = 0 }},
		{"w2", "w2.turns_min", func(c *Config) { c.W2.TurnsMin = 11 }},
		{"w2", "w2.user_median_tokens", func(c *Config) { c.W2.UserMedianTokens = -5 }},
		{"w2", "w2.user_sigma", func(c *Config) { c.W2.UserSigma = math.Inf(1) }},
		{"w2", "w2.user_min_tokens", func(c *Config) { c.W2.UserMinTokens = 1001 }},
		{"w2", "w2.think_min", func(c *Config) { c.W2.ThinkMin = 0 }},
		{"w2", "w2.think_max", func(c *Config) { c.W2.ThinkMax = time.Second }},
		{"w2", "max_model_len", func(c *Config) { c.MaxModelLen = 2000 }},
		{"w6", "w6.input_median_tokens", func(c *Config) { c.W6.InputMedianTokens = 0 }},
		{"w6", "w6.input_sigma", func(c *Config) { c.W6.InputSigma = -1 }},
		{"w6", "w6.input_min_tokens", func(c *Config) { c.W6.InputMinTokens = 9000 }},
		{"w6", "max_model_len", func(c *Config) { c.MaxModelLen = 9000 }},
		{"w1", "arrival.process", func(c *Config) { c.Arrival.Process = "weibull" }},
		{"w1", "arrival.process", func(c *Config) { c.Arrival.Process = "" }},
		{"w1", "arrival.cv", func(c *Config) { c.Arrival.CV = 2 }}, // poisson
		{"w1", "arrival.cv", func(c *Config) { c.Arrival = ArrivalParams{Process: ArrivalGamma, CV: 0} }},
		{"w1", "arrival.cv", func(c *Config) { c.Arrival = ArrivalParams{Process: ArrivalGamma, CV: -1} }},
		{"w1", "arrival.cv", func(c *Config) { c.Arrival = ArrivalParams{Process: ArrivalGamma, CV: math.NaN()} }},
		{"w1", "arrival.cv", func(c *Config) { c.Arrival = ArrivalParams{Process: ArrivalGamma, CV: math.Inf(1)} }},
		{"w1", "arrival.cv", func(c *Config) { c.Arrival = ArrivalParams{Process: ArrivalGamma, CV: 101} }},
		{"w3", "w3.agent_types", func(c *Config) { c.W3.AgentTypes = 0 }},
		{"w3", "w3.system_min_tokens", func(c *Config) { c.W3.SystemMinTokens = 4001 }},
		{"w3", "w3.system_min_tokens", func(c *Config) { c.W3.SystemMinTokens = 0 }},
		{"w3", "w3.task_min_tokens", func(c *Config) { c.W3.TaskMinTokens = 1001 }},
		{"w3", "w3.task_max_tokens", func(c *Config) { c.W3.TaskMaxTokens = 40000 }},
		{"w3", "w3.tool_result_min_tokens", func(c *Config) { c.W3.ToolResultMinTokens = 0 }},
		{"w3", "w3.tool_result_min_tokens", func(c *Config) { c.W3.ToolResultMinTokens = 2001 }},
		{"w3", "w3.output_median_tokens", func(c *Config) { c.W3.OutputMedianTokens = 0 }},
		{"w3", "w3.output_sigma", func(c *Config) { c.W3.OutputSigma = -1 }},
		{"w3", "w3.steps_min", func(c *Config) { c.W3.StepsMin = 0 }},
		{"w3", "w3.steps_min", func(c *Config) { c.W3.StepsMin = 21 }},
		{"w3", "w3.tool_latency_min", func(c *Config) { c.W3.ToolLatencyMin = 0 }},
		{"w3", "w3.tool_latency_max", func(c *Config) { c.W3.ToolLatencyMax = time.Millisecond }},
		{"w3", "max_model_len", func(c *Config) { c.MaxModelLen = 5000 }},
		{"w4", "w4.system_tokens", func(c *Config) { c.W4.SystemTokens = -1 }},
		{"w4", "w4.documents", func(c *Config) { c.W4.Documents = 0 }},
		{"w4", "w4.doc_min_tokens", func(c *Config) { c.W4.DocMinTokens = 1501 }},
		{"w4", "w4.doc_max_tokens", func(c *Config) { c.W4.DocMaxTokens = 0 }},
		{"w4", "w4.popularity_zipf", func(c *Config) { c.W4.PopularityZipf = -0.5 }},
		{"w4", "w4.popularity_zipf", func(c *Config) { c.W4.PopularityZipf = math.NaN() }},
		{"w4", "w4.docs_per_prompt", func(c *Config) { c.W4.DocsPerPrompt = 0 }},
		{"w4", "w4.docs_per_prompt", func(c *Config) { c.W4.Documents, c.W4.DocsPerPrompt = 3, 4 }},
		{"w4", "w4.order", func(c *Config) { c.W4.Order = "popularity" }},
		{"w4", "w4.question_min_tokens", func(c *Config) { c.W4.QuestionMinTokens = 201 }},
		{"w4", "max_model_len", func(c *Config) { c.MaxModelLen = 7000 }},
		{"w5", "w5.batch_size", func(c *Config) { c.W5.BatchSize = 0 }},
		{"w5", "w5.batch_size", func(c *Config) { c.W5.BatchSize = 1<<20 + 1 }},
		{"w5", "w5.burst_window", func(c *Config) { c.W5.BurstWindow = -time.Second }},
		{"w5", "w5.burst_window", func(c *Config) { c.W5.BurstWindow = 25 * time.Hour }},
		{"w5", "w5.benchmarks", func(c *Config) { c.W5.Benchmarks = -1 }},
		{"w5", "w5.prefix_min_tokens", func(c *Config) { c.W5.PrefixMinTokens = 6001 }},
		{"w5", "w5.prefix_min_tokens", func(c *Config) { c.W5.PrefixMinTokens = 0 }},
		{"w5", "w5.question_min_tokens", func(c *Config) { c.W5.QuestionMinTokens = 301 }},
		{"w5", "w5.output_median_tokens", func(c *Config) { c.W5.OutputMedianTokens = math.Inf(1) }},
		{"w5", "w5.output_sigma", func(c *Config) { c.W5.OutputSigma = -0.1 }},
		{"w5", "max_model_len", func(c *Config) { c.MaxModelLen = 7000 }},
		{"w7", "w7.burst_requests", func(c *Config) { c.W7.BurstRequests = 0 }},
		{"w7", "w7.burst_requests", func(c *Config) { c.W7.BurstRequests = 1<<20 + 1 }},
		{"w7", "w7.burst_every", func(c *Config) { c.W7.BurstEvery = 0 }},
		{"w7", "w7.burst_every", func(c *Config) { c.W7.BurstEvery = -time.Second }},
		{"w7", "w7.burst_every", func(c *Config) { c.W7.BurstEvery = 25 * time.Hour }},
		{"w7", "w7.burst_window", func(c *Config) { c.W7.BurstWindow = -time.Nanosecond }},
		{"w7", "w7.burst_window", func(c *Config) { c.W7.BurstWindow = 61 * time.Second }},
		{"w7", "w7.first_burst", func(c *Config) { c.W7.FirstBurst = -time.Second }},
		{"w7", "w7.first_burst", func(c *Config) { c.W7.FirstBurst = 25 * time.Hour }},
		{"w7", "w7.heavy_prompt_min_tokens", func(c *Config) { c.W7.HeavyPromptMinTokens = 0 }},
		{"w7", "w7.heavy_prompt_min_tokens", func(c *Config) { c.W7.HeavyPromptMinTokens = 8201 }},
		{"w7", "w7.heavy_prompt_max_tokens", func(c *Config) { c.W7.HeavyPromptMaxTokens = 40000 }},
		{"w7", "w7.heavy_shared_tokens", func(c *Config) { c.W7.HeavySharedTokens = -1 }},
		{"w7", "w7.heavy_shared_tokens", func(c *Config) { c.W7.HeavySharedTokens = 6500 }},
		{"w7", "w7.heavy_max_tokens", func(c *Config) { c.W7.HeavyMaxTokens = 7 }}, // < output.min
		{"w7", "w7.heavy_max_tokens", func(c *Config) { c.W7.HeavyMaxTokens = 40000 }},
		{"w7", "w7.light_prompt_min_tokens", func(c *Config) { c.W7.LightPromptMinTokens = 0 }},
		{"w7", "w7.light_prompt_min_tokens", func(c *Config) { c.W7.LightPromptMinTokens = 401 }},
		{"w7", "w7.light_prompt_max_tokens", func(c *Config) { c.W7.LightPromptMaxTokens = 40000 }},
		{"w7", "max_model_len", func(c *Config) { c.MaxModelLen = 8700 }},              // heavy 8200 + 512
		{"w7", "max_model_len", func(c *Config) { c.W7.LightPromptMaxTokens = 32000 }}, // light + output.max_tokens
		{"w7", "rate", func(c *Config) { c.Rate = 0 }},
		{"w1", "mix[0].share", func(c *Config) { c.Mix = []MixClass{{Tenant: "a", Share: -1}} }},
		{"w2", "mix[0].share", func(c *Config) { c.Mix = []MixClass{{Tenant: "a", Share: 0}} }},
		{"w3", "mix[0].share", func(c *Config) { c.Mix = []MixClass{{Tenant: "a", Share: math.NaN()}} }},
		{"w4", "mix[1].share", func(c *Config) { c.Mix = []MixClass{{Tenant: "a", Share: 1}, {Share: math.Inf(1)}} }},
		{"w5", "mix[1].priority", func(c *Config) { c.Mix = []MixClass{{Tenant: "a", Share: 1}, {Priority: 1001, Share: 1}} }},
		{"w6", "mix[0].priority", func(c *Config) { c.Mix = []MixClass{{Priority: -1, Share: 1}} }},
		{"w7", "mix[0].tenant", func(c *Config) { c.Mix = []MixClass{{Tenant: strings.Repeat("t", 129), Share: 1}} }},
		{"w7", "mix[0].tenant", func(c *Config) { c.Mix = []MixClass{{Tenant: "\xff", Share: 1}} }},
		{"w1", "mix", func(c *Config) { c.Mix = make([]MixClass, 65) }},
		{"w1", "mix[2]", func(c *Config) {
			c.Mix = []MixClass{{Tenant: "a", Share: 1}, {Tenant: "a", Priority: 1, Share: 1}, {Tenant: "a", Share: 2}}
		}},
	} {
		c := mustConfig(t, tc.workload)
		tc.edit(&c)
		err := c.Validate()
		if err == nil {
			t.Fatalf("%s: want an error naming %s", tc.workload, tc.field)
		}
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Fatalf("%s: error %q, want one for field %s", tc.workload, err, tc.field)
		}
		if !strings.Contains(err.Error(), tc.field+":") {
			t.Fatalf("error %q does not name %s", err, tc.field)
		}
		if _, err := New(c); err == nil {
			t.Fatalf("New accepted a config with a bad %s", tc.field)
		}
	}
}

func TestValidateListsAllFields(t *testing.T) {
	c := mustConfig(t, "w1")
	c.Rate = -1
	c.Model = ""
	err := c.Validate()
	for _, f := range []string{"rate:", "model:"} {
		if err == nil || !strings.Contains(err.Error(), f) {
			t.Fatalf("error %v does not mention %s", err, f)
		}
	}
}

func TestValidateIgnoresOtherSections(t *testing.T) {
	c := mustConfig(t, "w6")
	c.W1 = W1Params{}
	c.W2 = W2Params{}
	c.W3 = W3Params{}
	c.W4 = W4Params{}
	c.W5 = W5Params{}
	c.W7 = W7Params{}
	if err := c.Validate(); err != nil {
		t.Fatalf("w6 config rejected for its unused sections: %v", err)
	}
	c = mustConfig(t, "w7")
	c.W1, c.W2, c.W3, c.W4, c.W5, c.W6 = W1Params{}, W2Params{}, W3Params{}, W4Params{}, W5Params{}, W6Params{}
	if err := c.Validate(); err != nil {
		t.Fatalf("w7 config rejected for its unused sections: %v", err)
	}
}

// TestValidateMixMessages pins the wording of mix errors.
func TestValidateMixMessages(t *testing.T) {
	c := mustConfig(t, "w1")
	c.Mix = []MixClass{{Tenant: "a", Share: 0.5}, {Tenant: "b", Share: 0.5}, {Tenant: "c", Share: -1}}
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "mix[2].share: must be positive, got -1") {
		t.Fatalf("error %v", err)
	}
	c.Mix = []MixClass{{Tenant: "a", Priority: 2000, Share: math.Inf(1)}}
	err = c.Validate()
	for _, want := range []string{"mix[0].priority: must be in [0, 1000], got 2000", "mix[0].share: must be finite, got +Inf"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("error %v does not mention %q", err, want)
		}
	}
	// Shares need not sum to 1; one class is fine; an empty tenant too.
	for _, mix := range [][]MixClass{
		{{Tenant: "a", Share: 7}, {Tenant: "b", Share: 3}},
		{{Share: 1e-300}},
		{{Tenant: "a", Share: math.MaxFloat64}, {Tenant: "b", Share: math.MaxFloat64}},
		{{Tenant: "", Priority: 1000, Share: 1}, {Tenant: "", Priority: 0, Share: 1}},
	} {
		c.Mix = mix
		if err := c.Validate(); err != nil {
			t.Fatalf("mix %+v rejected: %v", mix, err)
		}
	}
}

func TestOverlay(t *testing.T) {
	c := mustConfig(t, "w1")
	if err := Overlay(&c, []byte("w1:\n  prompts: 64\n")); err != nil {
		t.Fatal(err)
	}
	if err := Overlay(&c, []byte("duration: 90s\n")); err != nil {
		t.Fatal(err)
	}
	want := mustConfig(t, "w1")
	want.W1.Prompts = 64
	want.Duration = 90 * time.Second
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("got %+v\nwant %+v", c, want)
	}
	// Invalid intermediate values are allowed; Validate catches them.
	if err := Overlay(&c, []byte("w1:\n  prompt_min_tokens: 9000\n")); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "w1.prompt_min_tokens") {
		t.Fatalf("Validate: %v", err)
	}
	before := c
	err := Overlay(&c, []byte("rate: 3\nw1:\n  nope: 1\n"))
	if err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("unknown key: %v", err)
	}
	if !reflect.DeepEqual(c, before) {
		t.Fatal("a failed Overlay changed the config")
	}
}

// TestOverlayMix: a later document's mix replaces the earlier one (it is
// not merged item by item), and an empty list removes it.
func TestOverlayMix(t *testing.T) {
	c := mustConfig(t, "w1")
	if err := Overlay(&c, []byte("mix:\n  - {tenant: a, priority: 1, share: 1}\n  - {tenant: b, share: 2}\n")); err != nil {
		t.Fatal(err)
	}
	if err := Overlay(&c, []byte("mix: [{tenant: c, share: 3}]\n")); err != nil {
		t.Fatal(err)
	}
	if want := []MixClass{{Tenant: "c", Share: 3}}; !reflect.DeepEqual(c.Mix, want) {
		t.Fatalf("mix %+v, want %+v", c.Mix, want)
	}
	// A failed overlay leaves the mix alone, items included.
	if err := Overlay(&c, []byte("mix: [{tenant: z, share: 9}]\nbogus: 1\n")); err == nil {
		t.Fatal("unknown key accepted")
	}
	if want := []MixClass{{Tenant: "c", Share: 3}}; !reflect.DeepEqual(c.Mix, want) {
		t.Fatalf("a failed Overlay changed the mix to %+v", c.Mix)
	}
	if err := Overlay(&c, []byte("mix: []\n")); err != nil {
		t.Fatal(err)
	}
	if len(c.Mix) != 0 {
		t.Fatalf("mix %+v after mix: []", c.Mix)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

// An Overlay error speaks YAML, not Go: an unknown key lists the keys
// allowed beside it, and a value of the wrong kind says what is wanted.
func TestOverlayErrorsNameWhatIsAllowed(t *testing.T) {
	for _, c := range []struct {
		doc      string
		mentions []string
	}{
		{"w1:\n  nope: 1\n", []string{"line 2", "nope: unknown field", "known fields here: popularity_zipf, prompt_max_tokens", "question_min_tokens"}},
		{"nope: 1\n", []string{"nope: unknown field", "arrival, duration", "w1, w2"}},
		{"w1: 3\n", []string{"want a mapping with the fields popularity_zipf", `got the number "3"`}},
		{"w1:\n  prompts: many\n", []string{"want a whole number", `got the text "many"`}},
		{"rate: fast\n", []string{"want a number", `"fast"`}},
		{"duration: soon\n", []string{`want a duration such as "10m"`}},
		{"mix: 3\n", []string{"want a list of mappings with the fields priority, share, tenant"}},
	} {
		cfg := mustConfig(t, "w1")
		err := Overlay(&cfg, []byte(c.doc))
		if err == nil {
			t.Errorf("%q: no error", c.doc)
			continue
		}
		for _, m := range c.mentions {
			if !strings.Contains(err.Error(), m) {
				t.Errorf("%q: %v does not mention %q", c.doc, err, m)
			}
		}
		if strings.Contains(err.Error(), "workload.") {
			t.Errorf("%q: %v names a Go type", c.doc, err)
		}
	}
}
