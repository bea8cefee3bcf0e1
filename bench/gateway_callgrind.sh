#!/usr/bin/env bash
# Instructions per streamed request of `fleetgate serve` under callgrind: a count that does not depend on the
# machine's load (wall-clock and CPU figures on the shared machine do). Same setup as gateway_overhead.sh
# (nginx with a canned SSE body, round_robin, access log and health checks off); wrk -c4 warms up for WARM_S,
# the counters are zeroed (callgrind_control -z), wrk runs MEASURE_S more, the counters are dumped (-d).
# Usage: PYTHONPATH=SRC bash bench/gateway_callgrind.sh [WARM_S] [MEASURE_S]   (needs valgrind, wrk, nginx)
# Prints: requests, instructions, instructions per request, load. A stretch holds a few hundred requests
# (callgrind runs ~50x slower); runs of one tree differ by ~1-2% (timers, collections, the headroom
# controller's decisions fall differently), so compare trees by several runs. CG_KEEP=DIR keeps the
# callgrind files there (for callgrind_annotate).
set -euo pipefail
cd "$(dirname "$0")/.."
WARM=${1:-5}; MEAS=${2:-20}
W=$(mktemp -d /tmp/fg-callgrind.XXXXXX)
NP=$((19000 + RANDOM % 500)); FP=$((NP + 500))
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT
sed "s#__DIR__#$W#g; s#__PORT__#$NP#g" bench/nginx/canned-sse.conf.template > "$W/nginx.conf"
nginx -c "$W/nginx.conf" -p "$W" & pids+=($!)
cat > "$W/fg.yaml" <<YAML
gateway: {host: 127.0.0.1, port: $FP, health_checks: false}
ops: {access_log: false}
deployments:
  - model: bench
    routing: {policy: round_robin}
    replicas: [{name: nginx, url: "http://127.0.0.1:$NP"}]
YAML
valgrind --tool=callgrind --callgrind-out-file="$W/cg.out" .venv/bin/python -m fleetgate.cli serve \
  --config "$W/fg.yaml" > "$W/fg.log" 2>&1 &
vg=$!; pids+=($vg)
for _ in $(seq 300); do curl -sf -o /dev/null "http://127.0.0.1:$FP/readyz" && break; sleep 1; done
url="http://127.0.0.1:$FP/v1/chat/completions"
wrk -t1 -c4 -d"${WARM}s" -s bench/wrk_chat_stream.lua "$url" > /dev/null
callgrind_control -z "$vg" > /dev/null
out=$(wrk -t1 -c4 -d"${MEAS}s" -s bench/wrk_chat_stream.lua "$url")
callgrind_control -d "$vg" > /dev/null
sleep 1
n=$(echo "$out" | grep -oE "^ +[0-9]+ requests in" | grep -oE "[0-9]+")
tot=0
for f in "$W"/cg.out.*; do t=$(grep -E "^(summary|totals):" "$f" | head -1 | awk '{print $2}'); tot=$((tot + ${t:-0})); done
if [ -n "${CG_KEEP:-}" ]; then mkdir -p "$CG_KEEP" && cp "$W"/cg.out.* "$CG_KEEP"/; fi
echo "requests=$n instructions=$tot per_request=$((tot / n)) load=$(cut -d' ' -f1 /proc/loadavg)"
