package workload

import (
	"slices"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
	"pgregory.net/rapid"
)

// checkTasks checks the closed-loop invariants of a simulated w3 run and
// returns the steps of each task: step k+1's prompt is step k's prompt, step
// k's Output and a fresh tool result; it arrives a tool latency after step k
// completed.
func checkTasks(t tb, c *Config, res simResult) map[uint64][]*Request {
	t.Helper()
	p := &c.W3
	byTask := map[uint64][]*Request{}
	var lastTask uint64
	fresh := map[uint64]bool{}
	freshOnce := func(r *Request, s kvblock.Segment) {
		if fresh[s.ID] {
			t.Fatalf("request %d: segment %x reused", r.ID, s.ID)
		}
		fresh[s.ID] = true
	}
	for i, r := range res.reqs {
		checkRequest(t, c, r)
		if r.OutputTokens > c.Output.MaxTokens || r.OutputTokens < c.Output.Min {
			t.Fatalf("request %d: output %d tokens", r.ID, r.OutputTokens)
		}
		freshOnce(r, r.Output)
		if r.Session == 0 {
			t.Fatalf("request %d has no task", r.ID)
		}
		if i > 0 && r.Arrival < res.reqs[i-1].Arrival {
			t.Fatal("arrivals out of order")
		}
		steps := byTask[r.Session]
		if r.Turn != len(steps) {
			t.Fatalf("task %d: step %d after %d steps", r.Session, r.Turn, len(steps))
		}
		if r.Turn == 0 {
			if r.Session != lastTask+1 {
				t.Fatalf("task %d starts after task %d", r.Session, lastTask)
			}
			lastTask = r.Session
			if len(r.Prompt) != 2 {
				t.Fatalf("task %d: first prompt %+v", r.Session, r.Prompt)
			}
			if s := r.Prompt[0]; s.Len < p.SystemMinTokens || s.Len > p.SystemMaxTokens {
				t.Fatalf("task %d: system prompt of %d tokens", r.Session, s.Len)
			}
			task := r.Prompt[1]
			if task.Len < p.TaskMinTokens || task.Len > p.TaskMaxTokens {
				t.Fatalf("task %d: description of %d tokens", r.Session, task.Len)
			}
			freshOnce(r, task)
		} else {
			prev := steps[len(steps)-1]
			done, ok := res.finish[prev.ID]
			if !ok {
				t.Fatalf("task %d step %d arrived before step %d finished", r.Session, r.Turn, prev.Turn)
			}
			if res.failed[prev.ID] {
				t.Fatalf("task %d continued after failed step %d", r.Session, prev.Turn)
			}
			if lat := r.Arrival - done; lat < p.ToolLatencyMin || lat > p.ToolLatencyMax {
				t.Fatalf("task %d step %d: tool latency %v", r.Session, r.Turn, lat)
			}
			want := append(slices.Clone(prev.Prompt), prev.Output)
			if len(r.Prompt) != len(want)+1 || !slices.Equal(r.Prompt[:len(want)], want) {
				t.Fatalf("task %d step %d is not step %d's prompt + output + tool result", r.Session, r.Turn, prev.Turn)
			}
			tool := r.Prompt[len(want)]
			if tool.Len < p.ToolResultMinTokens || tool.Len > p.ToolResultMaxTokens {
				t.Fatalf("tool result of %d tokens", tool.Len)
			}
			freshOnce(r, tool)
		}
		byTask[r.Session] = append(steps, r)
	}
	return byTask
}

func TestW3ClosedLoop(t *testing.T) {
	c := mustConfig(t, "w3")
	c.Requests = 5000
	src := mustNew(t, c)
	res := simulate(t, src, serviceTime, nil)
	if len(res.reqs) != c.Requests {
		t.Fatalf("%d requests, want exactly %d", len(res.reqs), c.Requests)
	}
	tasks := checkTasks(t, &c, res)
	last := uint64(len(tasks))
	systems := map[kvblock.Segment]bool{}
	var total, below, full int
	for id, steps := range tasks {
		n := len(steps)
		total += n
		// Only the last task started may be cut short by the budget; others
		// end early only when the context would not fit.
		if n > c.W3.StepsMax {
			t.Fatalf("task %d has %d steps", id, n)
		}
		if n < c.W3.StepsMin && id != last {
			lastStep := steps[n-1]
			if lastStep.PromptTokens()+lastStep.OutputTokens+c.W3.ToolResultMaxTokens+c.Output.MaxTokens <= c.MaxModelLen {
				t.Fatalf("task %d ended after %d steps with room left", id, n)
			}
		}
		if n == c.W3.StepsMax {
			full++
		}
		systems[steps[0].Prompt[0]] = true
		for _, r := range steps {
			if r.OutputTokens < 60 {
				below++
			}
		}
	}
	if len(systems) != c.W3.AgentTypes {
		t.Fatalf("%d agent system prompts, want %d", len(systems), c.W3.AgentTypes)
	}
	// Steps are uniform in [3, 20] (mean 11.5), less the tasks cut by the
	// 32k context.
	mean := float64(total) / float64(len(tasks))
	if mean < 9.5 || mean > 12 {
		t.Fatalf("mean %.2f steps per task", mean)
	}
	if full == 0 {
		t.Fatal("no task ran all 20 steps")
	}
	// Outputs are short: median 60.
	if f := float64(below) / float64(total); f < 0.46 || f > 0.54 {
		t.Fatalf("%.3f of step outputs below the median 60", f)
	}
	if n := len(src.(*w3).sessions); n != 0 {
		t.Fatalf("%d tasks still remembered at the end", n)
	}
	t.Logf("%d tasks, mean %.2f steps, %d ran all %d", len(tasks), mean, full, c.W3.StepsMax)
}

