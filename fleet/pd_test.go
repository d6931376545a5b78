package fleet

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/inferrail/inferrail/router/gateway"
	"github.com/inferrail/inferrail/workload"
)

// pdConfig is W1 on n replicas, p of them prefill-only and d decode-only.
func pdConfig(t *testing.T, n, p, d, requests int) Config {
	t.Helper()
	c := smallConfig(t, "w1", requests)
	c.Replicas, c.PrefillReplicas, c.DecodeReplicas = n, p, d
	c.Workload.Rate = DefaultRate("w1", n) / 2
	c.Policy = "cost_model"
	return c
}

func TestPDEveryRequestCompletesOnItsPools(t *testing.T) {
	for _, decider := range gateway.Deciders() {
		c := pdConfig(t, 4, 2, 2, 400)
		c.PD.Decider = decider
		out, err := Simulate(c)
		if err != nil {
			t.Fatalf("%s: %v", decider, err)
		}
		s := out.Summary
		if s.Completed != 400 || s.Failed != 0 {
			t.Fatalf("%s: completed %d failed %d (%v)", decider, s.Completed, s.Failed, s.FailedBy)
		}
		if s.PD == nil || s.PD.PrefillReplicas != 2 || s.PD.DecodeReplicas != 2 {
			t.Fatalf("%s: pd summary %+v", decider, s.PD)
		}
		remote := 0
		for _, r := range out.Records {
			if r.Replica < 2 {
				t.Fatalf("%s: decoded on prefill-only replica %d: %+v", decider, r.Replica, r)
			}
			if r.Remote {
				remote++
				if r.PrefillReplica >= 2 || r.Transfer <= 0 {
					t.Fatalf("%s: remote prefill %+v", decider, r)
				}
			}
		}
		if int64(remote) != s.PD.Remote {
			t.Errorf("%s: %d remote records, summary says %d", decider, remote, s.PD.Remote)
		}
		switch decider {
		case gateway.DecideNever:
			if remote != 0 || s.PD.PrefillBusy != 0 {
				t.Errorf("never: %d remote, prefill busy %v", remote, s.PD.PrefillBusy)
			}
		case gateway.DecideAlways:
			if remote != 400 {
				t.Errorf("always: %d of 400 remote", remote)
			}
		}
		if s.PerReplica[0].Role != "prefill" || s.PerReplica[3].Role != "decode" {
			t.Errorf("%s: roles %q %q", decider, s.PerReplica[0].Role, s.PerReplica[3].Role)
		}
		for i, m := range out.Engines {
			if m.Running != 0 || m.Waiting != 0 || m.UsedBlocks != 0 {
				t.Fatalf("%s: replica %d not drained: %+v", decider, i, m)
			}
		}
	}
}

// One request alone: its TTFT is the prefill replica's prefill, the KV
// transfer (base + bytes / bandwidth), and the decode replica's first step
// of one token, exactly.
func TestPDTTFTIncludesTheTransfer(t *testing.T) {
	c := pdConfig(t, 2, 1, 1, 1)
	c.PD.Decider = gateway.DecideAlways
	out, err := Simulate(c)
	if err != nil {
		t.Fatal(err)
	}
	r := out.Records[0]
	if !r.Remote {
		t.Fatalf("not disaggregated: %+v", r)
	}
	e := c.Engine
	// The prefill: chunks of max_num_batched_tokens, then the token.
	prefill := time.Duration(0)
	for done := 0; done < r.PromptTokens; {
		n := min(e.MaxNumBatchedTokens, r.PromptTokens-done)
		prefill += e.Latency.PrefillTime(n, done)
		done += n
	}
	transfer := e.TransferTime(r.PromptTokens)
	// The decode replica's first step computes the prompt's last token.
	first := e.Latency.PrefillTime(1, r.PromptTokens-1)
	if r.Transfer != transfer {
		t.Errorf("transfer %v, want %v", r.Transfer, transfer)
	}
	// The link's event rounds up by a nanosecond.
	if got, want := r.TTFT(), prefill+transfer+first; got < want || got > want+time.Microsecond {
		t.Errorf("TTFT %v, want prefill %v + transfer %v + first step %v = %v", got, prefill, transfer, first, want)
	}
}

