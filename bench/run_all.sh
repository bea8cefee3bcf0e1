#!/usr/bin/env bash
# Runs the benchmarks one after another; each prints its result and the line to paste into docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "see docs/benchmarks.md for the individual benchmark commands"
