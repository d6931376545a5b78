#!/usr/bin/env bash
# Two builds of `inferrail live` side by side on the same three engines and
# load, in turn, so that both see the same machine: bench-live's setup (W6
# with ~256-token prompts and 16-token answers, near-zero-cost engines,
# cost_model with edge tokenization and the approximate index), at RATE
# req/s for ROUNDS rounds of 10 s each per build (each build first in
# half the rounds), with each build's CPU time per request (from /proc) and
# its TTFT p50 and p99. BASE=HEAD measures the method's own noise.
# LIVE_TOKENIZER=DIR gives both builds that tokenizer in place of
# builtin:sim (as bench-live's).
#
#   BASE=<git revision> scripts/ab-live.sh     # e.g. BASE=ef2740e
#   RATE=1000 ROUNDS=6 BASE=HEAD~3 make ab-live
#
# BASE is built in a temporary git worktree; the other build is this tree's.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${BASE:?set BASE to the git revision to compare this tree with}
RATE=${RATE:-3000}
ROUNDS=${ROUNDS:-4}
BIN=bin/inferrail
make -s build
WT=$(mktemp -d)
git worktree add -q --detach "$WT/src" "$BASE"
(cd "$WT/src" && go build -o "$WT/inferrail" ./cmd/inferrail)
cleanup_extra() { git worktree remove --force "$WT/src" >/dev/null 2>&1 || true; rm -rf "$WT"; }
# shellcheck source=scripts/live-lib.sh
. scripts/live-lib.sh
start_zero_engines 19001 19002 19003
for v in base this; do
	port=19180
	[ $v = this ] && port=19181
	cat >"$TMP/live-$v.yaml" <<YAML
listen: 127.0.0.1:$port
admin_listen: 127.0.0.1:$((port + 10))
drain_delay: 0s
log: {access_sample: 0}
YAML
	zero_model_yaml 19001 19002 19003 >>"$TMP/live-$v.yaml"
done
"$WT/inferrail" live --config "$TMP/live-base.yaml" 2>"$TMP/base.log" &
BASE_PID=$!
$BIN live --config "$TMP/live-this.yaml" 2>"$TMP/this.log" &
THIS_PID=$!
PIDS+=($BASE_PID $THIS_PID)
sleep 2
hz=$(getconf CLK_TCK)
for port in 19180 19181; do # warm up: connections, tokenizer, index
	$BIN bench --base-url "http://127.0.0.1:$port" "${BENCH_WL[@]}" --rate "$RATE" --requests 3000 --timeout 30s >/dev/null 2>&1
done
n=$((RATE * 10))
echo "| round | build | CPU µs / request | TTFT p50 ms | TTFT p99 ms |"
echo "|---|---|---|---|---|"
for r in $(seq "$ROUNDS"); do
	order="base this"
	[ $((r % 2)) = 0 ] && order="this base" # either build first in half the rounds
	for v in $order; do
		port=19180 pid=$BASE_PID name=$BASE
		[ $v = this ] && port=19181 pid=$THIS_PID name=$(git rev-parse --short HEAD)+tree
		t0=$(cpu_ticks $pid)
		$BIN bench --base-url "http://127.0.0.1:$port" "${BENCH_WL[@]}" --rate "$RATE" --requests "$n" --timeout 30s --json 2>/dev/null >"$TMP/$v-$r.json"
		t1=$(cpu_ticks $pid)
		lat=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['ttft_ms']; print('%.3f | %.3f' % (d['p50'], d['p99']))" "$TMP/$v-$r.json")
		echo "| $r | $name | $(((t1 - t0) * 1000000 / hz / n)) | $lat |"
	done
done
