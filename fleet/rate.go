package fleet

import (
	"math"
	"strconv"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/workload"
)

// RatePerReplica is a workload's offered load per replica on the default
// engine profile, in requests per second: about 70% of the highest rate at
// which round robin keeps up (see README "Default rates"). Unknown workloads
// get 1. Config.DefaultRate scales it to other profiles.
func RatePerReplica(workload string) float64 {
	switch workload {
	case "w1":
		return 0.8
	case "w2":
		return 1.75
	case "w3":
		return 0.5
	case "w4":
		return 1
	case "w5":
		return 5
	case "w6":
		return 2.5
	case "w7":
		// The light background stream; the heavy bursts come on top.
		return 0.5
	}
	return 1
}

// DefaultRate is the offered load `inferrail sim` uses for a workload on a
// fleet of n replicas of the default engine profile when no rate is given:
// RatePerReplica x n. Config.DefaultRate is the same rule for any profile
// and workload configuration.
func DefaultRate(workload string, n int) float64 {
	return RatePerReplica(workload) * float64(n)
}

// lengthSample is how many requests DefaultRate draws to learn a workload's
// mean lengths.
const lengthSample = 512

// DefaultRate is the offered load of c's fleet when no rate is given (sim,
// compare and capacity without --rate): RatePerReplica of the workload for
// each of c.Replicas, scaled by how much one of c's engines serves against
// one default engine (engine.DefaultConfig), both estimated by
// EstimateThroughput at the workload's mean prompt and output lengths
// (workload.MeanLengths over its first 512 requests); the scale is rounded
// to 3 significant digits and the rate it gives to 4. So every profile runs at about the share of its
// capacity that the default rates are of the default profile's (about
// 70% of what round robin sustains): on the default profile the rate is
// RatePerReplica x replicas exactly, and a profile whose engine serves
// twice as much gets twice the rate. The estimate leaves the prefix cache
// out, so a profile whose larger KV cache also raises the hit rate is
// offered less than it could serve. If the workload cannot be drawn (an
// invalid configuration, which Validate reports) the scale is 1.
func (c *Config) DefaultRate() float64 {
	base := DefaultRate(c.Workload.Workload, max(c.Replicas, 1)) // Validate reports a fleet of none
	w := c.Workload
	w.Seed = c.Seed
	l, err := workload.MeanLengths(w, lengthSample)
	if err != nil {
		return base
	}
	scale := EstimateThroughput(c.Engine, l.Prompt, l.Output) / EstimateThroughput(engine.DefaultConfig(), l.Prompt, l.Output)
	if !(scale > 0) || math.IsInf(scale, 0) {
		return base
	}
	scale, _ = strconv.ParseFloat(strconv.FormatFloat(scale, 'g', 3, 64), 64)
	if scale == 1 {
		return base
	}
	r, _ := strconv.ParseFloat(strconv.FormatFloat(base*scale, 'g', 4, 64), 64)
	return r
}

// EstimateThroughput estimates the requests per second one replica of e
// serves when saturated by requests of prompt tokens, none of them cached,
// and output tokens: a roofline of the engine's latency model, not a
// simulation. Decoding runs batches of b sequences, b the most that fit
// (max_num_seqs, and the KV cache at a mean context of prompt + output/2
// tokens), each step costing
//
//	step_fixed + b x (decode_seq + decode_ctx_token x (prompt + output/2))
//
// for b tokens; each request's prefill costs prefill_token x prompt +
// prefill_pair x prompt²/2 on top (chunking does not change the sum). A
// request's share of engine time is output x step/b + prefill, and the
// replica serves its inverse, times its data-parallel ranks.
func EstimateThroughput(e engine.Config, prompt, output float64) float64 {
	prompt, output = max(prompt, 0), max(output, 1)
	p := e.Latency
	ctx := prompt + output/2
	b := float64(max(e.MaxNumSeqs, 1))
	if kv := float64(e.NumGPUBlocks) * float64(e.BlockSize); ctx > 0 && kv/ctx < b {
		b = max(kv/ctx, 1)
	}
	stepMs := p.StepFixedMs + b*(p.DecodeSeqUs/1e3+p.DecodeCtxTokenNs*ctx/1e6)
	prefillMs := p.PrefillTokenUs*prompt/1e3 + p.PrefillPairNs*prompt*prompt/2/1e6
	perRequestMs := output*stepMs/b + prefillMs
	if !(perRequestMs > 0) {
		return 0
	}
	return float64(e.Ranks()) * 1000 / perRequestMs
}

// DefaultRequests is the run length `inferrail sim` uses for a workload when
// neither a request count nor a duration is given: 2000, but for w7, whose
// 600 hold two bursts and their background.
func DefaultRequests(workload string) int {
	if workload == "w7" {
		return 600
	}
	return 2000
}
