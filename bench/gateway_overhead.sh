#!/usr/bin/env bash
# Gateway overhead on loopback against a backend that costs nothing (nginx with a canned SSE body).
# Compares, in one run: direct to the backend, fleetgate, and vllm-router (PyPI, Rust) as the reference.
# The router under test is pinned to CPU 1; wrk, the open-loop client and nginx share CPU 0.
# Usage: bash bench/gateway_overhead.sh [seconds-per-measurement]   (prints a Markdown table)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
BIN=.venv/bin
WORK=$(mktemp -d /tmp/fg-overhead.XXXXXX)
ROUTERS_VENV=${ROUTERS_VENV:-$HOME/.cache/fleetgate/venv-routers}
NGINX_PORT=18911; FG_PORT=18912; VR_PORT=18913
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT

command -v wrk >/dev/null || { apt-get install -y wrk >/dev/null; }
command -v nginx >/dev/null || { apt-get install -y nginx-light >/dev/null; }
if [ ! -x "$ROUTERS_VENV/bin/vllm-router" ]; then
  python3 -m venv "$ROUTERS_VENV" && "$ROUTERS_VENV/bin/pip" install -q vllm-router sglang-router
fi

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
taskset -c 1 "$BIN/fleetgate" serve --config "$WORK/fleetgate.yaml" > "$WORK/fleetgate.log" 2>&1 & pids+=($!)
taskset -c 1 "$ROUTERS_VENV/bin/vllm-router" --host 127.0.0.1 --port $VR_PORT --policy round_robin --prometheus-host 127.0.0.1 --prometheus-port 18914 \
  --worker-urls "http://127.0.0.1:$NGINX_PORT" --log-level warning > "$WORK/vllm-router.log" 2>&1 & pids+=($!)

wait_http() { for _ in $(seq 100); do curl -sf -o /dev/null "$1" && return 0; sleep 0.2; done; echo "not ready: $1" >&2; return 1; }
wait_http "http://127.0.0.1:$NGINX_PORT/health"
wait_http "http://127.0.0.1:$FG_PORT/readyz"
wait_http "http://127.0.0.1:$VR_PORT/health" || { cat "$WORK/vllm-router.log" >&2; exit 1; }

wrk_ms() {  # $1 url, $2 connections -> "p50_ms p99_ms req_per_s non2xx"
  local out
  out=$(taskset -c 0 wrk -t1 -c"$2" -d"${SECS}s" --latency -s bench/wrk_chat_stream.lua "$1")
  python3 - "$out" <<'PY'
import re, sys
text = sys.argv[1]
def ms(label):
    m = re.search(rf"^\s*{label}\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
    v, u = float(m.group(1)), m.group(2)
    return v / 1000 if u == "us" else v * 1000 if u == "s" else v
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
print(f"{ms('50%'):.3f} {ms('99%'):.3f} {rps:.0f} {bad.group(1) if bad else 0}")
PY
}

declare -A URL=([direct]="http://127.0.0.1:$NGINX_PORT" [fleetgate]="http://127.0.0.1:$FG_PORT" [vllm-router]="http://127.0.0.1:$VR_PORT")
echo "| target | p50 ms (1 conn) | p99 ms (1 conn) | added p50 ms | streamed req/s (32 conn) | p99 ms at 500 req/s | non-2xx |"
echo "|---|---|---|---|---|---|---|"
read -r d50 d99 _ _ <<<"$(wrk_ms "${URL[direct]}/v1/chat/completions" 1)"
for t in direct fleetgate vllm-router; do
  u="${URL[$t]}/v1/chat/completions"
  read -r p50 p99 _ bad1 <<<"$(wrk_ms "$u" 1)"
  read -r _ _ rps bad32 <<<"$(wrk_ms "$u" 32)"
  ol=$(taskset -c 0 "$BIN/python" bench/openloop.py "$u" --rate 500 --seconds "$SECS")
  p99ol=$(python3 -c "import json,sys; print(round(json.loads(sys.argv[1])['p99_ms'],3))" "$ol")
  added=$(python3 -c "print(round($p50 - $d50, 3))")
  echo "| $t | $p50 | $p99 | $added | $rps | $p99ol | $((bad1 + bad32)) |"
done
