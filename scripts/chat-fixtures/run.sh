#!/usr/bin/env bash
# Regenerates router/tokenize/chat/testdata/{parity,whitespace}.json: chat
# templates rendered by Python Jinja2 configured as transformers configures it
# (the shared oracle's render_py.py), from requests converted as vLLM converts them.
#
# usage: scripts/chat-fixtures/run.sh      (from anywhere)
# env:   SHARED (default: ../shared next to the repository), FIXTURE_DATE (default 2025-01-15)
# needs: python3 and jinja2 (Debian/Ubuntu package python3-jinja2); installs nothing.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
shared="${SHARED:-$repo/../shared}"
oracle="$shared/tools/oracle/render_py.py"
tokdir="$shared/tokenizers"
out="$repo/router/tokenize/chat/testdata"
export FIXTURE_DATE="${FIXTURE_DATE:-2025-01-15}"

if ! command -v python3 >/dev/null; then
  echo "python3 not found: install python3 and python3-jinja2 (apt-get install python3-jinja2)" >&2; exit 1
fi
if ! python3 -c 'import jinja2' 2>/dev/null; then
  echo "python jinja2 not found: install python3-jinja2 (apt-get install python3-jinja2)" >&2; exit 1
fi
for f in "$oracle" "$tokdir/qwen2_5/tokenizer_config.json"; do
  [ -e "$f" ] || { echo "missing $f: set SHARED to the folder holding tools/oracle and tokenizers" >&2; exit 1; }
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 "$here/gen.py" prepare "$tokdir" "$work"
for t in "$work"/templates-*.json; do
  name="$(basename "$t" .json)"; name="${name#templates-}"
  python3 "$oracle" "$t" "$work/conversations-$name.json" "$work/rendered-$name.json" >/dev/null
done
mkdir -p "$out"
python3 "$here/gen.py" collect "$work" "$out"
