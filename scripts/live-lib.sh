# Shared start-up of the live measurement scripts (bench-live, reload-live,
# cache-live): a temporary directory removed at exit with every process the
# script started, and three mock engines of near-zero cost. Source it after
# setting BIN; define cleanup_extra to stop more at exit.

TMP=$(mktemp -d)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "$TMP"/nginx*.pid; do [ -f "$p" ] && kill "$(cat "$p" 2>/dev/null)" 2>/dev/null || true; done
	if declare -F cleanup_extra >/dev/null; then cleanup_extra; fi
	rm -rf "$TMP"
}
trap cleanup EXIT

# STEP_MS is the engines' fixed cost of a step in ms (default 0.001: a
# whole short answer comes in one event); STEP_MS=1 streams each token as
# its own event, as a real engine does. ANSWER_TOKENS is BENCH_WL's answer
# length (default 16).
STEP_MS=${STEP_MS:-0.001}
ANSWER_TOKENS=${ANSWER_TOKENS:-16}
if ! [[ $STEP_MS =~ ^[0-9]+(\.[0-9]+)?$ ]] || ! [[ $ANSWER_TOKENS =~ ^[1-9][0-9]*$ ]]; then
	echo "STEP_MS: want milliseconds such as 0.001 or 1 (got '$STEP_MS'); ANSWER_TOKENS: want a positive whole number (got '$ANSWER_TOKENS')" >&2
	exit 2
fi

# READ_TO_END=1 (the default) has bench read each stream past data: [DONE]
# to the response's end (bench's default), so that every path keeps its
# client connections. READ_TO_END=0 closes a response at [DONE], as the
# OpenAI SDKs do (bench --close-at-done): a server that ends the response
# in a later write (the engines themselves, as vLLM's server does, and
# nginx) then takes a new connection for most requests, and live, which
# sends [DONE] with the end, does not, so its added TTFT over direct
# leaves out a connection's set-up that nginx's includes.
READ_TO_END=${READ_TO_END:-1}
case $READ_TO_END in 0 | 1) ;; *) echo "READ_TO_END: want 0 or 1, got '$READ_TO_END'" >&2; exit 2 ;; esac

# start_zero_engines PORT... [-- ENGINE FLAGS...]: an inferrail engine on each
# port with step (STEP_MS) and token costs of nanoseconds, so latency is
# almost all network and proxy.
start_zero_engines() {
	local ports=() p
	while [ $# -gt 0 ] && [ "$1" != -- ]; do ports+=("$1"); shift; done
	[ "${1:-}" = -- ] && shift
	cat >"$TMP/zero.yaml" <<YAML
name: near-zero
latency: {step_fixed_ms: $STEP_MS, prefill_token_us: 0.001, prefill_pair_ns: 0, decode_seq_us: 0, decode_ctx_token_ns: 0}
YAML
	for p in "${ports[@]}"; do
		$BIN engine --port "$p" --profile "$TMP/zero.yaml" "$@" 2>"$TMP/engine-$p.log" &
		PIDS+=($!)
	done
}

# zero_model_yaml PORT...: the models: block of a live configuration for the
# engines start_zero_engines started on PORT... (replicas a, b, ...):
# cost_model with edge tokenization and the approximate index, caps out of
# the way, as bench-live measures the proxy. The tokenizer is builtin:sim,
# or the directory LIVE_TOKENIZER names.
zero_model_yaml() {
	local names=(a b c d e f g h) i=0 p tok=builtin:sim
	if [ -n "${LIVE_TOKENIZER:-}" ]; then tok=$(realpath "$LIVE_TOKENIZER"); fi
	cat <<YAML
models:
  - name: inferrail-sim
    policy: cost_model
    tokenizer: $tok
    index: approximate
    max_concurrency: 100000
    max_pending: 100000
    replicas:
YAML
	for p in "$@"; do
		echo "      - {name: ${names[$i]}, url: \"http://127.0.0.1:$p\"}"
		i=$((i + 1))
	done
}

# need_nginx: NGINX names Debian's nginx (nginx-light, installed when root
# and missing).
need_nginx() {
	if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
		if [ "$(id -u)" = 0 ]; then
			apt-get install -y -q nginx-light >/dev/null
		else
			echo "this script needs nginx: apt-get install nginx-light" >&2
			exit 1
		fi
	fi
	NGINX=$(command -v nginx || echo /usr/sbin/nginx)
}

# start_nginx PORT RECEIVER PORT...: nginx (one worker per core, as
# Debian's default) as a plain round-robin proxy to the engines on PORT...,
# listening on the first PORT, streams unbuffered, upstream connections
# kept alive; with RECEIVER other than 0, also a server on that port that
# answers 200 to every OTLP/HTTP export. Its pid file is $TMP/nginx-PORT.pid.
start_nginx() {
	local port=$1 receiver=$2 p
	shift 2
	need_nginx
	{
		echo "worker_processes auto;"
		echo "pid $TMP/nginx-$port.pid;"
		echo "error_log $TMP/nginx-$port-error.log warn;"
		echo "events { worker_connections 16384; }"
		echo "http {"
		echo "	access_log off;"
		echo "	upstream engines {"
		for p in "$@"; do echo "		server 127.0.0.1:$p;"; done
		echo "		keepalive 512;"
		echo "	}"
		if [ "$receiver" != 0 ]; then
			echo "	server { listen 127.0.0.1:$receiver; location = /v1/traces { return 200; } }"
		fi
		cat <<NGINX
	server {
		listen 127.0.0.1:$port;
		location / {
			proxy_pass http://engines;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
			proxy_buffering off;
			proxy_request_buffering off;
			proxy_read_timeout 600s;
		}
	}
}
NGINX
	} >"$TMP/nginx-$port.conf"
	"$NGINX" -c "$TMP/nginx-$port.conf" -p "$TMP" -g 'daemon off;' &
	PIDS+=($!)
}

# nginx_pids PORT: the master and workers of the nginx start_nginx started
# on PORT (the workers' command lines do not name the conf).
nginx_pids() {
	local m
	m=$(cat "$TMP/nginx-$1.pid")
	echo "$m $(pgrep -P "$m" | tr '\n' ' ')"
}

# cpu_split PID...: the CPU time of a set of processes, from /proc: user
# and system time, in clock ticks.
cpu_split() {
	local u=0 k=0 p a b
	for p in "$@"; do
		[ -r "/proc/$p/stat" ] || continue
		read -r a b < <(awk '{print $14, $15}' "/proc/$p/stat")
		u=$((u + a)) k=$((k + b))
	done
	echo "$u $k"
}

# cpu_ticks PID...: cpu_split's user + system time, in clock ticks.
cpu_ticks() {
	local u k
	read -r u k < <(cpu_split "$@")
	echo $((u + k))
}

# BENCH_WL: bench-live's workload: short prompts (about 256 tokens) and
# ANSWER_TOKENS-token answers (16 by default), so that what is measured is
# the path, not the engines.
BENCH_WL=(--workload w6 --set w6.input_median_tokens=256 --set w6.input_sigma=0.3
	--set output.median="$ANSWER_TOKENS" --set output.sigma=0 --set output.min="$ANSWER_TOKENS" --set output.max_tokens="$ANSWER_TOKENS")
if [ "$READ_TO_END" = 0 ]; then BENCH_WL+=(--close-at-done); fi
