package results

import "time"

// PDSummary is what disaggregated prefill/decode (P/D) did in a run: the
// pools, how many requests prefilled on a prefill replica (remote) or on
// their decode replica (local), the KV transfers and each pool's busy
// share. Summary.PD is nil for a fleet without prefill replicas.
type PDSummary struct {
	// PrefillReplicas, DecodeReplicas and BothReplicas size the pools.
	PrefillReplicas int `json:"prefill_replicas"`
	DecodeReplicas  int `json:"decode_replicas"`
	BothReplicas    int `json:"both_replicas"`
	// Remote counts requests dispatched with a remote prefill, Local those
	// the decider kept on their decode replica, Fallbacks the remote
	// prefills that failed (the request then prefilled locally). Every
	// request of the run counts, warmup included.
	Remote    int64 `json:"remote_prefills"`
	Local     int64 `json:"local_prefills"`
	Fallbacks int64 `json:"fallbacks"`
	// TransferMs is the KV transfers' time, from the prefill's end to the
	// decode replica's having the KV (link base latency, and the bytes at
	// the link's share of bandwidth), over measured requests.
	TransferMs Latency `json:"transfer_ms"`
	// TransferredGB is the KV moved, in GB (1e9 bytes).
	TransferredGB float64 `json:"transferred_gb"`
	// PrefillBusy, DecodeBusy and BothBusy are each pool's mean busy
	// fraction (ReplicaSummary.BusyFraction); 0 for an empty pool.
	PrefillBusy float64 `json:"prefill_busy"`
	DecodeBusy  float64 `json:"decode_busy"`
	BothBusy    float64 `json:"both_busy"`
}

// TierSummary splits the engines' prompt tokens served from cache by KV
// tier, over the whole run (engine counters): the GPU prefix cache, and
// blocks loaded back from the CPU and disk tiers. Summary.Tiers is nil
// when no engine has a lower tier.
type TierSummary struct {
	GPUHitRate  float64 `json:"gpu_hit_rate"`
	CPUHitRate  float64 `json:"cpu_hit_rate"`
	DiskHitRate float64 `json:"disk_hit_rate"`
	// LoadS is the time requests spent waiting for blocks to load back,
	// summed over requests, in seconds.
	LoadS float64 `json:"load_s"`
}

// NewTierSummary divides the tiers' hit tokens by the prompt tokens the
// engines saw; load is the requests' total wait for loads.
func NewTierSummary(prompt, gpu, cpu, disk int64, load time.Duration) *TierSummary {
	t := &TierSummary{}
	if prompt > 0 {
		t.GPUHitRate = roundFrac(float64(gpu) / float64(prompt))
		t.CPUHitRate = roundFrac(float64(cpu) / float64(prompt))
		t.DiskHitRate = roundFrac(float64(disk) / float64(prompt))
	}
	t.LoadS = roundSig(load.Seconds())
	return t
}

// PoolBusy is the mean busy fraction of the replicas of s whose index
// in(i) accepts (0 when none does).
func PoolBusy(s *Summary, in func(i int) bool) float64 {
	sum, n := 0.0, 0
	for i, r := range s.PerReplica {
		if in(i) {
			sum += r.BusyFraction
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return roundFrac(sum / float64(n))
}
