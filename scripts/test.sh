#!/usr/bin/env bash
# Runs every test. Starts what the tests need (e.g. Redis) and stops it afterwards; exits non-zero on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
export PYTHONUNBUFFERED=1
"$BIN/python" -m pytest -q -p no:cacheprovider "$@"
