# Shared start-up of the live measurement scripts (bench-live, reload-live,
# cache-live): a temporary directory removed at exit with every process the
# script started, and three mock engines of near-zero cost. Source it after
# setting BIN; define cleanup_extra to stop more at exit.

TMP=$(mktemp -d)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	if declare -F cleanup_extra >/dev/null; then cleanup_extra; fi
	rm -rf "$TMP"
}
trap cleanup EXIT

# start_zero_engines PORT... [-- ENGINE FLAGS...]: an inferrail engine on each
# port with step and token costs of nanoseconds, so latency is almost all
# network and proxy.
start_zero_engines() {
	local ports=() p
	while [ $# -gt 0 ] && [ "$1" != -- ]; do ports+=("$1"); shift; done
	[ "${1:-}" = -- ] && shift
	cat >"$TMP/zero.yaml" <<YAML
name: near-zero
latency: {step_fixed_ms: 0.001, prefill_token_us: 0.001, prefill_pair_ns: 0, decode_seq_us: 0, decode_ctx_token_ns: 0}
YAML
	for p in "${ports[@]}"; do
		$BIN engine --port "$p" --profile "$TMP/zero.yaml" "$@" 2>"$TMP/engine-$p.log" &
		PIDS+=($!)
	done
}

# zero_model_yaml PORT...: the models: block of a live configuration for the
# engines start_zero_engines started on PORT... (replicas a, b, ...):
# cost_model with edge tokenization and the approximate index, caps out of
# the way, as bench-live measures the proxy.
zero_model_yaml() {
	local names=(a b c d e f g h) i=0 p
	cat <<YAML
models:
  - name: inferrail-sim
    policy: cost_model
    tokenizer: builtin:sim
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
