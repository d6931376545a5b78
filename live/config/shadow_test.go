package config

import (
	"strings"
	"testing"
)

// shadow_policy parses, shows in the summary, and must name a policy: the
// error names the field and the policies there are.
func TestShadowPolicy(t *testing.T) {
	doc := `
models:
  - name: m
    policy: cost_model
    shadow_policy: llmd
    replicas: [{url: "http://127.0.0.1:8001"}]
`
	c, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Models[0].ShadowPolicy; got != "llmd" {
		t.Fatalf("shadow_policy %q", got)
	}
	if s := c.Summary(); !strings.Contains(s, "shadow_policy llmd") {
		t.Fatalf("summary %q", s)
	}
	if DefaultModel().ShadowPolicy != "" {
		t.Fatal("a shadow by default")
	}
	_, err = Parse([]byte(strings.Replace(doc, "shadow_policy: llmd", "shadow_policy: fastest", 1)))
	fes := fieldErrs(t, err)
	if len(fes) != 1 || fes[0].Path != "models[0].shadow_policy" || !strings.Contains(fes[0].Error(), `unknown policy "fastest"; want one of aibrix,`) {
		t.Fatalf("errors %v", err)
	}
}
