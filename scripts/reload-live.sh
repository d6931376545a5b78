#!/usr/bin/env bash
# Hot reload under load, in bench-live's setup: three `inferrail engine`s with
# a near-zero profile, inferrail live in front (cost_model, edge
# tokenization, the approximate KV index), `inferrail bench` at RATE req/s
# for SECONDS s of a shared-prefix workload (w1 with short prompts) while the
# configuration is rewritten RELOADS times (alternately the queue timeout and
# the policy, cost_model <-> kv_aware, back to the start at the end), half
# the reloads by SIGHUP and half by the file watch alone; halfway, a broken
# file (an unknown key) is posted to /admin/reload and must be rejected with
# its error while the old configuration keeps serving. Reported: failed
# requests, the proxy's hit rate (engine-measured cached prompt tokens /
# prompt tokens, and the index's predicted one) over the WINDOW s before the
# first reload and the WINDOW s after the last, and the reload counters.
# Results: $OUT/results.md.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/reload-live}
RATE=${RATE:-1000}
SECONDS_RUN=${SECONDS_RUN:-30}
RELOADS=${RELOADS:-10}
WINDOW=${WINDOW:-10}
BIN=bin/inferrail
make -s build
mkdir -p "$OUT"
# shellcheck source=scripts/live-lib.sh
. scripts/live-lib.sh
start_zero_engines 19201 19202 19203 -- --enable-prompt-tokens-details
CONF="$TMP/conf/live.yaml"
mkdir -p "$TMP/conf"
# config POLICY QUEUE_TIMEOUT [EXTRA]: writes the configuration whole (a
# rename, as an editor or a ConfigMap update does).
config() {
	cat >"$CONF.tmp" <<YAML
listen: 127.0.0.1:19280
admin_listen: 127.0.0.1:19290
drain_delay: 0s
log: {access_sample: 0}
${3:-}
models:
  - name: inferrail-sim
    policy: $1
    tokenizer: builtin:sim
    index: approximate
    max_concurrency: 100000
    max_pending: 100000
    queue: {timeout: $2}
    replicas:
      - {name: a, url: "http://127.0.0.1:19201"}
      - {name: b, url: "http://127.0.0.1:19202"}
      - {name: c, url: "http://127.0.0.1:19203"}
YAML
	mv "$CONF.tmp" "$CONF"
}
config cost_model 30s
$BIN live --config "$CONF" 2>"$TMP/live.log" &
LIVE=$!
PIDS+=($LIVE)
for _ in $(seq 100); do curl -sf 127.0.0.1:19290/readyz >/dev/null && break; sleep 0.1; done
curl -sf 127.0.0.1:19290/readyz >/dev/null

# metric NAME [LABELS]: the proxy's value now.
metric() {
	curl -sf 127.0.0.1:19290/metrics | awk -v n="$1" -v l="${2:-}" '$1 == n || index($1, n "{") == 1 { if (l == "" || index($1, l)) s += $2 } END { printf "%.0f\n", s }'
}
# sample: prompt, cached and predicted tokens now, and the prompt tokens of
# the answers that reported their cached ones.
sample() { echo "$(metric inferrail_prompt_tokens_total) $(metric inferrail_cached_tokens_total) $(metric inferrail_predicted_cached_tokens_total) $(metric inferrail_reported_prompt_tokens_total)"; }
rate() { # before after: cached and predicted hit rates between two samples
	python3 -c "
b, a = [int(x) for x in '$1'.split()], [int(x) for x in '$2'.split()]
p, r = a[0] - b[0], a[3] - b[3]
print(f'{(a[1] - b[1]) / r if r else float(\"nan\"):.4f} {(a[2] - b[2]) / p:.4f} {p}' if p else 'nan nan 0')"
}

# Short prompts (w1's shared system prompts of 256 to 1,024 tokens, questions
# of 16 to 64) and 16-token answers: the proxy's path, not the engines.
WL=(--workload w1 --set w1.prompt_min_tokens=256 --set w1.prompt_max_tokens=1024
	--set w1.question_min_tokens=16 --set w1.question_max_tokens=64
	--set output.median=16 --set output.sigma=0 --set output.min=16 --set output.max_tokens=16)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
$BIN bench --base-url http://127.0.0.1:19280 "${WL[@]}" --rate "$RATE" --requests $((RATE * SECONDS_RUN)) --timeout 30s --json \
	2>"$TMP/bench.log" >"$OUT/bench.json" &
