#!/usr/bin/env bash
# make stack: three inferrail engines, inferrail live in front of them and
# Debian's Prometheus scraping all four, on loopback, left running in the
# background. State, logs and pids go to runs/stack/ (STACK_DIR);
# scripts/stack-down.sh (make stack-down) stops them.
#
# The gateway serves two models on the same engines, inferrail-sim
# (cost_model) and inferrail-chat (least_request), with small caps so that
# modest traffic queues. FAULTS=1 makes engine c fail requests and serve an
# unreadable metrics page, as the dashboard test does.
#
# Ports (override any): ENGINE_PORTS="8001 8002 8003" GATEWAY_PORT=8080
# ADMIN_PORT=9091 PROM_PORT=9092. BIN (bin/inferrail) is built when
# missing; PROMETHEUS is /usr/bin/prometheus (make prometheus-deps).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${STACK_DIR:-runs/stack}
BIN=${BIN:-bin/inferrail}
PROMETHEUS=${PROMETHEUS:-/usr/bin/prometheus}
read -r -a ENGINE_PORTS <<<"${ENGINE_PORTS:-8001 8002 8003}"
GATEWAY_PORT=${GATEWAY_PORT:-8080}
ADMIN_PORT=${ADMIN_PORT:-9091}
PROM_PORT=${PROM_PORT:-9092}
FAULTS=${FAULTS:-0}
REPLICAS=(a b c)

if [ "${#ENGINE_PORTS[@]}" -ne 3 ]; then
	echo "stack: ENGINE_PORTS must list three ports, got '${ENGINE_PORTS[*]}'" >&2
	exit 2
fi
if [ -s "$DIR/pids" ]; then
	while read -r name pid; do
		if kill -0 "$pid" 2>/dev/null; then
			echo "stack: already running ($name is pid $pid); make stack-down stops it" >&2
			exit 1
		fi
	done <"$DIR/pids"
fi
if [ ! -x "$PROMETHEUS" ]; then
	echo "stack: $PROMETHEUS not found: make prometheus-deps installs Debian's prometheus (or set PROMETHEUS)" >&2
	exit 1
fi
if [ ! -x "$BIN" ]; then
	echo "stack: building $BIN"
	go build -o "$BIN" ./cmd/inferrail
fi
for p in "${ENGINE_PORTS[@]}" "$GATEWAY_PORT" "$ADMIN_PORT" "$PROM_PORT"; do
	if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
		echo "stack: 127.0.0.1:$p is in use; pick other ports (ENGINE_PORTS, GATEWAY_PORT, ADMIN_PORT, PROM_PORT)" >&2
		exit 1
	fi
done

mkdir -p "$DIR"
: >"$DIR/pids"

# start NAME CMD...: in its own session (so stack-down can stop its whole
# process group), detached from this shell, output in $DIR/NAME.log.
start() {
	local name=$1
	shift
	setsid "$@" >"$DIR/$name.log" 2>&1 </dev/null &
	echo "$name $!" >>"$DIR/pids"
}

