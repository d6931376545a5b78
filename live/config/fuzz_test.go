package config

import (
	"os"
	"strings"
	"testing"
)

// FuzzParse: any document is either a valid configuration or an error made
// of FieldErrors; never a panic.
func FuzzParse(f *testing.F) {
	if data, err := os.ReadFile(examplePath); err == nil {
		f.Add(data)
	}
	f.Add([]byte(minimal))
	f.Add([]byte("models:\n  - {name: a, aliases: [b], index: events, replicas: [{url: 'http://h:1', kv_events: 'tcp://h:2'}], dns: [{name: g, host: x, port: 1, kv_events_port: 2}]}\n"))
	f.Add([]byte("max_body_bytes: 4MiB\nretry: {attempts: 11}\nmodels: [{name: a}]\n"))
	f.Add([]byte("models:\n  - {name: a, admission: tokenflow, overcommit: 1.5, max_model_len: 100, default_max_tokens: 50, max_priority: 3, kv_capacity_blocks: 9, queue: {max_requests: 0, max_bytes: 1KiB, timeout: 1s, shed_on_slo: true}, replicas: [{url: 'http://h:1', kv_capacity_blocks: 5}]}\n"))
	f.Add([]byte("models: [{name: a, admission: foo, queue: {timeout: 0}, replicas: [{url: 'http://h:1'}]}]\n"))
	f.Add([]byte("a: &x [*x]\n"))
	f.Add([]byte("models:\n  - &m {name: a, replicas: [{url: 'http://h:1'}]}\n  - *m\n"))
	f.Add([]byte("---\n---\n"))
	f.Add([]byte("? [a]\n: 1\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			var fes []*FieldError
			if !fieldErrors(err, &fes) {
				t.Fatalf("error is not made of FieldErrors: %v", err)
			}
			for _, fe := range fes {
				if fe.Msg == "" {
					t.Fatalf("a FieldError without a message: %+v", fe)
				}
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse accepted a config that Validate refuses: %v", err)
		}
		for i := range c.Models {
			m := &c.Models[i]
			for _, n := range append([]string{m.Name}, m.Aliases...) {
				if got, ok := c.Model(n); !ok || got != m {
					t.Fatalf("Model(%q) = %v, %v; want models[%d]", n, got, ok, i)
				}
			}
			for _, r := range m.Replicas {
				if r.Name == "" {
					t.Fatalf("replica without a name: %+v", r)
				}
			}
		}
		if got := strings.Count(c.Summary(), "\n"); got != len(c.Models) {
			t.Fatalf("Summary has %d lines for %d models", got, len(c.Models))
		}
	})
}
