#!/bin/bash
# One locked block (run under flock /tmp/fleetgate-live.lock, unniced): the Mooncake x1.5 llama replay of
# mc10 / mc13 (session 13's step 4 command) with seed $1 -> mc$1.json / .md.
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/src FLEETGATE_TRACES_DIR=/work/shared/traces
R=bench/results/router_compare_s14_llama; S=/tmp/s14-llama.cpustat; rm -f $S; seed=$1
C() { .venv/bin/python $R/cpustat.py $S "$1"; }
C "locked, mc$seed start"
timeout 700 .venv/bin/python bench/router_compare.py --engine llama --replicas 3 --repeats 2 \
  --seed $seed --no-calibrate --trace /work/shared/traces/mooncake/conversation_trace.jsonl --requests 200 \
  --tokens-scale 0.0078125 --rate-scale 1.5 \
  --only fleetgate:fleetgate,fleetgate:cache_aware,fleetgate:least_requests,fleetgate:round_robin \
  --logdir /tmp/s14-llama-logs/mc$seed --out $R/mc$seed.json --md $R/mc$seed.md > $R/mc$seed.log 2>&1
echo "mc$seed rc $?"
C "mc$seed end"
