#!/usr/bin/env bash
# Gateway overhead, side by side in one run against the same three engines:
# inferrail bench straight to the engines (round robin, client side),
# through inferrail live (cost_model, edge tokenization and the KV index on),
# through nginx (a plain round-robin proxy, Debian's nginx-light) and through
# scripts/baseline-proxy (the least a Go net/http proxy does; go-raw: the same
# with a loop of its own on each connection instead of net/http; both with
# live's runtime settings, BASELINE_ENV= for Go's defaults), at
# 1,000 and 3,000 req/s; then tracing's cost (live with traces sampled at
# 0.1 against live without, alternately, at 1,000 req/s), and the cost of
# keys and limits the same way, and of recording (record:); then a soak of
# 50,000 requests through live with its resident memory before and after
# (RATES="" and SOAK=0 skip the first and the last, COSTS=0 the traces and keys
# parts, RECORD=0 the recording part; LIVE_GOMAXPROCS=N sets GOMAXPROCS in
# live's environment, LIVE_ENV="K=V ..." more of it, LIVE_PROCS=fixed live's procs setting, adaptive by default;
# LIVE_SYSMON=go live's sysmon setting, awake by default; LIVE_YAML="scrape:
# {interval: 1s}" more of live's configuration (top-level keys); LIVE_TOKENIZER=DIR
# live's tokenizer in place of builtin:sim; ORDER="nginx live ..." the order the
# proxies are measured in at each rate, "live nginx go-baseline go-raw" by
# default, and nginx-twin among them a second nginx, the method's control; DIRECT_AFTER=1 measures the engines directly again after the proxies,
# to see how far the baseline drifted; RUNS=4 measures the rates four times
# over, with a line per rate counting the runs where live's added p99 is
# within nginx's). Each live run also reports live's own part of the time
# to first byte (inferrail_proxy_overhead_seconds, p50 / p99 between
# snapshots of its /metrics). Each path is warmed for two seconds at
# the rate before it is measured. Engines use the smallest profile costs, so
# latency is almost all network and proxy; STEP_MS=1 gives their steps 1 ms
# each, so that each token is an event of its own as a real engine streams
# it, and ANSWER_TOKENS=64 sets the answers' length (16 by default; see
# live-lib.sh); the client reads each stream to the response's end, so that
# every path keeps its connections, and READ_TO_END=0 closes it at [DONE], as
# the OpenAI SDKs do (live-lib.sh). Results: $OUT/results.md.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/bench-live}
RATES=${RATES-"1000 3000"}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-10}
SOAK=${SOAK-50000}
SOAK_RATE=${SOAK_RATE:-1000}
RUNS=${RUNS:-1}
case $RUNS in '' | *[!0-9]* | 0) echo "RUNS: want a positive whole number, got '$RUNS'" >&2; exit 2 ;; esac
BIN=bin/inferrail

