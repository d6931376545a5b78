package main

import (
	"strings"
	"testing"
)

func TestFlagCompletion(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"sim", "--policy", ""}, "cost_model"},
		{[]string{"compare", "--policies", "round_robin,"}, "round_robin,cost_model"},
		{[]string{"capacity", "--workload", ""}, "w7"},
		{[]string{"sim", "--profile", ""}, "Qwen3-30B-A3B@H100:dp2:ep"},
		{[]string{"calibrate", "--preset", ""}, "Llama-3.1-8B@H100"},
		{[]string{"compare", "--admissions", ""}, "kv"},
		{[]string{"trace", "stats", "--format", ""}, "mooncake"},
	} {
		_, stdout, _ := runCLI(append([]string{"__complete"}, c.args...)...)
		if !strings.Contains(stdout, c.want+"\n") {
			t.Errorf("%v: completions lack %q:\n%s", c.args, c.want, stdout[:min(len(stdout), 300)])
		}
	}
}
