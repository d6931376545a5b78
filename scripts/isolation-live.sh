#!/usr/bin/env bash
# Tenant isolation, live: three quiet tenants (one API key each, within
# their limits) and one noisy tenant sending 10x its RPM limit, through
# inferrail live (auth: keys, SQLite store) in front of three inferrail
# engines; each tenant is its own inferrail bench process. Every run is done
# with the noisy tenant and without it, ROUNDS times (default 2), and prints
# the quiet tenants' TTFT p99 with and without. Results: $OUT/results.md.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/isolation-live}
ROUNDS=${ROUNDS:-2}
DURATION=${DURATION:-60s}
QUIET_RATE=${QUIET_RATE:-2}   # req/s per quiet tenant (RPM limit 300: 5 req/s)
NOISY_RPM=${NOISY_RPM:-54}
NOISY_RATE=${NOISY_RATE:-9}   # 10x NOISY_RPM / 60
BIN=bin/inferrail
make -s build
mkdir -p "$OUT"
TMP=$(mktemp -d)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	rm -rf "$TMP"
}
trap cleanup EXIT

for p in 19501 19502 19503; do
	$BIN engine --port $p --enable-prompt-tokens-details 2>"$TMP/engine-$p.log" &
	PIDS+=($!)
done
cat >"$TMP/live.yaml" <<YAML
listen: 127.0.0.1:19580
admin_listen: 127.0.0.1:19590
drain_delay: 0s
log: {access_sample: 0}
auth: keys
tenancy: {store: "$TMP/keys.db"}
models:
  - name: inferrail-sim
    policy: cost_model
    tokenizer: builtin:sim
    replicas:
      - {name: a, url: "http://127.0.0.1:19501"}
      - {name: b, url: "http://127.0.0.1:19502"}
      - {name: c, url: "http://127.0.0.1:19503"}
YAML
$BIN live --config "$TMP/live.yaml" 2>"$TMP/live.log" &
PIDS+=($!)
for _ in $(seq 100); do curl -sf 127.0.0.1:19590/livez >/dev/null && break; sleep 0.1; done
for t in alpha bravo charlie; do
	$BIN keys create --admin http://127.0.0.1:19590 --name "$t" --rpm 300 --tpm 1000000 >"$TMP/$t.key" 2>/dev/null
done
$BIN keys create --admin http://127.0.0.1:19590 --name noisy --rpm "$NOISY_RPM" >"$TMP/noisy.key" 2>/dev/null

# Short prompts (about 512 tokens, no shared prefixes) and 64-token answers.
WL=(--workload w6 --set w6.input_median_tokens=512 --set w6.input_sigma=0.3
	--set output.median=64 --set output.sigma=0 --set output.min=64 --set output.max_tokens=64 --duration "$DURATION")
tenant() { # name rate seed run
	$BIN bench --base-url http://127.0.0.1:19580 --api-key-file "$TMP/$1.key" "${WL[@]}" --rate "$2" --seed "$3" --timeout 60s --json \
		>"$OUT/$4-$1.json" 2>/dev/null
}
p99() { python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(f\"{s['ttft_ms']['p99']:.1f} {s['completed']} {s['failed']}\")" "$1"; }

{
	echo "# Tenant isolation, live ($(date -u +%Y-%m-%d), $(nproc) cores, $(git describe --always --dirty))"
	echo
	echo "Three quiet tenants at $QUIET_RATE req/s each (limit 300 RPM) and a noisy one at $NOISY_RATE req/s against $NOISY_RPM RPM, $DURATION, through live (cost_model, auth: keys) to 3 engines. TTFT p99 in ms of each quiet tenant, without the noisy tenant and with it (same seeds):"
	echo
	echo "| round | tenant | p99 without | p99 with | change | noisy: ok / refused |"
	echo "|---|---|---|---|---|---|"
} >"$OUT/results.md"
for r in $(seq "$ROUNDS"); do
	for run in without with; do
		bpids=()
		i=0
		for t in alpha bravo charlie; do
			i=$((i + 1))
			tenant "$t" "$QUIET_RATE" $((r * 10 + i)) "$r-$run" &
			bpids+=($!)
		done
		if [ "$run" = with ]; then
			tenant noisy "$NOISY_RATE" $((r * 10 + 9)) "$r-$run" &
			bpids+=($!)
		fi
		for p in "${bpids[@]}"; do wait "$p"; done
		sleep 2
	done
	read -r _ nok nfail <<<"$(p99 "$OUT/$r-with-noisy.json")"
	for t in alpha bravo charlie; do
		read -r a _ _ <<<"$(p99 "$OUT/$r-without-$t.json")"
		read -r b _ _ <<<"$(p99 "$OUT/$r-with-$t.json")"
		echo "| $r | $t | $a | $b | $(python3 -c "print(f'{($b - $a) / $a * 100:+.1f}%')") | $nok / $nfail |" >>"$OUT/results.md"
	done
done
cat "$OUT/results.md"