make -s build
mkdir -p "$OUT"
rm -f "$OUT"/*.cpu "$OUT"/*.split "$OUT"/*.cs
# shellcheck source=scripts/live-lib.sh
. scripts/live-lib.sh
start_zero_engines 19001 19002 19003
cat >"$TMP/live.yaml" <<YAML
listen: 127.0.0.1:19080
admin_listen: 127.0.0.1:19090
drain_delay: 0s            # no load balancer to wait for
log: {access_sample: 0}   # as nginx's access_log off (live-lib.sh)
pprof: true
procs: ${LIVE_PROCS:-adaptive}
sysmon: ${LIVE_SYSMON:-awake}
${LIVE_YAML:-}
YAML
zero_model_yaml 19001 19002 19003 >>"$TMP/live.yaml"
# shellcheck disable=SC2086
env GOMAXPROCS=${LIVE_GOMAXPROCS:-} ${LIVE_ENV:-} $BIN live --config "$TMP/live.yaml" 2>"$TMP/live.log" &
LIVE=$!
PIDS+=($LIVE)
# nginx on 19081, with the traced proxy's OTLP/HTTP receiver on 19083.
start_nginx 19081 19083 19001 19002 19003
ORDER=${ORDER:-live nginx go-baseline go-raw}
# nginx-twin, when ORDER names it: a second nginx, the same in every way, on
# 19085: the method's own resolution (how often nginx's added p99 is within
# nginx's).
case " $ORDER " in *" nginx-twin "*) start_nginx 19085 0 19001 19002 19003 ;; esac
go build -o "$TMP/baseline-proxy" ./scripts/baseline-proxy
# The baselines run with live's runtime settings at these loads: the
# runtime monitor kept awake (sysmon: awake) and one processor (what procs:
# adaptive picks here); BASELINE_ENV= runs them with Go's defaults.
BASELINE_ENV=${BASELINE_ENV-"GODEBUG=schedtrace=2147483647 GOMAXPROCS=1"}
# shellcheck disable=SC2086
env $BASELINE_ENV "$TMP/baseline-proxy" -listen 127.0.0.1:19087 http://127.0.0.1:19001 http://127.0.0.1:19002 http://127.0.0.1:19003 2>"$TMP/baseline.log" &
BASELINE_PID=$!
env $BASELINE_ENV "$TMP/baseline-proxy" -raw -listen 127.0.0.1:19088 http://127.0.0.1:19001 http://127.0.0.1:19002 http://127.0.0.1:19003 2>"$TMP/baseline-raw.log" &
RAW_PID=$!
PIDS+=($BASELINE_PID $RAW_PID)
sleep 2
for pid in $LIVE $BASELINE_PID $RAW_PID; do
	if ! kill -0 "$pid" 2>/dev/null; then
		echo "bench-live: a proxy did not start; live's log:" >&2
		cat "$TMP/live.log" >&2
		exit 1
	fi
done

# Context switches (voluntary and not) of a set of processes' threads, from
# /proc: each costs a proxy a trip through the kernel's scheduler.
switches() {
	local t=0 p f
	for p in "$@"; do
		for f in /proc/"$p"/task/*/status; do
			[ -r "$f" ] || continue
			t=$((t + $(awk '/ctxt_switches/ {s += $2} END {print s + 0}' "$f" 2>/dev/null || echo 0)))
		done
	done
	echo "$t"
}
HZ=$(getconf CLK_TCK)
run() { # name url rate requests [pids to charge the CPU of]
	local name=$1 url=$2 rate=$3 n=$4
	shift 4
	local u0 k0 u1 k1 cs
	read -r u0 k0 < <(cpu_split "$@")
	cs=$(switches "$@")
	$BIN bench --base-url "$url" "${BENCH_WL[@]}" --rate "$rate" --requests "$n" --timeout 30s --json 2>/dev/null >"$OUT/$name-$rate.json"
	if [ $# -gt 0 ]; then
		read -r u1 k1 < <(cpu_split "$@")
		echo $(( (u1 + k1 - u0 - k0) * 1000000 / HZ / n )) >"$OUT/$name-$rate.cpu"
		echo "$(( (u1 - u0) * 1000000 / HZ / n )) + $(( (k1 - k0) * 1000000 / HZ / n ))" >"$OUT/$name-$rate.split"
		python3 -c "print(f'{($(switches "$@") - $cs) / $n:.2f}')" >"$OUT/$name-$rate.cs"
	fi
}
summarise() { # name rate
	python3 - "$OUT/$1-$2.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"{s['ttft_ms']['p50']:.3f} {s['ttft_ms']['p99']:.3f} {s['e2e_ms']['p50']:.3f} {s['e2e_ms']['p99']:.3f} {s['completed']} {s['failed']}")
PY
}
# own_part is live's own part of the time to first byte over the last
# measured run (inferrail_proxy_overhead_seconds between the snapshots
# taken before and after it), p50 / p99 in ms, interpolated within its
# buckets as Prometheus's histogram_quantile does.
own_part() { # rate
	python3 - "$OUT/live-$1.before.prom" "$OUT/live-$1.after.prom" <<'PY'
import re, sys
def buckets(path):
    b = {}
    for line in open(path):
        m = re.match(r'inferrail_proxy_overhead_seconds_bucket\{.*le="([^"]+)".*\} (\S+)', line)
        if m:
            le = float("inf") if m[1] == "+Inf" else float(m[1])
            b[le] = b.get(le, 0) + float(m[2])
    return b
before, after = buckets(sys.argv[1]), buckets(sys.argv[2])
cum = sorted((le, after[le] - before.get(le, 0)) for le in after)
total = cum[-1][1] if cum else 0
def q(p):
    rank, lo, prev = p * total, 0.0, 0.0
    for le, c in cum:
        if c >= rank:
            if le == float("inf"):
                return lo
            return lo + (le - lo) * (rank - prev) / max(c - prev, 1e-9)
        lo, prev = le, c
    return lo
print(f"{q(0.5) * 1000:.3f} / {q(0.99) * 1000:.3f} ms" if total else "-")
PY
}
DIRECT=http://127.0.0.1:19001,http://127.0.0.1:19002,http://127.0.0.1:19003
{
	echo "# Gateway overhead ($(date -u +%Y-%m-%d), $(nproc) cores, $(git describe --always --dirty))"
	echo
	echo "TTFT and end-to-end latency in ms (W6 with ~256-token prompts and $ANSWER_TOKENS-token answers, 3 engines of near-zero cost, steps of $STEP_MS ms); overhead = through the proxy minus direct. $([ "$READ_TO_END" = 1 ] && echo "The client reads each stream to the response's end, so every path keeps its connections." || echo "The client closes each stream at data: [DONE], as the OpenAI SDKs do (READ_TO_END=0): the engines and nginx end a stream in a later write, so direct and nginx take a new connection for most requests, live does not.")"
	echo
	echo "| run | rate | path | TTFT p50 | TTFT p99 | e2e p50 | e2e p99 | ok | failed | added TTFT p50 | added TTFT p99 | proxy CPU µs/request | of it user + system | proxy context switches/request | live's own part p50 / p99 |"
	echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
} >"$OUT/results.md"
: >"$OUT/runs.tsv"
: >"$OUT/failures.md"
for r in $(seq "$RUNS"); do
for rate in $RATES; do
	n=$((rate * SECONDS_PER_RUN))
	run warm "$DIRECT" "$rate" $((rate * 2))
	run direct "$DIRECT" "$rate" "$n"
	for path in $ORDER; do
		case $path in
		live) url=http://127.0.0.1:19080 pids=$LIVE ;;
		nginx) url=http://127.0.0.1:19081 pids=$(nginx_pids 19081) ;;
		nginx-twin) url=http://127.0.0.1:19085 pids=$(nginx_pids 19085) ;;
		go-baseline) url=http://127.0.0.1:19087 pids=$BASELINE_PID ;;
		go-raw) url=http://127.0.0.1:19088 pids=$RAW_PID ;;
		*) echo "ORDER: unknown path $path (live, nginx, nginx-twin, go-baseline, go-raw)" >&2; exit 2 ;;
		esac
		run warm "$url" "$rate" $((rate * 2))
		[ "$path" = live ] && curl -s http://127.0.0.1:19090/metrics >"$OUT/live-$rate.before.prom"
		# shellcheck disable=SC2086
		run "$path" "$url" "$rate" "$n" $pids
		[ "$path" = live ] && curl -s http://127.0.0.1:19090/metrics >"$OUT/live-$rate.after.prom"
	done
	if [ -n "${DIRECT_AFTER:-}" ]; then run direct-after "$DIRECT" "$rate" "$n"; fi
	read -r d50 d99 _ _ _ _ <<<"$(summarise direct "$rate")"
	for path in direct $ORDER ${DIRECT_AFTER:+direct-after}; do
		read -r t50 t99 e50 e99 ok failed <<<"$(summarise $path "$rate")"
		a50=$(python3 -c "print(f'{$t50 - $d50:.3f}')")
		a99=$(python3 -c "print(f'{$t99 - $d99:.3f}')")
		cpu=- cs=- own=-
		[ -f "$OUT/$path-$rate.cpu" ] && cpu=$(cat "$OUT/$path-$rate.cpu")
		split=-
		[ -f "$OUT/$path-$rate.split" ] && split=$(cat "$OUT/$path-$rate.split")
		[ -f "$OUT/$path-$rate.cs" ] && cs=$(cat "$OUT/$path-$rate.cs")
		[ "$path" = live ] && own=$(own_part "$rate")
		echo "| $r | $rate | $path | $t50 | $t99 | $e50 | $e99 | $ok | $failed | $a50 | $a99 | $cpu | $split | $cs | $own |" >>"$OUT/results.md"
		if [ "$failed" != 0 ]; then # why, for the notes under the table
			python3 - "$OUT/$path-$rate.json" "$r" "$rate" "$path" >>"$OUT/failures.md" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