fail() {
	echo "stack: $1" >&2
	for f in "$DIR"/*.log; do
		echo "--- $f" >&2
		tail -n 15 "$f" | tr '\r' '\n' | tail -n 15 >&2
	done
	scripts/stack-down.sh >&2 || true
	exit 1
}

# wait_http NAME URL: until URL answers 200, at most 15 s.
wait_http() {
	local name=$1 url=$2 pid
	pid=$(awk -v n="$name" '$1 == n {print $2}' "$DIR/pids")
	for _ in $(seq 150); do
		if curl -sf -o /dev/null --max-time 1 "$url"; then
			return 0
		fi
		kill -0 "$pid" 2>/dev/null || fail "$name exited (see $DIR/$name.log)"
		sleep 0.1
	done
	fail "$name did not answer $url within 15 s"
}

for i in 0 1 2; do
	args=(engine --port "${ENGINE_PORTS[$i]}" --seed $((i + 1)) --enable-prompt-tokens-details
		--drain-timeout 1s --served-model-name inferrail-sim --served-model-name inferrail-chat)
	if [ "$FAULTS" = 1 ] && [ "${REPLICAS[$i]}" = c ]; then
		args+=(--fault-error-rate 0.5 --fault-error-status 503 --fault-close-rate 0.1
			--fault-stall-rate 0.05 --fault-garbage-metrics)
	fi
	start "engine-${REPLICAS[$i]}" "$BIN" "${args[@]}"
done
for i in 0 1 2; do
	wait_http "engine-${REPLICAS[$i]}" "http://127.0.0.1:${ENGINE_PORTS[$i]}/health"
done

replicas=""
for i in 0 1 2; do
	replicas+="      - {name: ${REPLICAS[$i]}, url: \"http://127.0.0.1:${ENGINE_PORTS[$i]}\"}"$'\n'
done
model() {
	cat <<YAML
  - name: $1
    policy: $2
    tokenizer: builtin:sim
    admission: kv
    kv_capacity_blocks: 120
    max_concurrency: 2
    queue: {max_requests: 16, timeout: 5s}
    replicas:
$replicas
YAML
}
{
	cat <<YAML
# Written by scripts/stack.sh.
listen: 127.0.0.1:$GATEWAY_PORT
admin_listen: 127.0.0.1:$ADMIN_PORT
drain_delay: 0s
drain_timeout: 2s
first_byte_timeout: 5s
stream_idle_timeout: 5s
log: {access_sample: 0.01}
health: {interval: 1s, timeout: 300ms, eject_after: 3, eject_time: 1s, max_eject_time: 10s}
models:
YAML
	model inferrail-sim cost_model
	model inferrail-chat least_request
} >"$DIR/live.yaml"
"$BIN" live --config "$DIR/live.yaml" --check >/dev/null || fail "the generated $DIR/live.yaml is invalid"
start live "$BIN" live --config "$DIR/live.yaml"
wait_http live "http://127.0.0.1:$GATEWAY_PORT/readyz"

{
	cat <<YAML
# Written by scripts/stack.sh: the gateway's admin /metrics and the three
# engines' /metrics, each engine labelled with its replica name (the
# dashboard's replica variable).
global:
  scrape_interval: 5s
  scrape_timeout: 4s
  evaluation_interval: 5s
scrape_configs:
  - job_name: inferrail
    static_configs:
      - targets: ['127.0.0.1:$ADMIN_PORT']
  - job_name: vllm
    static_configs:
YAML
	for i in 0 1 2; do
		echo "      - targets: ['127.0.0.1:${ENGINE_PORTS[$i]}']"
		echo "        labels: {replica: ${REPLICAS[$i]}}"
	done
} >"$DIR/prometheus.yml"
start prometheus "$PROMETHEUS" --config.file="$DIR/prometheus.yml" \
	--storage.tsdb.path="$DIR/tsdb" --web.listen-address="127.0.0.1:$PROM_PORT" \
	--storage.tsdb.retention.time=2d
wait_http prometheus "http://127.0.0.1:$PROM_PORT/-/ready"

g=http://127.0.0.1:$GATEWAY_PORT
cat <<EOF
inferrail stack running (state, logs and pids in $DIR/):
  gateway (OpenAI API)   $g/v1  models inferrail-sim, inferrail-chat
  admin                  http://127.0.0.1:$ADMIN_PORT/metrics  /replicas
  engines                http://127.0.0.1:${ENGINE_PORTS[0]}/metrics  :${ENGINE_PORTS[1]}  :${ENGINE_PORTS[2]}$([ "$FAULTS" = 1 ] && echo "  (c fails requests and its metrics)")
  Prometheus             http://127.0.0.1:$PROM_PORT  (/targets, /graph)

Traffic, for a few minutes:
  $BIN bench --base-url $g --model inferrail-sim --workload w1 --rate 8 --duration 5m \\
      --set w1.prompts=4 --set w1.prompt_min_tokens=200 --set w1.prompt_max_tokens=600 --set output.median=48 --set output.max_tokens=128 &
  $BIN bench --base-url $g --model inferrail-chat --endpoint chat --workload w1 --rate 5 --duration 5m \\
      --set w1.prompts=4 --set w1.prompt_min_tokens=200 --set w1.prompt_max_tokens=600 --set output.median=48 --set output.max_tokens=128 &

Dashboard: in Grafana, add a Prometheus data source with URL http://127.0.0.1:$PROM_PORT
(Connections > Data sources), then Dashboards > New > Import, upload dashboards/inferrail.json
and pick that data source for DS_PROMETHEUS.

Stop: make stack-down
EOF
