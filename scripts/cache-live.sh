#!/usr/bin/env bash
# What a hit of the exact response cache costs through inferrail live, at
# RATE req/s (default 1,000) for SECONDS_PER_RUN seconds (default 10): three
# `inferrail engine`s with a near-zero profile (as bench-live), live with
# response_cache on (memory store; the tenant is the x-inferrail-tenant
# header bench sends), the same live without the cache, and the engines
# directly (round robin, client side). The load is a Mooncake-format trace
# of Poisson arrivals whose requests repeat PROMPTS (default 20) prompts of
# 256 tokens with 16-token answers, all deterministic (bench sends
# temperature 0, stream with include_usage): a warm-up run stores every
# prompt, so each measured run through the cache is all hits (live's
# metrics are read before and after to count them). The three paths run
# alternately, RUNS times (default 3). Results: $OUT/results.md.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/cache-live}
RATE=${RATE:-1000}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-10}
PROMPTS=${PROMPTS:-20}
RUNS=${RUNS:-3}
BIN=bin/inferrail

make -s build
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.cpu
# shellcheck source=scripts/live-lib.sh
. scripts/live-lib.sh
start_zero_engines 19201 19202 19203
live_config() { # listen admin_listen cache(on|off)
	cat <<YAML
listen: 127.0.0.1:$1
admin_listen: 127.0.0.1:$2
drain_delay: 0s
log: {access_sample: 0}
YAML
	zero_model_yaml 19201 19202 19203
	if [ "$3" = on ]; then
		printf '    response_cache: {enabled: true, tenant_header: X-Inferrail-Tenant}\n'
	fi
}
live_config 19280 19290 on >"$TMP/cached.yaml"
live_config 19282 19292 off >"$TMP/plain.yaml"
$BIN live --config "$TMP/cached.yaml" 2>"$TMP/cached.log" &
CACHED=$!
PIDS+=($CACHED)
$BIN live --config "$TMP/plain.yaml" 2>"$TMP/plain.log" &
PLAIN=$!
PIDS+=($PLAIN)
for port in 19290 19292; do
	for _ in $(seq 100); do curl -sf 127.0.0.1:$port/readyz >/dev/null && break; sleep 0.1; done
done

# The trace: Poisson arrivals at RATE, each request one of PROMPTS prompts
# (a 256-token block of its own), 16 tokens out.
N=$((RATE * SECONDS_PER_RUN))
python3 - "$TMP/trace.jsonl" "$N" "$RATE" "$PROMPTS" <<'PY'
import json, random, sys
path, n, rate, prompts = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
rng = random.Random(17)
t = 0.0
with open(path, "w") as f:
    for i in range(n):
        f.write(json.dumps({"timestamp": round(t, 3), "input_length": 256, "output_length": 16, "hash_ids": [i % prompts]}) + "\n")
        t += rng.expovariate(rate) * 1000
PY

HZ=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
run() { # name url [pid to charge the CPU of]
	local name=$1 url=$2 pid=${3:-} before=0
	[ -n "$pid" ] && before=$(ticks "$pid")
	$BIN bench --base-url "$url" --trace "$TMP/trace.jsonl" --header 'X-Inferrail-Tenant: bench' --timeout 30s --json 2>/dev/null >"$OUT/$name.json"
	if [ -n "$pid" ]; then
		echo $(( ($(ticks "$pid") - before) * 1000000 / HZ / N )) >"$OUT/$name.cpu"
	fi
}
summarise() { # name
	python3 - "$OUT/$1.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"{s['ttft_ms']['p50']:.3f} {s['ttft_ms']['p99']:.3f} {s['e2e_ms']['p50']:.3f} {s['e2e_ms']['p99']:.3f} {s['completed']} {s['failed']}")
PY
}
counter() { # metric
	curl -sf 127.0.0.1:19290/metrics | awk -v m="$1" '$1 ~ "^"m"[{ ]" || $1 == m {s += $2} END {printf "%d\n", s}'
}
DIRECT=http://127.0.0.1:19201,http://127.0.0.1:19202,http://127.0.0.1:19203

# Warm-up: the cache stores every prompt, connections and engines warm.
run warm-direct "$DIRECT"
run warm-plain http://127.0.0.1:19282
run warm-cached http://127.0.0.1:19280
{
	echo "# Response cache hits through inferrail live ($(date -u +%Y-%m-%d), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the start, $(git describe --always --dirty))"
	echo
	echo "$RATE req/s for ${SECONDS_PER_RUN}s per run ($N requests), $PROMPTS distinct deterministic prompts of 256 tokens, 16-token streamed answers, 3 near-zero-cost engines. Times in ms from each request's scheduled send; CPU is live's per request."
	echo
	echo "| run | path | TTFT p50 | TTFT p99 | e2e p50 | e2e p99 | ok | failed | hits | misses | live CPU µs/request |"
	echo "|---|---|---|---|---|---|---|---|---|---|---|"
} >"$OUT/results.md"
hit99=()
vsdirect=()
vsplain=()
for i in $(seq "$RUNS"); do
	run direct$i "$DIRECT"
	run plain$i http://127.0.0.1:19282 "$PLAIN"
	h0=$(counter inferrail_response_cache_hits_total)
	m0=$(counter inferrail_response_cache_misses_total)
	run cached$i http://127.0.0.1:19280 "$CACHED"
	hits=$(($(counter inferrail_response_cache_hits_total) - h0))
	misses=$(($(counter inferrail_response_cache_misses_total) - m0))
	read -r _ _ _ d99 _ _ <<<"$(summarise direct$i)"
	read -r _ _ _ p99 _ _ <<<"$(summarise plain$i)"
	read -r _ _ _ c99 cok _ <<<"$(summarise cached$i)"
	[ "$cok" = "$N" ] || echo "cached run $i: only $cok of $N ok" >&2
	hit99+=("$c99")
	vsdirect+=("$(python3 -c "print(f'{$c99 - $d99:.3f}')")")
	vsplain+=("$(python3 -c "print(f'{$c99 - $p99:.3f}')")")
	for path in direct plain cached; do
		read -r t50 t99 e50 e99 ok failed <<<"$(summarise $path$i)"
		cpu=-
		[ -f "$OUT/$path$i.cpu" ] && cpu=$(cat "$OUT/$path$i.cpu")
		h=-
		m=-
		[ $path = cached ] && h=$hits && m=$misses
		label=$path
		[ $path = plain ] && label="live, no cache"
		[ $path = cached ] && label="live, cache hits"
		echo "| $i | $label | $t50 | $t99 | $e50 | $e99 | $ok | $failed | $h | $m | $cpu |" >>"$OUT/results.md"
	done
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
{
	echo
	echo "Median over the runs: a hit's e2e p99 $(median "${hit99[@]}") ms; minus the engines' direct e2e p99: $(median "${vsdirect[@]}") ms; minus live's without the cache: $(median "${vsplain[@]}") ms. Load average $(cut -d' ' -f1-3 /proc/loadavg) at the end."
} >>"$OUT/results.md"
cat "$OUT/results.md"
