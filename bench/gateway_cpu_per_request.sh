#!/usr/bin/env bash
# fleetgate's CPU time per streamed request, for comparing two trees on a busy machine (throughput figures
# move with the machine's load; CPU seconds per request much less). Same setup as gateway_overhead.sh:
# nginx serving a canned SSE body, fleetgate (round_robin, access log and health checks off) pinned to CPU 1,
# wrk (32 connections) and nginx on CPU 0. Each tree given runs ROUNDS times, alternating.
# Usage: bash bench/gateway_cpu_per_request.sh SECONDS ROUNDS SRC_DIR...   (PYTHONPATH=SRC_DIR per run)
# Prints one JSON line per run: tree, requests served, fleetgate CPU seconds, CPU us per request, req/s.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-5}; ROUNDS=${2:-2}; shift 2
BIN=.venv/bin
WORK=$(mktemp -d /tmp/fg-cpu.XXXXXX)
NGINX_PORT=18921; FG_PORT=18922
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
command -v wrk >/dev/null && command -v nginx >/dev/null || { echo "needs wrk and nginx (apt-get install wrk nginx-light)" >&2; exit 1; }

sed "s#__DIR__#$WORK#g; s#__PORT__#$NGINX_PORT#g" bench/nginx/canned-sse.conf.template > "$WORK/nginx.conf"
taskset -c 0 nginx -c "$WORK/nginx.conf" -p "$WORK" & pids+=($!)
cat > "$WORK/fleetgate.yaml" <<YAML
gateway: {host: 127.0.0.1, port: $FG_PORT, health_checks: false}
ops: {access_log: false}
deployments:
  - model: bench
    routing: {policy: round_robin}
    replicas: [{name: nginx, url: "http://127.0.0.1:$NGINX_PORT"}]
YAML
wait_http() { for _ in $(seq 100); do curl -sf -o /dev/null "$1" && return 0; sleep 0.2; done; echo "not ready: $1" >&2; return 1; }
wait_http "http://127.0.0.1:$NGINX_PORT/health"
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"; }

for _ in $(seq "$ROUNDS"); do
  for src in "$@"; do
    PYTHONPATH="$src" taskset -c 1 "$BIN/fleetgate" serve --config "$WORK/fleetgate.yaml" > "$WORK/fg.log" 2>&1 &
    fg=$!
    wait_http "http://127.0.0.1:$FG_PORT/readyz"
    taskset -c 0 wrk -t1 -c32 -d2s -s bench/wrk_chat_stream.lua "http://127.0.0.1:$FG_PORT/v1/chat/completions" >/dev/null  # warm-up
    c0=$(cpu_s $fg)
    out=$(taskset -c 0 wrk -t1 -c32 -d"${SECS}s" -s bench/wrk_chat_stream.lua "http://127.0.0.1:$FG_PORT/v1/chat/completions")
    c1=$(cpu_s $fg)
    kill $fg; wait $fg 2>/dev/null || true
    python3 - "$src" "$out" "$c0" "$c1" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import json, re, sys
src, text, c0, c1, load = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
n = int(re.search(r"(\d+) requests in", text).group(1))
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
print(json.dumps({"tree": src, "requests": n, "cpu_s": round(c1 - c0, 2), "cpu_us_per_request": round((c1 - c0) / n * 1e6),
                  "req_per_s": round(rps), "non_2xx": int(bad.group(1)) if bad else 0, "load_avg_1m": float(load)}))
PY
  done
done