func TestW3FailureEndsTask(t *testing.T) {
	c := mustConfig(t, "w3")
	c.Requests = 3000
	fail := func(r *Request) bool { return kvblock.Mix64(r.ID^0xbeef)%7 == 0 }
	res := simulate(t, mustNew(t, c), serviceTime, fail)
	tasks := checkTasks(t, &c, res)
	var failures int
	for _, steps := range tasks {
		for i, r := range steps {
			if res.failed[r.ID] {
				failures++
				if i != len(steps)-1 || res.followed[r.ID] != nil {
					t.Fatalf("task %d went on after failed step %d", r.Session, r.Turn)
				}
			}
		}
	}
	if failures == 0 || len(res.reqs) > c.Requests {
		t.Fatalf("%d failures, %d requests", failures, len(res.reqs))
	}
}

func TestW3ContextLimitEndsTask(t *testing.T) {
	c := mustConfig(t, "w3")
	c.Requests = 2000
	c.MaxModelLen = 8192
	c.W3.StepsMin, c.W3.StepsMax = 20, 20
	res := simulate(t, mustNew(t, c), serviceTime, nil)
	tasks := checkTasks(t, &c, res) // checks prompt + max_tokens <= max_model_len
	for id, steps := range tasks {
		if len(steps) >= 20 {
			t.Fatalf("task %d ran all %d steps in 8192 tokens", id, len(steps))
		}
	}
}

func TestW3TaskRate(t *testing.T) {
	c := mustConfig(t, "w3")
	c.Rate = 115
	c.Requests = 0
	c.Duration = 20000 * time.Second / 10 // about 20k tasks at 10/s
	src := mustNew(t, c)
	firsts := drainOpen(src)
	if len(firsts) < 19000 {
		t.Fatalf("only %d tasks", len(firsts))
	}
	checkPoisson(t, firsts, c.Rate/11.5)
}

func TestW3Property(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c, _ := DefaultConfig("w3")
		c.Seed = rapid.Uint64().Draw(t, "seed")
		c.Requests = rapid.IntRange(1, 300).Draw(t, "requests")
		genOutput(t, &c)
		genArrival(t, &c)
		p := &c.W3
		p.AgentTypes = rapid.IntRange(1, 8).Draw(t, "agent_types")
		p.SystemMinTokens = rapid.IntRange(1, 3000).Draw(t, "system_min")
		p.SystemMaxTokens = rapid.IntRange(p.SystemMinTokens, 3000).Draw(t, "system_max")
		p.TaskMinTokens = rapid.IntRange(1, 600).Draw(t, "task_min")
		p.TaskMaxTokens = rapid.IntRange(p.TaskMinTokens, 600).Draw(t, "task_max")
		p.ToolResultMinTokens = rapid.IntRange(1, 1500).Draw(t, "tool_min")
		p.ToolResultMaxTokens = rapid.IntRange(p.ToolResultMinTokens, 1500).Draw(t, "tool_max")
		p.OutputMedianTokens = rapid.Float64Range(1, 500).Draw(t, "out_median")
		p.OutputSigma = rapid.Float64Range(0, 2).Draw(t, "out_sigma")
		p.StepsMin = rapid.IntRange(1, 25).Draw(t, "steps_min")
		p.StepsMax = rapid.IntRange(p.StepsMin, 25).Draw(t, "steps_max")
		p.ToolLatencyMin = time.Duration(rapid.Int64Range(1, int64(5*time.Second)).Draw(t, "latency_min"))
		p.ToolLatencyMax = p.ToolLatencyMin + time.Duration(rapid.Int64Range(0, int64(5*time.Second)).Draw(t, "latency_span"))
		c.MaxModelLen = max(p.SystemMaxTokens+p.TaskMaxTokens+c.Output.MaxTokens+rapid.IntRange(0, 12000).Draw(t, "slack"), p.ToolResultMaxTokens)
		failEvery := rapid.Uint64Range(0, 10).Draw(t, "fail_every")
		fail := func(r *Request) bool { return failEvery > 0 && kvblock.Mix64(r.ID^c.Seed)%failEvery == 0 }
		src := mustNew(t, c)
		res := simulate(t, src, serviceTime, fail)
		tasks := checkTasks(t, &c, res)
		if len(res.reqs) > c.Requests {
			t.Fatalf("%d requests, limit %d", len(res.reqs), c.Requests)
		}
		for id, steps := range tasks {
			if len(steps) > p.StepsMax {
				t.Fatalf("task %d: %d steps", id, len(steps))
			}
		}
		if failEvery == 0 && len(res.reqs) != c.Requests {
			t.Fatalf("%d requests without failures, want exactly %d", len(res.reqs), c.Requests)
		}
		if n := len(src.(*w3).sessions); n != 0 {
			t.Fatalf("%d tasks remembered at the end", n)
		}
	})
}
