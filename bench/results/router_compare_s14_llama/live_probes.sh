#!/bin/bash
# L1 (under flock /tmp/fleetgate-live.lock, unniced): a fresh one-replica calibration and a contention probe.
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/src FLEETGATE_TRACES_DIR=/work/shared/traces
R=bench/results/router_compare_s14_llama; S=/tmp/s14-llama.cpustat; rm -f $S
C() { .venv/bin/python $R/cpustat.py $S "$1"; }
C "locked, start"
timeout 300 .venv/bin/python bench/router_compare.py --engine llama --probe-prefill --logdir /tmp/s14-llama-logs/probe \
  --out $R/probe_s14.json > $R/probe_s14.log 2>&1; echo "probe-prefill rc $?"
C "after probe-prefill"
timeout 400 .venv/bin/python bench/llama_contention.py --seconds 12 --order 1,2,3,3,2,1 \
  --out $R/contention_probe3.json > $R/contention_probe3.log 2>&1; echo "contention rc $?"
C "after contention probe"
