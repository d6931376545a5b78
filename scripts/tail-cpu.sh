#!/usr/bin/env bash
# Is live's TTFT tail at RATE its CPU, or something else? bench-live's setup
# (three near-zero-cost engines, W6 with ~256-token prompts and 16-token
# answers) and, in each of ROUNDS rounds of 10 s per path: direct to the
# engines, through inferrail live (cost_model, edge tokenization and the
# approximate index), through nginx, through go-raw (scripts/baseline-proxy
# -raw: the least a Go proxy does) and through go-raw spending BURN of CPU
# time on each request besides (-burn; set BURN to live's CPU per request
# minus go-raw's, as this table measures them; two thirds of it before
# forwarding, the rest after the answer is written, as live spends its own),
# and through go-raw+after, the same burn all after the answer is written
# (off the path to the first byte). When go-raw with the burn has live's
# tail, live's tail is its CPU, and only a cheaper request path shortens
# it; when it has go-raw's, live waits on something else. go-raw+after
# against go-raw+burn tells whether moving work past the answer would help.
#
#   scripts/tail-cpu.sh                      # RATE=3000 ROUNDS=3 BURN=35us
#   RATE=1000 BURN=50us make tail-cpu
#   PATHS="nginx go-raw+burn go-raw+after" make tail-cpu   # some paths only
#
# Results: $OUT/results.md (runs/tail-cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/tail-cpu}
RATE=${RATE:-3000}
ROUNDS=${ROUNDS:-3}
BURN=${BURN:-35us}
BIN=bin/inferrail
make -s build
mkdir -p "$OUT"
# shellcheck source=scripts/live-lib.sh
. scripts/live-lib.sh
start_zero_engines 19001 19002 19003
cat >"$TMP/live.yaml" <<YAML
listen: 127.0.0.1:19080
admin_listen: 127.0.0.1:19090
drain_delay: 0s
log: {access_sample: 0}
YAML
zero_model_yaml 19001 19002 19003 >>"$TMP/live.yaml"
$BIN live --config "$TMP/live.yaml" 2>"$TMP/live.log" &
LIVE=$!
PIDS+=($LIVE)
start_nginx 19081 0 19001 19002 19003
go build -o "$TMP/baseline-proxy" ./scripts/baseline-proxy
# The baselines with live's runtime settings at these loads (as bench-live).
ENGINES=(http://127.0.0.1:19001 http://127.0.0.1:19002 http://127.0.0.1:19003)
env GODEBUG=schedtrace=2147483647 GOMAXPROCS=1 "$TMP/baseline-proxy" -raw -listen 127.0.0.1:19088 "${ENGINES[@]}" 2>"$TMP/raw.log" &
RAW=$!
env GODEBUG=schedtrace=2147483647 GOMAXPROCS=1 "$TMP/baseline-proxy" -raw -burn "$BURN" -listen 127.0.0.1:19089 "${ENGINES[@]}" 2>"$TMP/burn.log" &
BURNED=$!
# The same CPU spent after the answer is written: off the path to the
# first byte.
env GODEBUG=schedtrace=2147483647 GOMAXPROCS=1 "$TMP/baseline-proxy" -raw -burn "$BURN" -burn-before 0 -listen 127.0.0.1:19086 "${ENGINES[@]}" 2>"$TMP/after.log" &
AFTER=$!
PIDS+=($RAW $BURNED $AFTER)
sleep 2

declare -A URL=([direct]=http://127.0.0.1:19001,http://127.0.0.1:19002,http://127.0.0.1:19003
	[live]=http://127.0.0.1:19080 [nginx]=http://127.0.0.1:19081
	[go-raw]=http://127.0.0.1:19088 [go-raw+burn]=http://127.0.0.1:19089
	[go-raw+after]=http://127.0.0.1:19086)
# shellcheck disable=SC2206 # PATHS: names separated by spaces
PATHS=(${PATHS:-direct live nginx go-raw go-raw+burn go-raw+after})
pids() {
	case $1 in
	live) echo "$LIVE" ;;
	nginx) nginx_pids 19081 ;;
	go-raw) echo "$RAW" ;;
	go-raw+burn) echo "$BURNED" ;;
	go-raw+after) echo "$AFTER" ;;
	esac
}
for p in "${PATHS[@]}"; do
	if [ -z "${URL[$p]:-}" ]; then
		echo "PATHS: unknown path '$p' (want some of: ${!URL[*]})" >&2
		exit 2
	fi
done
for p in "${PATHS[@]}"; do # warm up: connections, tokenizer, index
	$BIN bench --base-url "${URL[$p]}" "${BENCH_WL[@]}" --rate "$RATE" --requests 3000 --timeout 30s >/dev/null 2>&1
done
hz=$(getconf CLK_TCK)
n=$((RATE * 10))
{
	echo "# TTFT tail against CPU ($(date -u +%Y-%m-%d), $(nproc) cores, $(git describe --always --dirty))"
	echo
	echo "$RATE req/s, $ROUNDS rounds of 10 s per path; go-raw+burn is go-raw spending $BURN of CPU time on each request. TTFT in ms; CPU per request from /proc."
	echo
	echo "| round | path | CPU µs / request | of it user + system | TTFT p50 | TTFT p99 |"
	echo "|---|---|---|---|---|---|"
} >"$OUT/results.md"
for r in $(seq "$ROUNDS"); do
	for p in "${PATHS[@]}"; do
		# shellcheck disable=SC2046
		read -r u0 k0 < <(cpu_split $(pids "$p"))
		$BIN bench --base-url "${URL[$p]}" "${BENCH_WL[@]}" --rate "$RATE" --requests "$n" --timeout 30s --json 2>/dev/null >"$TMP/out.json"
		# shellcheck disable=SC2046
		read -r u1 k1 < <(cpu_split $(pids "$p"))
		cpu=- split=-
		if [ "$p" != direct ]; then
			cpu=$(((u1 + k1 - u0 - k0) * 1000000 / hz / n))
			split="$(((u1 - u0) * 1000000 / hz / n)) + $(((k1 - k0) * 1000000 / hz / n))"
		fi
		lat=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['ttft_ms']; print('%.3f | %.3f' % (d['p50'], d['p99']))" "$TMP/out.json")
		echo "| $r | $p | $cpu | $split | $lat |" | tee -a "$OUT/results.md"
	done
done
