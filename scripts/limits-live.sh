#!/usr/bin/env bash
# Rate limits across gateways, live: GATEWAYS (default 3) inferrail live
# processes sharing one Redis (the limiter; a redis-server on a unix socket
# started here) and one SQLite store, in front of three inferrail engines;
# one API key with RPM and TPM limits over a short WINDOW (default 10s, so a
# run of a few windows takes seconds); CLIENTS (default 64) concurrent
# closed-loop clients on that key, spread over the gateways. From the
# gateways' access logs: the requests admitted (and their tokens) in every
# window that starts at a refusal, which tenancy/limit bounds by the limit
# (tokens: TPM plus one request's estimate), and in any window at all
# (burst plus refill: at most twice the limit). Results: $OUT/results.md.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/limits-live}
GATEWAYS=${GATEWAYS:-3}
CLIENTS=${CLIENTS:-64}
WINDOW=${WINDOW:-10s}
RPM=${RPM:-40}
TPM=${TPM:-4000}
SECONDS_RUN=${SECONDS_RUN:-35}
BIN=bin/inferrail
make -s build
command -v redis-server >/dev/null || { echo "limits-live needs redis-server (make redis-deps)" >&2; exit 1; }
mkdir -p "$OUT"
TMP=$(mktemp -d)
chmod 755 "$TMP"
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	rm -rf "$TMP"
}
trap cleanup EXIT

redis-server --port 0 --unixsocket "$TMP/redis.sock" --unixsocketperm 777 --save '' --appendonly no --dir "$TMP" >"$TMP/redis.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 50); do [ -S "$TMP/redis.sock" ] && break; sleep 0.1; done
for p in 19701 19702 19703; do
	$BIN engine --port $p --profile "$(pwd)/examples/profile-default-8b-24gb.yaml" 2>"$TMP/engine-$p.log" &
	PIDS+=($!)
done
urls=""
for g in $(seq "$GATEWAYS"); do
	lp=$((19740 + g))
	cat >"$TMP/live-$g.yaml" <<YAML
listen: 127.0.0.1:$lp
admin_listen: 127.0.0.1:$((lp + 20))
drain_delay: 0s
log: {format: json, access_sample: 1}
auth: keys
tenancy:
  store: "$TMP/keys.db"
  window: $WINDOW
  redis: {address: "unix://$TMP/redis.sock", timeout: 50ms, gateways: $GATEWAYS}
models:
  - name: inferrail-sim
    policy: cost_model
    tokenizer: builtin:sim
    replicas:
      - {name: a, url: "http://127.0.0.1:19701"}
      - {name: b, url: "http://127.0.0.1:19702"}
      - {name: c, url: "http://127.0.0.1:19703"}
YAML
	$BIN live --config "$TMP/live-$g.yaml" 2>"$TMP/live-$g.log" &
	PIDS+=($!)
	urls="$urls $lp"
	for _ in $(seq 100); do curl -sf "127.0.0.1:$((lp + 20))/livez" >/dev/null && break; sleep 0.1; done
done
$BIN keys create --admin http://127.0.0.1:19761 --name shared --rpm "$RPM" --tpm "$TPM" >"$TMP/key" 2>/dev/null

# CLIENTS closed-loop clients, each sending one completion after another
# (a 40-word prompt and max_tokens 8: an estimate of about 48 tokens) to
# the gateways in turn, for SECONDS_RUN seconds.
python3 - "$TMP/key" "$CLIENTS" "$SECONDS_RUN" $urls <<'PY'
import http.client, json, sys, threading, time
key = open(sys.argv[1]).read().strip()
clients, secs, ports = int(sys.argv[2]), float(sys.argv[3]), [int(p) for p in sys.argv[4:]]
body = json.dumps({"model": "inferrail-sim", "prompt": " ".join(f"w{i}" for i in range(40)) + " ", "max_tokens": 8, "ignore_eos": True})
end = time.time() + secs
def client(i):
    conns = [http.client.HTTPConnection("127.0.0.1", p, timeout=30) for p in ports]
    n = i
    while time.time() < end:
        c = conns[n % len(conns)]; n += 1
        try:
            c.request("POST", "/v1/completions", body, {"Authorization": "Bearer " + key, "Content-Type": "application/json"})
            r = c.getresponse(); r.read()
            if r.status == 429:
                time.sleep(0.005)
        except Exception:
            conns[(n - 1) % len(conns)] = http.client.HTTPConnection("127.0.0.1", ports[(n - 1) % len(ports)], timeout=30)
ts = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
[t.start() for t in ts]; [t.join() for t in ts]
PY
sleep 1
cat "$TMP"/live-*.log >"$OUT/access.jsonl"
python3 - "$OUT/access.jsonl" "$WINDOW" "$RPM" "$TPM" "$GATEWAYS" "$CLIENTS" >"$OUT/results.md" <<'PY'
import json, re, sys, datetime
path, window, rpm, tpm, gws, clients = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
W = float(window.rstrip("s"))
ok, refused = [], []
for line in open(path):
    try:
        e = json.loads(line)
    except ValueError:
        continue
    if e.get("msg") != "access":
        continue
    ts = re.sub(r"(\.\d{6})\d+", r"\1", e["time"].replace("Z", "+00:00"))
    t = datetime.datetime.fromisoformat(ts).timestamp() - e["duration_ms"] / 1000
    if e["status"] == 200:
        ok.append((t, e["prompt_tokens"] + e["output_tokens"]))
    elif e["status"] == 429:
        refused.append(t)
ok.sort(); refused.sort()
est = 40 + 8
def count(a, b):
    sel = [x for x in ok if a <= x[0] < b]
    return len(sel), sum(x[1] for x in sel)
# Windows that start at a refusal (the bucket was empty then) and lie
# inside the run.
end = ok[-1][0] if ok else 0
at_refusal = [count(r, r + W) for r in refused[::max(1, len(refused) // 2000)] if r + W <= end]
anywhere = [count(t, t + W) for t, _ in ok if t + W <= end]
print(f"# Rate limits across {gws} gateways on one Redis ({datetime.date.today()})")
print()
print(f"One key, {rpm} requests and {tpm} tokens per {window} window, {clients} closed-loop clients over {gws} inferrail live processes; {len(ok)} admitted, {len(refused)} refused with 429, over {end - ok[0][0]:.1f} s.")
print()
print("| measure | most seen | bound |")
print("|---|---|---|")
print(f"| requests admitted in a window that starts at a refusal | {max(c for c, _ in at_refusal)} | {rpm} (the limit) |")
print(f"| tokens used in a window that starts at a refusal | {max(t for _, t in at_refusal)} | {tpm} + one estimate ({est}) = {tpm + est} |")
print(f"| requests admitted in any window | {max(c for c, _ in anywhere)} | {2 * rpm} (burst + refill) |")
print(f"| requests admitted over the run | {len(ok)} | {rpm} + {rpm} x {(end - ok[0][0]) / W:.2f} windows = {rpm + rpm * (end - ok[0][0]) / W:.0f} |")
PY
cat "$OUT/results.md"
