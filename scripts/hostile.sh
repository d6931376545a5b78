#!/usr/bin/env bash
# inferrail live against hostile clients: a 31.5 MiB body, h2c streams that
# never read, 20,000 connections that stall mid-body, every engine killed,
# an engine killed mid-stream (the OpenAI Node SDK's view too), a SIGSTOPped
# engine, the predicted-cached-tokens header as a cache oracle, a 500 KiB
# x-request-id, a flood of 1,000 background responses. Each scenario starts its own three engines and proxy on
# 127.0.0.1 and stops them (about 1.5 minutes on 2 cores). Prints a markdown
# table, writes $OUT/results.md (default runs/hostile), exits 0 when a goal
# is missed. Arguments go to the harness: --scenario NAME runs one.
# BIN=path measures another inferrail binary (then nothing is rebuilt).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/hostile}
CMD="scripts/hostile.sh"
if [ -z "${BIN:-}" ]; then
	make -s build
	BIN=bin/inferrail
else
	CMD="BIN=$BIN $CMD"
fi
make -s node-deps || echo "hostile: no OpenAI Node SDK: stream-cut runs without it" >&2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
go build -o "$TMP/hostile" ./scripts/hostile
HOSTILE_COMMAND="$CMD${*:+ $*}" "$TMP/hostile" --bin "$BIN" --out "$OUT" "$@"
