#!/usr/bin/env bash
# Regenerates the tokenizer parity fixtures in router/tokenize/testdata/:
# the corpus (Go, fixed seed) and, for each shared tokenizer, the reference
# library's ids and decodes. Needs node and npm; installs the reference
# library (tokenizers@0.23.2) once into $ORACLE_DIR (default /tmp/oracle).
# With BENCH=1 it also prints the reference's tokens/s on the corpus.
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
(cd "$root" && go run ./scripts/tokenize-fixtures/gencorpus -out "$out/corpus.json.gz")
for name in qwen2_5 qwen3 mistral_nemo mistral_7b gpt2; do
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