BENCH=$!
PIDS+=($BENCH)
T0=$(date +%s.%N)
at() { # sleep until $1 seconds after the bench started
	local left
	left=$(python3 -c "import time; print(max(0, $T0 + $1 - time.time()))")
	sleep "$left"
}
# The reloads fill the middle of the run, a window before and after.
SPAN=$((SECONDS_RUN - 2 * WINDOW))
[ "$SPAN" -gt 0 ] || { echo "SECONDS_RUN must exceed 2 x WINDOW" >&2; exit 1; }
at 1
S0=$(sample) # after a second's warm-up
at $((WINDOW + 1))
S1=$(sample)
HUP=0
WATCH=0
BROKEN=""
for i in $(seq "$RELOADS"); do
	at "$(python3 -c "print($WINDOW + 1 + ($i - 1) * $SPAN / $RELOADS)")"
	policy=cost_model
	timeout=30s
	case $((i % 4)) in
	1) timeout=20s ;;
	2) timeout=20s policy=kv_aware ;;
	3) policy=kv_aware ;;
	esac
	[ "$i" = "$RELOADS" ] && policy=cost_model timeout=30s
	config "$policy" "$timeout"
	if [ $((i % 2)) = 0 ]; then
		kill -HUP "$LIVE"
		HUP=$((HUP + 1))
	else
		WATCH=$((WATCH + 1)) # the watch sees the rename
	fi
	if [ "$i" = $((RELOADS / 2)) ]; then
		sleep 0.5
		cp "$CONF" "$TMP/good.yaml"
		config "$policy" "$timeout" "listn: 127.0.0.1:1"
		BROKEN=$(curl -s -X POST 127.0.0.1:19290/admin/reload)
		cp "$TMP/good.yaml" "$CONF.tmp" && mv "$CONF.tmp" "$CONF" # the good one back: its hash is the running one's
	fi
done
sleep 1
S2=$(sample) # a second after the last reload: the window after runs to the end
wait "$BENCH" || true
S3=$(sample)
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
OK=$(metric inferrail_config_reloads_total 'result="ok"')
ERR=$(metric inferrail_config_reloads_total 'result="error"')
read -r hb pb nb <<<"$(rate "$S0" "$S1")"
read -r ha pa na <<<"$(rate "$S2" "$S3")"
read -r completed failed tput t50 t99 <<<"$(python3 -c "import json; s = json.load(open('$OUT/bench.json')); print(s['completed'], s['failed'], round(s['throughput_rps']), s['ttft_ms']['p50'], s['ttft_ms']['p99'])")"
STATUS=$(curl -sf 127.0.0.1:19290/admin/status | python3 -c "import json, sys; c = json.load(sys.stdin)['config']; print(c['sha256'][:12], c['reloads_ok'], c['reload_errors'])")
{
	echo "# Hot reload under load ($(date -u +%Y-%m-%d), $(nproc) cores, $(git describe --always --dirty))"
	echo
	echo "inferrail live in front of 3 near-zero-cost engines, $RATE req/s for ${SECONDS_RUN}s of w1 (shared system prompts of 256-1,024 tokens, 16-token answers); $RELOADS reloads ($HUP by SIGHUP, $WATCH by the file watch) alternating the queue timeout and the policy (cost_model, kv_aware), the last back to the start; halfway a broken file (an unknown key) posted to /admin/reload. Load average $LOAD_BEFORE before, $LOAD_AFTER after."
	echo
	echo "| requests | completed | failed | req/s | TTFT p50 / p99 ms | reloads ok | reloads rejected | hit rate ${WINDOW}s before (engine / predicted) | hit rate ${WINDOW}s after (engine / predicted) |"
	echo "|---|---|---|---|---|---|---|---|---|"
	echo "| $((RATE * SECONDS_RUN)) | $completed | $failed | $tput | $t50 / $t99 | $OK | $ERR | $hb / $pb | $ha / $pa |"
	echo
	echo "Prompt tokens in the windows: $nb before, $na after. /admin/status config: sha256 prefix, reloads ok, rejected: $STATUS."
	echo
	echo "The broken file's answer: \`$BROKEN\`"
} >"$OUT/results.md"
cp "$TMP/live.log" "$OUT/live.log"
cat "$OUT/results.md"
