#!/bin/bash
# One locked block (under flock /tmp/fleetgate-live.lock, unniced): session 14's agentic llama replay (3
# replicas of the tiny model, ag14's setup) with the default, the default plus the active_sessions scorer at
# 0.25 s and 16 s, and cache_aware; contender-order seed $1 -> agas$1.json / .md / .log.
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/src FLEETGATE_TRACES_DIR=/work/shared/traces
R=bench/results/router_compare_s18_llama; seed=$1
timeout 900 .venv/bin/python bench/router_compare.py --engine llama --replicas 3 --workload agentic \
  --workload-load 0.08 --workload-per-replica 10 --workload-seed 0 --requests 1000 --tokens-scale 0.0078125 \
  --rate-scale 8 --no-calibrate --repeats 2 --seed $seed \
  --only fleetgate:fleetgate,fleetgate:fleetgate@as025,fleetgate:fleetgate@as16,fleetgate:cache_aware \
  --policy-params '{"as025": {"scorers": [{"type": "active_sessions", "weight": 0.25}]}, "as16": {"scorers": [{"type": "active_sessions", "weight": 16}]}}' \
  --logdir /tmp/s18-llama-logs/agas$seed --out $R/agas$seed.json --md $R/agas$seed.md > $R/agas$seed.log 2>&1
echo "agas$seed rc $?"