why = ", ".join(f"{k}: {v}" for k, v in sorted((s.get("failed_by") or {}).items())) or "no reason recorded"
ex = "; ".join(f"{k}: {str(v)[:160]}" for k, v in sorted((s.get("error_examples") or {}).items())[:3])
print(f"- Run {sys.argv[2]}, {sys.argv[3]} req/s, {sys.argv[4]}: {s['failed']} failed ({why}){'; e.g. ' + ex if ex else ''}.")
PY
		fi
		printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$rate" "$path" "$a99" "$cpu" "$failed" "$own" >>"$OUT/runs.tsv"
	done
done
done
if [ -s "$OUT/runs.tsv" ]; then
	python3 - "$OUT/runs.tsv" >>"$OUT/results.md" <<'PY'
import sys, collections
rows = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    run, rate, path, a99, cpu, failed, own = line.rstrip("\n").split("\t")
    rows[(int(rate), int(run))][path] = (float(a99), cpu, int(failed), own)
print()
for rate in sorted({k[0] for k in rows}):
    runs = [rows[k] for k in sorted(rows) if k[0] == rate]
    both = [r for r in runs if "live" in r and "nginx" in r]
    if not both:
        continue
    # A run where either proxy failed a request is not a win for either.
    within = sum(1 for r in both if r["live"][0] <= r["nginx"][0] and r["live"][2] == 0 and r["nginx"][2] == 0)
    failing = sum(1 for r in both if r["live"][2] or r["nginx"][2])
    ratios = [int(r["live"][1]) / int(r["nginx"][1]) for r in both if r["live"][1].isdigit() and r["nginx"][1].isdigit() and int(r["nginx"][1]) > 0]
    span = f"{min(ratios):.2f}-{max(ratios):.2f}x" if ratios else "-"
    note = f" ({failing} with failed requests, not counted)" if failing else ""
    twin = ""
    pair = [r for r in runs if "nginx-twin" in r and "nginx" in r]
    if pair:
        k = sum(1 for r in pair if r["nginx-twin"][0] <= r["nginx"][0] and r["nginx-twin"][2] == 0 and r["nginx"][2] == 0)
        twin = f" The twin nginx's within nginx's in {k} of {len(pair)}."
    # live's own part's p99 (the column's second figure, "a / b ms").
    owns = [float(r["live"][3].split("/")[1].split()[0]) for r in both if "/" in r["live"][3]]
    own = f" live's own part of the TTFT at p99: {min(owns):.3f}-{max(owns):.3f} ms." if owns else ""
    print(f"At {rate} req/s: live's added TTFT p99 within nginx's in {within} of {len(both)} runs{note}; its CPU per request {span} nginx's.{twin}{own}")
