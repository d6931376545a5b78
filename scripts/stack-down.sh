#!/usr/bin/env bash
# make stack-down: stops what scripts/stack.sh started, by the pids it
# recorded in runs/stack/pids (STACK_DIR): SIGTERM to each process group,
# SIGKILL to those still running after 5 s. Logs and Prometheus's data stay.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${STACK_DIR:-runs/stack}
PIDS=$DIR/pids
if [ ! -s "$PIDS" ]; then
	echo "stack-down: nothing to stop ($PIDS is missing or empty)"
	exit 0
fi

# ours PID: the process is still one the stack started (an inferrail or
# prometheus process leading its own group), not a reused pid.
ours() {
	local pid=$1 args pgid
	args=$(ps -o args= -p "$pid" 2>/dev/null) || return 1
	pgid=$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ') || return 1
	[ "$pgid" = "$pid" ] || return 1
	case "$args" in
	*inferrail* | *prometheus*) return 0 ;;
	esac
	return 1
}

live=()
while read -r name pid; do
	[ -n "${pid:-}" ] || continue
	if ours "$pid"; then
		kill -TERM -- "-$pid" 2>/dev/null || true
		live+=("$name:$pid")
	fi
done <"$PIDS"

for _ in $(seq 50); do
	left=()
	for np in "${live[@]}"; do
		kill -0 "${np#*:}" 2>/dev/null && left+=("$np")
	done
	live=("${left[@]}")
	[ "${#live[@]}" -eq 0 ] && break
	sleep 0.1
done
for np in "${live[@]}"; do
	echo "stack-down: ${np%%:*} (pid ${np#*:}) ignored SIGTERM for 5 s: SIGKILL"
	kill -KILL -- "-${np#*:}" 2>/dev/null || true
done
rm -f "$PIDS"
echo "stack stopped (logs and data kept in $DIR/)"
