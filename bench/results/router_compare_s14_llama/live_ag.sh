#!/bin/bash
# One locked block (under flock /tmp/fleetgate-live.lock, unniced): session 10's agentic llama replay (l2's
# setup, --cache-ram 128) with the four fleetgate contenders, seed $1 -> ag$1.json / .md.
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/src FLEETGATE_TRACES_DIR=/work/shared/traces
R=bench/results/router_compare_s14_llama; S=/tmp/s14-llama.cpustat; rm -f $S; seed=$1
C() { .venv/bin/python $R/cpustat.py $S "$1"; }
C "locked, ag$seed start"
timeout 700 .venv/bin/python bench/router_compare.py --engine llama --replicas 3 --workload agentic \
  --workload-load 0.08 --workload-per-replica 10 --workload-seed 0 --requests 1000 --tokens-scale 0.0078125 \
  --rate-scale 8 --no-calibrate --repeats 2 --seed $seed \
  --only fleetgate:fleetgate,fleetgate:cache_aware,fleetgate:least_requests,fleetgate:round_robin \
  --logdir /tmp/s14-llama-logs/ag$seed --out $R/ag$seed.json --md $R/ag$seed.md > $R/ag$seed.log 2>&1
echo "ag$seed rc $?"
C "ag$seed end"
