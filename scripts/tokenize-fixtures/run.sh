#!/usr/bin/env bash
# Regenerates the tokenizer parity fixtures in router/tokenize/testdata/:
# the corpus (Go, fixed seed) and, for each shared tokenizer, the reference
# library's ids and decodes; and, for each model whose chat template is in
# router/tokenize/chat/testdata/parity.json (scripts/chat-fixtures), the
# reference ids of every rendered conversation (<name>.chat.oracle.json.gz).
# Needs node and npm; installs the reference library (tokenizers@0.23.2) once
# into $ORACLE_DIR (default /tmp/oracle).
# With BENCH=1 it also prints the reference's tokens/s on the corpus; with
# CHAT_ONLY=1 it regenerates only the chat fixtures.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
shared="${SHARED:-$root/../shared}"
oracle="${ORACLE_DIR:-/tmp/oracle}"
out="$root/router/tokenize/testdata"

if [ ! -f "$oracle/node_modules/tokenizers/package.json" ]; then
  mkdir -p "$oracle"
  (cd "$oracle" && { [ -f package.json ] || npm init -y >/dev/null; } && npm install --no-audit --no-fund tokenizers@0.23.2 >/dev/null)
fi
export NODE_PATH="$oracle/node_modules"

mkdir -p "$out"
names="qwen2_5 qwen3 mistral_nemo mistral_7b gpt2"
if [ "${CHAT_ONLY:-0}" = 1 ]; then names=""; else
  (cd "$root" && go run ./scripts/tokenize-fixtures/gencorpus -out "$out/corpus.json.gz")
fi
for name in $names; do
  tj="$shared/tokenizers/$name/tokenizer.json"
  if [ ! -f "$tj" ]; then
    echo "skip $name: $tj not found (set SHARED to the folder holding tokenizers/)" >&2
    continue
  fi
  node "$root/scripts/tokenize-fixtures/oracle.js" "$tj" "$out/corpus.json.gz" "$out/$name.oracle.json.gz"
  if [ "${BENCH:-0}" = 1 ]; then
    node "$root/scripts/tokenize-fixtures/bench.js" "$tj" "$out/corpus.json.gz"
  fi
done

# Chat ids: every template in the chat golden file that is a shared model's.
parity="$root/router/tokenize/chat/testdata/parity.json"
for name in $(node -e 'for (const k of Object.keys(JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).content_formats)) console.log(k)' "$parity"); do
  tj="$shared/tokenizers/$name/tokenizer.json"
  [ -f "$tj" ] || continue # a template written for the fixtures, not a model's
  node "$root/scripts/tokenize-fixtures/chat_oracle.js" "$tj" "$parity" "$name" "$out/$name.chat.oracle.json.gz"
done