// Transfers leaving one prefill replica at once share its link.
func TestPDTransfersShareTheLink(t *testing.T) {
	c := pdConfig(t, 3, 1, 2, 2)
	c.PD.Decider = gateway.DecideAlways
	c.Engine.PDTransfer.BandwidthGBps = 0.5 // slow enough to overlap
	c.Workload.Rate = 1000                  // both arrive at about once
	out, err := Simulate(c)
	if err != nil {
		t.Fatal(err)
	}
	alone := c.Engine.TransferTime(out.Records[0].PromptTokens)
	if a, b := out.Records[0].Transfer, out.Records[1].Transfer; a <= alone && b <= c.Engine.TransferTime(out.Records[1].PromptTokens) {
		t.Errorf("transfers %v and %v: want at least one slower than alone (%v) while they overlap", a, b, alone)
	}
}

func TestPDSameSeedSameRun(t *testing.T) {
	c := pdConfig(t, 4, 1, 3, 300)
	c.Workload, _ = workload.DefaultConfig("w2")
	c.Workload.Requests = 300
	a, err := Simulate(c)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Simulate(c)
	if !bytes.Equal(summaryJSON(t, a.Summary), summaryJSON(t, b.Summary)) || !reflect.DeepEqual(a.Records, b.Records) {
		t.Fatal("same seed, different P/D runs")
	}
}

// Short prompts never pay for a transfer: with every prompt under the
// threshold nothing is disaggregated.
func TestPDShortPromptsStayLocal(t *testing.T) {
	c := pdConfig(t, 3, 1, 2, 200)
	c.PD.NonCachedTokens = 1 << 20
	out, err := Simulate(c)
	if err != nil {
		t.Fatal(err)
	}
	if out.Summary.PD.Remote != 0 {
		t.Errorf("%d remote prefills under an unreachable threshold", out.Summary.PD.Remote)
	}
}

func TestPDBadPools(t *testing.T) {
	for _, tc := range []struct {
		n, p, d int
		want    string
	}{
		{4, 4, 0, "decode_replicas"},
		{4, 3, 2, "replicas"},
		{4, -1, 0, "prefill_replicas"},
	} {
		c := pdConfig(t, tc.n, 0, 0, 10)
		c.PrefillReplicas, c.DecodeReplicas = tc.p, tc.d
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%d/%d/%d: %v, want an error naming %s", tc.n, tc.p, tc.d, err, tc.want)
		}
	}
}

// A replica whose only request waits for a load from its CPU tier must be
// woken when the load ends (a P/D prefill replica often is in that state):
// every run of a tiered P/D fleet ends, whatever the policy.
func TestPDWithTiersEnds(t *testing.T) {
	for _, pol := range []string{"round_robin", "least_request", "p2c", "kv_aware", "prefix_hash", "cost_model"} {
		for _, pools := range [][2]int{{1, 3}, {2, 2}} {
			c := smallConfig(t, "w1", 150)
			c.Replicas, c.PrefillReplicas, c.DecodeReplicas = 4, pools[0], pools[1]
			c.Engine.KVTiers.CPUBlocks = 2 * c.Engine.NumGPUBlocks
			c.Engine.KVTiers.CPULink = "pcie-gen4"
			c.Seed, c.Policy = 2, pol
			done := make(chan error, 1)
			go func() {
				out, err := Simulate(c)
				if err == nil && out.Summary.Completed != 150 {
					err = fmt.Errorf("%d of 150 completed", out.Summary.Completed)
				}
				done <- err
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("%s %v: %v", pol, pools, err)
				}
			case <-time.After(time.Minute):
				t.Fatalf("%s %v: the run did not end", pol, pools)
			}
		}
	}
}

// With a CPU tier the engines count what they load back as cached, and the
// router predicts it: on W2 with long think times (most turns find their
// history offloaded) the prediction follows the measured hit rate, and the
// tier serves a share of it.
func TestTierHitsPredicted(t *testing.T) {
	c := smallConfig(t, "w2", 3000)
	c.Workload.W2.ThinkMin, c.Workload.W2.ThinkMax = 60*time.Second, 120*time.Second
	c.Engine.KVTiers.CPUBlocks, c.Engine.KVTiers.CPULink = 4*c.Engine.NumGPUBlocks, "pcie-gen5"
	c.Policy = "cost_model"
	out, err := Simulate(c)
	if err != nil {
		t.Fatal(err)
	}
	s := out.Summary
	if s.Tiers == nil || s.Tiers.CPUHitRate <= 0.05 {
		t.Fatalf("tiers %+v: want a share of the hits from the CPU tier", s.Tiers)
	}
	if d := s.HitRate - s.PredictedHitRate; d > 0.1 || d < -0.1 {
		t.Errorf("hit rate %.3f measured, %.3f predicted: the tier's hits are not predicted", s.HitRate, s.PredictedHitRate)
	}
}
