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