PY
	if [ -s "$OUT/failures.md" ]; then
		{ echo; echo "Failed requests, by reason (the bench tool's failed_by):"; cat "$OUT/failures.md"; } >>"$OUT/results.md"
	fi
fi

if [ "${COSTS:-1}" != 0 ]; then
# Tracing's cost: a second proxy, the same but for traces sampled at 0.1
# and exported to a receiver (nginx answering 200), against the untraced one,
# alternately, at TRACE_RATE.
TRACE_RATE=${TRACE_RATE:-1000}
sed -e 's/127.0.0.1:19080/127.0.0.1:19082/' -e 's/127.0.0.1:19090/127.0.0.1:19092/' "$TMP/live.yaml" >"$TMP/traced.yaml"
printf 'tracing: {endpoint: "http://127.0.0.1:19083/v1/traces", sample_ratio: 0.1}\n' >>"$TMP/traced.yaml"
$BIN live --config "$TMP/traced.yaml" 2>"$TMP/traced.log" &
TRACED=$!
PIDS+=($TRACED)
sleep 1
{
	echo
	echo "Tracing at $TRACE_RATE req/s, sampled at 0.1 and exported over OTLP/HTTP, against the same proxy untraced, alternately (TTFT in ms; added = traced minus untraced):"
	echo
	echo "| run | untraced p50 | untraced p99 | traced p50 | traced p99 | added p50 | added p99 | CPU µs/request untraced / traced |"
	echo "|---|---|---|---|---|---|---|---|"
} >>"$OUT/results.md"
n=$((TRACE_RATE * SECONDS_PER_RUN))
TRACE_RUNS=${TRACE_RUNS:-5}
added99=()
for i in $(seq "$TRACE_RUNS"); do
	run untraced$i http://127.0.0.1:19080 "$TRACE_RATE" "$n" "$LIVE"
	run traced$i http://127.0.0.1:19082 "$TRACE_RATE" "$n" "$TRACED"
	read -r u50 u99 _ _ _ _ <<<"$(summarise untraced$i "$TRACE_RATE")"
	read -r t50 t99 _ _ _ _ <<<"$(summarise traced$i "$TRACE_RATE")"
	a99=$(python3 -c "print(f'{$t99 - $u99:.3f}')")
	added99+=("$a99")
	echo "| $i | $u50 | $u99 | $t50 | $t99 | $(python3 -c "print(f'{$t50 - $u50:.3f}')") | $a99 | $(cat "$OUT/untraced$i-$TRACE_RATE.cpu") / $(cat "$OUT/traced$i-$TRACE_RATE.cpu") |" >>"$OUT/results.md"
