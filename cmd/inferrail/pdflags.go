package main

import (
	"strings"

	"github.com/spf13/cobra"

	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/router/gateway"
)

// pdFlags are the fleet's P/D pools and decision and the engines' lower KV
// tiers, for sim, compare and capacity.
type pdFlags struct {
	prefill, decode int
	decider         string
	nonCached       int
	prefillPolicy   string
	cpuBlocks       int
	diskBlocks      int
	cpuLink         string
	diskLink        string
}

func (p *pdFlags) register(cmd *cobra.Command, pools bool) {
	d := fleet.DefaultConfig()
	fl := cmd.Flags()
	if pools {
		fl.IntVar(&p.prefill, "prefill-replicas", 0, "of --replicas, this many are prefill-only (disaggregated prefill/decode; the rest decode)")
		fl.IntVar(&p.decode, "decode-replicas", 0, "of --replicas, this many are decode-only (with --prefill-replicas; replicas in neither pool serve both)")
	}
	fl.StringVar(&p.decider, "pd-decider", d.PD.Decider, "P/D: when a request prefills on a prefill replica: "+strings.Join(gateway.Deciders(), ", "))
	fl.IntVar(&p.nonCached, "pd-non-cached-tokens", d.PD.NonCachedTokens, "P/D: least uncached prompt tokens (on the chosen decode replica) worth a remote prefill (threshold and cost deciders)")
	fl.StringVar(&p.prefillPolicy, "pd-prefill-policy", d.PD.PrefillPolicy, "P/D: the policy that picks the prefill replica")
	fl.IntVar(&p.cpuBlocks, "kv-cpu-blocks", -1, "KV blocks of each engine's CPU tier (evicted GPU blocks offload there; default: the profile's kv_tiers.cpu_blocks, 0 = off)")
	fl.IntVar(&p.diskBlocks, "kv-disk-blocks", -1, "KV blocks of each engine's disk tier, below the CPU tier (default: the profile's kv_tiers.disk_blocks, 0 = off)")
	fl.StringVar(&p.cpuLink, "kv-cpu-link", "pcie-gen5", "the CPU tier's link to the GPU, where the profile gives no kv_tiers.cpu_bandwidth_gbps or cpu_link: pcie-gen5 (50 GB/s), pcie-gen4 (25 GB/s)")
	fl.StringVar(&p.diskLink, "kv-disk-link", "nvme", "the disk tier's link, where the profile gives no kv_tiers.disk_bandwidth_gbps or disk_link: nvme (6 GB/s), pcie-gen4, pcie-gen5")
}

// apply sets the pools, the decision and the tiers the flags name; the
// library validates them.
func (p *pdFlags) apply(cmd *cobra.Command, cfg *fleet.Config) {
	cfg.PrefillReplicas, cfg.DecodeReplicas = p.prefill, p.decode
	cfg.PD.Decider = p.decider
	cfg.PD.NonCachedTokens = p.nonCached
	cfg.PD.PrefillPolicy = p.prefillPolicy
	if cmd.Flags().Changed("kv-cpu-blocks") {
		cfg.Engine.KVTiers.CPUBlocks = p.cpuBlocks
	}
	if cmd.Flags().Changed("kv-disk-blocks") {
		cfg.Engine.KVTiers.DiskBlocks = p.diskBlocks
	}
	cfg.Engine.KVTiers = cfg.Engine.KVTiers.WithLinks(p.cpuLink, p.diskLink)
}
