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
# --- real engines (docs/real-engines.md): llama-server and the tiny model are built once and cached under
# ~/.cache/fleetgate (fresh: about 5-6 min on 2 idle cores; warm: a few seconds). Tests that need them FAIL
# instead of skipping when they are missing (tests/real_engines.py reads FLEETGATE_REQUIRE_REAL_ENGINES).
# The vLLM CPU build (a 3.4 GB download) stays out unless FLEETGATE_TEST_VLLM=1; `make test-vllm` runs it.
build_step() {
  local what=$1; shift
  local t0=$SECONDS
  echo "== [real engines] $what: $*" >&2
  "$@" 2>&1 | sed -u "s/^/   [$what] /" >&2
  echo "== [real engines] $what ready in $((SECONDS - t0)) s" >&2
}
ENGINES_T0=$SECONDS
build_step tiny-model bash scripts/build_tiny_model.sh
build_step llama-server bash scripts/build_llama_server.sh
REQUIRE=llama
PYTEST_EXTRA=()
if [ "${FLEETGATE_TEST_VLLM:-}" = 1 ]; then
  build_step vllm-cpu bash scripts/build_vllm_cpu.sh
  REQUIRE=llama,vllm
else
  echo "== [real engines] vLLM CPU tests not in this run (FLEETGATE_TEST_VLLM=1 adds them; or make test-vllm)" >&2
  PYTEST_EXTRA+=(--ignore=tests/integration/test_vllm_engine.py)
fi
echo "== [real engines] all built in $((SECONDS - ENGINES_T0)) s; required: $REQUIRE" >&2
export FLEETGATE_REQUIRE_REAL_ENGINES="$REQUIRE"

# Bytecode written once, under ~/.cache/fleetgate/pycache (never into the repo), and read by every engine and
# gateway process the tests start: where PYTHONDONTWRITEBYTECODE=1 is set, each of those processes compiled
# its ~150 fleetgate modules from source (~0.35 s more per gateway start, ~0.1 s per engine, at load 6).
export PYTHONPYCACHEPREFIX="${FLEETGATE_CACHE:-$HOME/.cache/fleetgate}/pycache"
unset PYTHONDONTWRITEBYTECODE

TESTS_T0=$SECONDS
rc=0
"$BIN/python" -m pytest -q -p no:cacheprovider "${PYTEST_EXTRA[@]}" "$@" || rc=$?
echo "== tests took $((SECONDS - TESTS_T0)) s (whole make test step: $SECONDS s)" >&2
exit "$rc"