done
echo "| median | | | | | | $(printf '%s\n' "${added99[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') | |" >>"$OUT/results.md"
kill "$TRACED"
wait "$TRACED" 2>/dev/null || true

# Keys and limits' cost: a third proxy with auth: keys (SQLite store), one
# key with RPM, TPM and concurrency limits far above the load (every
# request authenticated, charged, reconciled, leased and metered), against
# the plain one, alternately, at TRACE_RATE.
sed -e 's/127.0.0.1:19080/127.0.0.1:19084/' -e 's/127.0.0.1:19090/127.0.0.1:19094/' "$TMP/live.yaml" >"$TMP/keyed.yaml"
printf 'auth: keys\ntenancy: {store: "%s/keys.db"}\n' "$TMP" >>"$TMP/keyed.yaml"
$BIN live --config "$TMP/keyed.yaml" 2>"$TMP/keyed.log" &
KEYED=$!
PIDS+=($KEYED)
for _ in $(seq 50); do curl -sf 127.0.0.1:19094/livez >/dev/null && break; sleep 0.1; done
$BIN keys create --admin http://127.0.0.1:19094 --name bench --rpm 100000000 --tpm 100000000000 --max-concurrency 100000 >"$TMP/key" 2>/dev/null
{
	echo
	echo "Keys and limits at $TRACE_RATE req/s (auth: keys, one key with RPM, TPM and concurrency limits above the load, in-process limiter, SQLite store), against the same proxy without, alternately (TTFT in ms; added = keyed minus plain):"
	echo
	echo "| run | plain p50 | plain p99 | keyed p50 | keyed p99 | added p50 | added p99 | CPU µs/request plain / keyed |"
	echo "|---|---|---|---|---|---|---|---|"
} >>"$OUT/results.md"
added99=()
for i in $(seq "$TRACE_RUNS"); do
	run plain$i http://127.0.0.1:19080 "$TRACE_RATE" "$n" "$LIVE"
	export INFERRAIL_API_KEY
	INFERRAIL_API_KEY=$(cat "$TMP/key")
	run keyed$i http://127.0.0.1:19084 "$TRACE_RATE" "$n" "$KEYED"
	unset INFERRAIL_API_KEY
	read -r u50 u99 _ _ uok _ <<<"$(summarise plain$i "$TRACE_RATE")"
	read -r t50 t99 _ _ tok _ <<<"$(summarise keyed$i "$TRACE_RATE")"
	[ "$tok" = "$n" ] || echo "keyed run $i: only $tok of $n ok" >&2
	a99=$(python3 -c "print(f'{$t99 - $u99:.3f}')")
	added99+=("$a99")
	echo "| $i | $u50 | $u99 | $t50 | $t99 | $(python3 -c "print(f'{$t50 - $u50:.3f}')") | $a99 | $(cat "$OUT/plain$i-$TRACE_RATE.cpu") / $(cat "$OUT/keyed$i-$TRACE_RATE.cpu") |" >>"$OUT/results.md"
done
echo "| median | | | | | | $(printf '%s\n' "${added99[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') | |" >>"$OUT/results.md"
kill "$KEYED"
wait "$KEYED" 2>/dev/null || true

fi

if [ "${RECORD:-1}" != 0 ]; then
# Recording's cost: a proxy the same but for a record: section (every
# request recorded, salted block hashes, rotation off for the run), against
# the plain one, alternately, at RECORD_RATE.
RECORD_RATE=${RECORD_RATE:-1000}
RECORD_RUNS=${RECORD_RUNS:-5}
mkdir -p "$TMP/rec"
sed -e 's/127.0.0.1:19080/127.0.0.1:19086/' -e 's/127.0.0.1:19090/127.0.0.1:19096/' "$TMP/live.yaml" >"$TMP/recorded.yaml"
printf 'record: {path: "%s/rec/bench.parquet", salt: "bench-live-recording-salt"}\n' "$TMP" >>"$TMP/recorded.yaml"
$BIN live --config "$TMP/recorded.yaml" 2>"$TMP/recorded.log" &
RECORDED=$!
PIDS+=($RECORDED)
for _ in $(seq 50); do curl -sf 127.0.0.1:19096/livez >/dev/null && break; sleep 0.1; done
{
	echo
	echo "Recording at $RECORD_RATE req/s (record: every request, salted block hashes, parquet off the request path), against the same proxy without, alternately (TTFT in ms; added = recorded minus plain; CPU includes the writer):"
	echo
	echo "| run | plain p50 | plain p99 | recorded p50 | recorded p99 | added p50 | added p99 | CPU µs/request plain / recorded | CPU added |"
	echo "|---|---|---|---|---|---|---|---|---|"
} >>"$OUT/results.md"
n=$((RECORD_RATE * SECONDS_PER_RUN))
added99=()
addedcpu=()
for i in $(seq "$RECORD_RUNS"); do
	run rplain$i http://127.0.0.1:19080 "$RECORD_RATE" "$n" "$LIVE"
	run recorded$i http://127.0.0.1:19086 "$RECORD_RATE" "$n" "$RECORDED"
	read -r u50 u99 _ _ _ _ <<<"$(summarise rplain$i "$RECORD_RATE")"
	read -r t50 t99 _ _ tok _ <<<"$(summarise recorded$i "$RECORD_RATE")"
	[ "$tok" = "$n" ] || echo "recorded run $i: only $tok of $n ok" >&2
	a99=$(python3 -c "print(f'{$t99 - $u99:.3f}')")
	added99+=("$a99")
	pc=$(cat "$OUT/rplain$i-$RECORD_RATE.cpu")
	rc=$(cat "$OUT/recorded$i-$RECORD_RATE.cpu")
	ac=$(python3 -c "print(f'{100 * ($rc - $pc) / $pc:+.1f}%')")
	addedcpu+=("$ac")
	echo "| $i | $u50 | $u99 | $t50 | $t99 | $(python3 -c "print(f'{$t50 - $u50:.3f}')") | $a99 | $pc / $rc | $ac |" >>"$OUT/results.md"
done
echo "| median | | | | | | $(printf '%s\n' "${added99[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') | | $(printf '%s\n' "${addedcpu[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') |" >>"$OUT/results.md"
kill "$RECORDED"
wait "$RECORDED" 2>/dev/null || true
files=$(find "$TMP/rec" -name '*.parquet' | wc -l)
echo "" >>"$OUT/results.md"
echo "Recording files completed: $files." >>"$OUT/results.md"
fi

if [ "$SOAK" -gt 0 ]; then
# The soak runs on a fresh proxy, so the overload above does not colour it.
kill "$LIVE"
wait "$LIVE" 2>/dev/null || true
$BIN live --config "$TMP/live.yaml" 2>>"$TMP/live.log" &
LIVE=$!
PIDS+=($LIVE)
sleep 1
rss() { awk '/VmRSS/ {print $2}' "/proc/$LIVE/status"; }
run soakwarm http://127.0.0.1:19080 "$SOAK_RATE" 5000
before=$(rss)
run soak http://127.0.0.1:19080 "$SOAK_RATE" "$SOAK"
after=$(rss)
read -r _ _ _ _ ok failed <<<"$(summarise soak "$SOAK_RATE")"
{
	echo
	echo "Soak: $SOAK requests through a fresh live at $SOAK_RATE req/s after 5,000 to warm up: $ok ok, $failed failed; resident memory ${before} KiB before, ${after} KiB after (growth $(( (after - before) / 1024 )) MiB)."
} >>"$OUT/results.md"
fi
cat "$OUT/results.md"
