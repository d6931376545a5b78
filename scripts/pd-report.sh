#!/usr/bin/env bash
# The P/D and tiered-KV benchmarks (part of make report):
#   docs/benchmarks/pd/        aggregated vs P/D at two splits on W1, W3 and
#                              the Mooncake conversation trace; the fewest
#                              replicas and the best split at the SLO
#                              (capacity --pd-split) on W1 and W3, and on W3
#                              with a tight TPOT objective; the scenarios run
#                              in inference-sim (BLIS) too (blis/).
#   docs/benchmarks/tiered-kv/ GPU-only vs GPU+CPU tier on W2 with long think
#                              times and on the Mooncake conversation trace.
# Each directory holds compare's or capacity's usual outputs; README.md
# there is the reading. SEEDS narrows the seeds for a quicker look.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin/inferrail}
SEEDS=${SEEDS:-3}
PD=docs/benchmarks/pd
TIER=docs/benchmarks/tiered-kv
MOONCAKE=../shared/traces/mooncake/conversation_trace.jsonl
POLICIES=cost_model,llmd,dynamo
[ "$BIN" = bin/inferrail ] && make -s build
rm -rf "$PD"/w1 "$PD"/w3 "$PD"/mooncake "$PD"/w1-capacity "$PD"/w3-capacity "$PD"/w3-capacity-tpot25 "$PD"/w3-capacity-tpot25-aggregated "$PD"/blis-a "$PD"/blis-b-gpu "$PD"/blis-b-cpu "$TIER"/w2-gpu "$TIER"/w2-cpu "$TIER"/mooncake-gpu "$TIER"/mooncake-cpu
mkdir -p "$PD" "$TIER"

"$BIN" compare --workload w1 --policies $POLICIES --replicas 8 --pools 0/0,2/6,4/4 --seeds "$SEEDS" --rates 6.4,9.6 --out "$PD"/w1 --title "W1 on 8 replicas: aggregated and two P/D splits"
"$BIN" compare --workload w3 --policies $POLICIES --replicas 8 --pools 0/0,2/6,4/4 --seeds "$SEEDS" --rates 4,6 --out "$PD"/w3 --title "W3 on 8 replicas: aggregated and two P/D splits"
"$BIN" capacity --workload w1 --policies $POLICIES --pd-split --seeds "$SEEDS" --out "$PD"/w1-capacity --title "W1: replicas and split needed at 6.4 req/s"
"$BIN" capacity --workload w3 --policies $POLICIES --pd-split --seeds "$SEEDS" --out "$PD"/w3-capacity --title "W3: replicas and split needed at 4 req/s"
"$BIN" capacity --workload w3 --policies $POLICIES --pd-split --slo-tpot 25ms --seeds "$SEEDS" --out "$PD"/w3-capacity-tpot25 --title "W3: replicas and split needed at 4 req/s, TPOT p99 <= 25 ms"
"$BIN" capacity --workload w3 --policies $POLICIES --slo-tpot 25ms --seeds "$SEEDS" --out "$PD"/w3-capacity-tpot25-aggregated --title "W3: aggregated replicas needed at 4 req/s, TPOT p99 <= 25 ms"
if [ -f "$MOONCAKE" ]; then
	"$BIN" compare --trace "$MOONCAKE" --profile Llama-3.1-8B@H200 --replicas 16 --policies $POLICIES --pools 0/0,4/12,8/8 --seeds "$SEEDS" --out "$PD"/mooncake --title "Mooncake conversation trace on 16 x Llama-3.1-8B@H200: aggregated and two P/D splits"
	"$BIN" compare --trace "$MOONCAKE" --profile Llama-3.1-8B@H200 --replicas 16 --policies $POLICIES --seeds "$SEEDS" --out "$TIER"/mooncake-gpu --title "Mooncake conversation trace on 16 x Llama-3.1-8B@H200, GPU cache only"
	"$BIN" compare --trace "$MOONCAKE" --profile Llama-3.1-8B@H200 --replicas 16 --policies $POLICIES --kv-cpu-blocks 224696 --kv-cpu-link pcie-gen5 --seeds "$SEEDS" --out "$TIER"/mooncake-cpu --title "Mooncake conversation trace on 16 x Llama-3.1-8B@H200, GPU and a CPU tier of 4x the GPU's blocks"
else
	echo "pd-report: $MOONCAKE not found: the Mooncake runs are skipped" >&2
fi
W2="--workload w2 --set w2.think_min=60s --set w2.think_max=120s --replicas 4 --policies $POLICIES --seeds $SEEDS --warmup 120s"
"$BIN" compare $W2 --out "$TIER"/w2-gpu --title "W2 with 60-120 s think times on 4 replicas, GPU cache only"
"$BIN" compare $W2 --kv-cpu-blocks 16384 --kv-cpu-link pcie-gen5 --out "$TIER"/w2-cpu --title "W2 with 60-120 s think times on 4 replicas, GPU and a CPU tier of 4x the GPU's blocks"

# The two scenarios run in inference-sim (docs/benchmarks/pd/blis.md):
# (a) 1,000 unique 4,096-token prompts, 256-token answers, Poisson 3 req/s,
# 4 replicas aggregated or 2 prefill + 2 decode (decider always);
# (b) 2,000 requests of one of 64 1,024-token prefixes and a fresh 128-token
# suffix, 64-token answers, Poisson 5 req/s, one replica of 2,000 GPU blocks
# with and without 6,000 CPU blocks at 25 GB/s.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$BIN" trace synth --out "$tmp"/a.jsonl --prefixes 0 --new-session 1 --input-median 4096 --input-sigma 0 --output-median 256 --output-sigma 0 --rate 3 --requests 1000
# (b)'s prefixes are equally popular, as inference-sim's workload draws them
# (trace synth's are Zipf): a Mooncake JSON-lines file written here.
python3 - "$tmp"/b.jsonl <<'PY'
import json, random, sys
rng = random.Random(42)
t = 0.0
with open(sys.argv[1], "w") as f:
    for i in range(2000):
        g = rng.randrange(64)
        f.write(json.dumps({"timestamp": int(t * 1000), "input_length": 1152, "output_length": 64,
                            "hash_ids": [2 * g, 2 * g + 1, 1000 + i]}) + "\n")
        t += rng.expovariate(5.0)
PY
"$BIN" compare --trace "$tmp"/a.jsonl --policies least_request --replicas 4 --pools 0/0,2/2 --pd-decider always --seeds "$SEEDS" --out "$PD"/blis-a --title "inference-sim scenario (a): 4 aggregated vs 2 prefill + 2 decode"
printf 'num_gpu_blocks: 2000\n' >"$tmp"/b.yaml
"$BIN" compare --trace "$tmp"/b.jsonl --profile "$tmp"/b.yaml --policies round_robin --replicas 1 --seeds "$SEEDS" --out "$PD"/blis-b-gpu --title "inference-sim scenario (b): GPU only"
"$BIN" compare --trace "$tmp"/b.jsonl --profile "$tmp"/b.yaml --policies round_robin --replicas 1 --kv-cpu-blocks 6000 --kv-cpu-link pcie-gen4 --seeds "$SEEDS" --out "$PD"/blis-b-cpu --title "inference-sim scenario (b): 6,000 CPU blocks at 25 GB/s"
