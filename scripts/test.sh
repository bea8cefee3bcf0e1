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
  redis-server --bind 127.0.0.1 --port "$port" --databases 32 --save "" --appendonly no --dir "$dir" \
    --daemonize no >"$dir/redis.log" 2>&1 &
  REDIS_PID=$!
  trap 'kill "$REDIS_PID" 2>/dev/null || true; wait "$REDIS_PID" 2>/dev/null || true; rm -rf "'"$dir"'"' EXIT
  for _ in $(seq 1 50); do
    if "$BIN/python" -c "import socket,sys; socket.create_connection(('127.0.0.1', $port), 0.2)" 2>/dev/null; then
      export FLEETGATE_TEST_REDIS_URL="redis://127.0.0.1:$port/0"
      OWN_REDIS=1
      return 0
    fi
    sleep 0.1
  done
  echo "redis-server did not start; Redis tests will be skipped" >&2
}
OWN_REDIS=0  # 1: the Redis below is this run's own, so each parallel worker gets its own database of it
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

# --- the suite: tests not marked `serial` in FLEETGATE_TEST_WORKERS pytest-xdist workers (default 4: most
# integration tests wait on timers, health verdicts and simulated latency, not on the CPU), then the `serial`
# ones (assertions on measured timings, listed in tests/conftest.py) one at a time with nothing beside them.
# FLEETGATE_TEST_WORKERS=1 runs everything in one serial pytest, as before. Arguments go to both phases.
WORKERS="${FLEETGATE_TEST_WORKERS:-4}"
LOGS=$(mktemp -d)
run_phase() {  # name, pytest arguments...: runs pytest, keeps its output for the summary, sets PHASE_RC
  local name=$1; shift
  local t0=$SECONDS
  echo "== tests, $name: pytest $*" >&2
  set +e
  # --durations: the slowest tests of each phase, printed (the warm-run target is 12 minutes in all)
  "$BIN/python" -m pytest -q -p no:cacheprovider --durations=12 --durations-min=5 "${PYTEST_EXTRA[@]}" "$@" \
    2>&1 | tee "$LOGS/$name.log"
  PHASE_RC=${PIPESTATUS[0]}
  set -e
  echo "== tests, $name: exit $PHASE_RC in $((SECONDS - t0)) s" >&2
}
for arg in "$@"; do  # a marker expression of the caller's own would replace the phases' `-m`: one run
  case $arg in -m|-m*|--markexpr*) echo "== tests: -m given, running serially" >&2; WORKERS=1 ;; esac
done
TESTS_T0=$SECONDS
rc=0
if [ "$WORKERS" -le 1 ]; then
  run_phase serial-all "$@"
  rc=$PHASE_RC
else
  export FLEETGATE_TEST_REDIS_PER_WORKER=${FLEETGATE_TEST_REDIS_PER_WORKER:-$OWN_REDIS}
  run_phase "parallel-$WORKERS-workers" -n "$WORKERS" --dist loadfile --no-loadscope-reorder -m "not serial" "$@"
  rc=$PHASE_RC
  case $rc in  # 0 passed, 1 failures, 5 nothing selected: go on; 2-4 (interrupted, usage error): stop
    0|1|5)
      run_phase serial -m serial "$@"
      # 5 (no test selected) counts only when neither phase selected any test, e.g. PYTEST_ARGS=one/file.py
      if [ "$rc" = 5 ]; then rc=$PHASE_RC; elif [ "$rc" = 0 ] && [ "$PHASE_RC" != 5 ]; then rc=$PHASE_RC; fi ;;
  esac
fi
if grep -hE '^(FAILED|ERROR) tests/' "$LOGS"/*.log >"$LOGS/failures" 2>/dev/null; then
  echo "== failures in all phases ($(wc -l <"$LOGS/failures")):" >&2
  cat "$LOGS/failures" >&2
fi
rm -rf "$LOGS"
echo "== tests took $((SECONDS - TESTS_T0)) s (whole make test step: $SECONDS s)" >&2
exit "$rc"
