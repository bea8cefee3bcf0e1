#!/usr/bin/env bash
# Runs every test. Starts what the tests need (e.g. Redis) and stops it afterwards; exits non-zero on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
export PYTHONUNBUFFERED=1

# --- Redis for the admission store tests (tests needing it skip only when FLEETGATE_TEST_REDIS_URL is unset).
start_test_redis() {
  if ! command -v redis-server >/dev/null 2>&1; then
    echo "redis-server not found: installing it with apt-get" >&2
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo -n"; fi
    { $SUDO apt-get install -y redis-server >/dev/null 2>&1 \
      || { $SUDO apt-get update >/dev/null 2>&1 && $SUDO apt-get install -y redis-server >/dev/null 2>&1; }; } \
      || echo "could not install redis-server; Redis tests will be skipped" >&2
  fi
  command -v redis-server >/dev/null 2>&1 || return 0
  local port dir
  port=$("$BIN/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  dir=$(mktemp -d)
  redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no --dir "$dir" \
    --daemonize no >"$dir/redis.log" 2>&1 &
  REDIS_PID=$!
  trap 'kill "$REDIS_PID" 2>/dev/null || true; wait "$REDIS_PID" 2>/dev/null || true; rm -rf "'"$dir"'"' EXIT
  for _ in $(seq 1 50); do
    if "$BIN/python" -c "import socket,sys; socket.create_connection(('127.0.0.1', $port), 0.2)" 2>/dev/null; then
      export FLEETGATE_TEST_REDIS_URL="redis://127.0.0.1:$port/0"
      return 0
    fi
    sleep 0.1
  done
  echo "redis-server did not start; Redis tests will be skipped" >&2
}
if [ -z "${FLEETGATE_TEST_REDIS_URL:-}" ]; then start_test_redis; fi

# --- headless Chromium for the /ui screenshot test (tests/integration/test_ui_screenshot.py skips without it).
if ! command -v chromium >/dev/null 2>&1 && [ -z "${FLEETGATE_SKIP_CHROMIUM:-}" ]; then
  echo "chromium not found: installing it with apt-get (set FLEETGATE_SKIP_CHROMIUM=1 to skip)" >&2
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo -n"; fi
  { $SUDO apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 \
    || { $SUDO apt-get update >/dev/null 2>&1 \
         && $SUDO apt-get install -y --no-install-recommends chromium >/dev/null 2>&1; }; } \
    || echo "could not install chromium; the UI screenshot test will be skipped" >&2
fi
"$BIN/python" -m pytest -q -p no:cacheprovider "$@"
