package workload

import (
	"github.com/inferrail/inferrail/engine/kvblock"
)

// w3 generates closed-loop agent tasks: a task is a session whose first step
// sends [agent system prompt, task description] and whose every later step
// resends the whole context so far plus the previous step's output (the
// model's tool call) and a fresh tool result. The next step arrives a tool
// latency after the previous one completes. Request.Session is the task
// (from 1) and Request.Turn the step (from 0). Each task's steps are scripted
// when it starts (see closedLoop) and cut to those that fit max_model_len, so
// the request count is exact.
type w3 struct{ closedLoop }

func newW3(c *Config) *w3 {
	p := c.W3
	meanSteps := float64(p.StepsMin+p.StepsMax) / 2
	s := &w3{closedLoop{
		model:       c.Model,
		maxTokens:   c.Output.MaxTokens,
		maxModelLen: c.MaxModelLen,
		limit:       c.Requests,
		duration:    c.Duration,
		sessions:    make(map[uint64]*session),
		mix:         newMixer(c),
		arr:         newArrivals(c, "w3/arrivals", c.Rate/meanSteps),
		ids:         newIDGen(c.Seed, "w3/segment-ids"),
		turnsR:      newRand(c.Seed, "w3/steps"),
		turns:       span{p.StepsMin, p.StepsMax},
		sysR:        newRand(c.Seed, "w3/agent-type"),
		delayR:      newRand(c.Seed, "w3/tool-latency"),
		delayMin:    p.ToolLatencyMin,
		delayMax:    p.ToolLatencyMax,
		firstR:      newRand(c.Seed, "w3/task-lengths"),
		first:       span{p.TaskMinTokens, p.TaskMaxTokens},
		followR:     newRand(c.Seed, "w3/tool-result-lengths"),
		follow:      span{p.ToolResultMinTokens, p.ToolResultMaxTokens},
		out:         newShortOutputs(c, "w3/outputs", p.OutputMedianTokens, p.OutputSigma),
		plan:        true,
	}}
	lr := newRand(c.Seed, "w3/system-lengths")
	s.sys = make([]kvblock.Segment, p.AgentTypes)
	for i := range s.sys {
		s.sys[i] = s.ids.segment(uniform(lr, p.SystemMinTokens, p.SystemMaxTokens))
	}
	return s
}
