#!/usr/bin/env bash
# Instructions per simulated request under callgrind (independent of the machine's load): the simulator run
# at two request counts, the difference over the difference of requests (start-up and imports cancel).
# Usage: PYTHONPATH=SRC bash bench/sim_callgrind.sh CASE N1 N2   (CASE: large | mooncake; e.g. large 3000 9000,
# mooncake 300 1300). large: sim_speed's synthetic trace on 128 replicas; mooncake: the conversation trace on
# 16 replicas. Prints both totals and the per-request figure.
set -euo pipefail
cd "$(dirname "$0")/.."
CASE=$1; N1=$2; N2=$3
W=$(mktemp -d /tmp/fg-simcg.XXXXXX)
trap 'rm -rf "$W"' EXIT
cat > "$W/run.py" <<'PY'
import sys
from fleetgate.sim.runner import SimOptions, run
from fleetgate.sim.traces import default_traces_dir
n, case = int(sys.argv[1]), sys.argv[2]
if case == "large":
    trace = f"synthetic:n={n},rate=400,cv=1.2,groups=200,blocks=2"
    opts = SimOptions(trace=trace, policy="fleetgate", replicas=128, mode="des")
else:
    trace = str(default_traces_dir() / "mooncake" / "conversation_trace.jsonl")
    opts = SimOptions(trace=trace, policy="fleetgate", replicas=16, mode="des", max_requests=n)
run(opts)
PY
total() {
  valgrind --tool=callgrind --callgrind-out-file="$W/cg.$1" .venv/bin/python "$W/run.py" "$1" "$CASE" \
    > /dev/null 2> "$W/err.$1"
  grep -E "^(summary|totals):" "$W/cg.$1" | head -1 | awk '{print $2}'
}
a=$(total "$N1"); b=$(total "$N2")
echo "case=$CASE n=$N1 instructions=$a n=$N2 instructions=$b per_request=$(( (b - a) / (N2 - N1) ))"
