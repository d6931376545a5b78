#!/bin/sh
# A comparison run as SHARDS shards on this machine, JOBS at a time, with
# xargs -P, then merged: DIR ends up with what `inferrail compare --out DIR`
# writes for the same flags (results.json, requests.parquet, report.md, the
# charts), byte for byte. The shards share nothing but DIR; kill this script
# and run it again, and the shards skip the jobs they had stored.
#
#   examples/sweep/xargs.sh runs/w1-sweep --workload w1 --policies round_robin,cost_model --seeds 4
#   SHARDS=8 JOBS=4 examples/sweep/xargs.sh runs/w6-sweep --workload w6 --policies all --rates 6,8,10,12
#
# SHARDS (default 4): shards; JOBS (default 2): shards run at once;
# PARALLEL (default 1): simulations at once in each shard; INFERRAIL: the
# binary (default: inferrail on PATH). Plan, shards and merge must be the
# same build.
set -eu
if [ $# -lt 1 ]; then
	echo "usage: $0 DIR [compare flags...]" >&2
	exit 2
fi
dir=$1
shift
SHARDS=${SHARDS:-4}
JOBS=${JOBS:-2}
PARALLEL=${PARALLEL:-1}
INFERRAIL=${INFERRAIL:-inferrail}

"$INFERRAIL" compare plan --out "$dir" "$@"
# Shard i of N runs the jobs j with j % N == i, i counting from 0.
seq 0 $((SHARDS - 1)) | xargs -P "$JOBS" -I{} "$INFERRAIL" compare run "$dir" --shard {}/"$SHARDS" --parallel "$PARALLEL"
"$INFERRAIL" compare merge "$dir"
