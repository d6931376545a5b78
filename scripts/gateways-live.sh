#!/usr/bin/env bash
# Several gateways, live: one burst of heavy requests, all sent at once
# (about 6x the KV capacity of three inferrail engine replicas), spread
# over GATEWAYS (default 3) inferrail live processes in front of the same
# three engines, with kv admission and each ledger in LEDGERS (default:
# redis, then local): "redis" shares the KV reservations through one Redis
# (tenancy.ledger.backend: redis; a redis-server on a unix socket started
# here), "local" gives each gateway its own. Prints, per ledger, bench's
# summary and the peak vllm:num_requests_running and
# vllm:kv_cache_usage_perc each engine reported (polled every 50 ms), and
# the engines' preemptions. Results: $OUT/<ledger>.json and $OUT/results.md.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gateways-live}
LEDGERS=${LEDGERS:-"redis local"}
GATEWAYS=${GATEWAYS:-3}
BURST=${BURST:-200}
QUEUE_TIMEOUT=${QUEUE_TIMEOUT:-60s}
BIN=bin/inferrail
make -s build
command -v redis-server >/dev/null || { echo "gateways-live needs redis-server (make redis-deps)" >&2; exit 1; }
mkdir -p "$OUT"
TMP=$(mktemp -d)
chmod 755 "$TMP"
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	rm -rf "$TMP"
}
trap cleanup EXIT
# One burst of $BURST heavy requests within 1 ms: prompts of 5,000-6,000
# tokens sharing a 256-token system prompt, answers of up to 512 tokens.
# 200 x (5,500 + 512) / 16 = 75,000 blocks against 3 x 4,096: 6.1x.
cat >"$TMP/burst.yaml" <<YAML
workload: w7
rate: 0.001
requests: $BURST
w7:
  burst_requests: $BURST
  burst_window: 1ms
  first_burst: 0s
  heavy_prompt_min_tokens: 5000
  heavy_prompt_max_tokens: 6000
  heavy_max_tokens: 512
YAML

echo "| ledger | gateways | served | rejected | failed | queue p50 / p99 (ms) | TTFT p50 / p99 (ms) | peak running per engine | peak KV usage per engine | preemptions |" >"$OUT/results.md"
echo "|---|---|---|---|---|---|---|---|---|---|" >>"$OUT/results.md"
port=19400
for ledger in $LEDGERS; do
	engines=()
	for i in 1 2 3; do
		p=$((port + i))
		$BIN engine --port $p --enable-prompt-tokens-details 2>"$TMP/engine-$p.log" &
		PIDS+=($!)
		engines+=($p)
	done
	tenancy=""
	if [ "$ledger" = redis ]; then
		redis-server --port 0 --unixsocket "$TMP/redis.sock" --unixsocketperm 777 --save '' --appendonly no --dir "$TMP" >"$TMP/redis.log" 2>&1 &
		PIDS+=($!)
		for _ in $(seq 50); do [ -S "$TMP/redis.sock" ] && break; sleep 0.1; done
		tenancy="tenancy: {redis: {address: \"unix://$TMP/redis.sock\", timeout: 50ms, gateways: $GATEWAYS}, ledger: {backend: redis}}"
	fi
	urls=""
	for g in $(seq "$GATEWAYS"); do
		lp=$((port + 40 + g))
		cat >"$TMP/live-$ledger-$g.yaml" <<YAML
listen: 127.0.0.1:$lp
admin_listen: 127.0.0.1:$((lp + 20))
drain_delay: 0s
request_timeout: 5m
$tenancy
models:
  - name: inferrail-sim
    policy: cost_model
    tokenizer: builtin:sim
    admission: kv
    queue: {timeout: $QUEUE_TIMEOUT}
    max_concurrency: 100000
    max_pending: 100000
    replicas:
      - {name: a, url: "http://127.0.0.1:${engines[0]}"}
      - {name: b, url: "http://127.0.0.1:${engines[1]}"}
      - {name: c, url: "http://127.0.0.1:${engines[2]}"}
YAML
		$BIN live --config "$TMP/live-$ledger-$g.yaml" 2>"$TMP/live-$ledger-$g.log" &
		PIDS+=($!)
		urls="$urls${urls:+,}http://127.0.0.1:$lp"
		for _ in $(seq 100); do curl -sf "127.0.0.1:$lp/health" >/dev/null && break; sleep 0.1; done
	done
	sleep 1 # first scrapes: the engines' KV capacity
	mode=$ledger
	# Poll the engines' own gauges while the burst runs.
	: >"$TMP/peaks-$mode"
	(
		declare -A run kv
		while :; do
			for p in "${engines[@]}"; do
				m=$(curl -s --max-time 0.2 "127.0.0.1:$p/metrics" || true)
				r=$(awk '/^vllm:num_requests_running/ {print int($2)}' <<<"$m")
				u=$(awk '/^vllm:kv_cache_usage_perc/ {print $2}' <<<"$m")
				[ -n "$r" ] && [ "$r" -gt "${run[$p]:-0}" ] && run[$p]=$r
				[ -n "$u" ] && awk -v a="$u" -v b="${kv[$p]:-0}" 'BEGIN {exit !(a > b)}' && kv[$p]=$u
			done
			printf '%s\n' "${engines[*]/#/}" >/dev/null
			{ for p in "${engines[@]}"; do echo "$p ${run[$p]:-0} ${kv[$p]:-0}"; done; } >"$TMP/peaks-$mode.tmp"
			mv "$TMP/peaks-$mode.tmp" "$TMP/peaks-$mode"
			sleep 0.05
		done
	) &
	POLL=$!
	PIDS+=($POLL)
	$BIN bench --base-url "$urls" --workload-file "$TMP/burst.yaml" --json >"$OUT/$mode.json" 2>"$TMP/bench-$mode.log"
	sleep 0.3
	kill $POLL 2>/dev/null || true
	pre=0
	for p in "${engines[@]}"; do
		n=$(curl -s "127.0.0.1:$p/metrics" | awk '/^vllm:num_preemptions_total/ {s += $2} END {print int(s)}')
		pre=$((pre + n))
	done
	runs=$(awk '{printf "%s%s", sep, $2; sep=" / "}' "$TMP/peaks-$mode")
	kvs=$(awk '{printf "%s%.2f", sep, $3; sep=" / "}' "$TMP/peaks-$mode")
	python3 - "$OUT/$mode.json" "$mode" "$GATEWAYS" "$runs" "$kvs" "$pre" >>"$OUT/results.md" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rej = ", ".join(f"{k} {v}" for k, v in sorted(d["rejected"].items())) or "0"
print(f"| {sys.argv[2]} | {sys.argv[3]} | {d['completed']} | {rej} | {d['engine_failed']} | {d['queue_ms']['p50']:.0f} / {d['queue_ms']['p99']:.0f} | {d['ttft_ms']['p50']:.0f} / {d['ttft_ms']['p99']:.0f} | {sys.argv[4]} | {sys.argv[5]} | {sys.argv[6]} |")
PY
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	PIDS=()
	sleep 0.5
	port=$((port + 100))
done
cat "$OUT/results.md"
