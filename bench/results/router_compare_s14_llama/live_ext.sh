#!/bin/bash
# One locked block (under flock /tmp/fleetgate-live.lock, unniced): the mc14/mc15 Mooncake x1.5 llama replay and
# the ag14 agentic llama replay again, now with the PyPI routers (~/.cache/fleetgate/venv-routers) beside the
# default, seed $1 -> mcx$1.json / agx$1.json (+ .md, .log).
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/src FLEETGATE_TRACES_DIR=/work/shared/traces
R=bench/results/router_compare_s14_llama; S=/tmp/s14-ext.cpustat; rm -f $S; seed=$1
CONT=fleetgate:fleetgate,sglang-router:cache_aware,vllm-router:cache_aware
C() { .venv/bin/python $R/cpustat.py $S "$1"; }
C "locked, mcx$seed start"
timeout 500 .venv/bin/python bench/router_compare.py --engine llama --replicas 3 --repeats 2 \
  --seed $seed --no-calibrate --trace /work/shared/traces/mooncake/conversation_trace.jsonl --requests 200 \
  --tokens-scale 0.0078125 --rate-scale 1.5 --only $CONT \
  --logdir /tmp/s14-ext-logs/mcx$seed --out $R/mcx$seed.json --md $R/mcx$seed.md > $R/mcx$seed.log 2>&1
echo "mcx$seed rc $?"
C "mcx$seed end / agx$seed start"
timeout 500 .venv/bin/python bench/router_compare.py --engine llama --replicas 3 --workload agentic \
  --workload-load 0.08 --workload-per-replica 10 --workload-seed 0 --requests 1000 --tokens-scale 0.0078125 \
  --rate-scale 8 --no-calibrate --repeats 2 --seed $seed --only $CONT \
  --logdir /tmp/s14-ext-logs/agx$seed --out $R/agx$seed.json --md $R/agx$seed.md > $R/agx$seed.log 2>&1
echo "agx$seed rc $?"
C "agx$seed end"
