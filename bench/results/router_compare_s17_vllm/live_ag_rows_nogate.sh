#!/bin/bash
# Session 17: where the default's agentic tail on vLLM comes from. The session 16 agentic replay (20 sessions,
# 217 requests, 2 vLLM CPU replicas of the tiny model, rate x6), the default with the dispatch gate off, the default and cache_aware, twice each
# (order by seed $1), with every request's row kept (--request-rows). Run under flock /tmp/fleetgate-live.lock.
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/src FLEETGATE_TRACES_DIR=/work/shared/traces
R=bench/results/router_compare_s17_vllm; seed=${1:-1}
CONT=fleetgate:fleetgate@nogate,fleetgate:fleetgate,fleetgate:cache_aware
timeout 1500 .venv/bin/python bench/router_compare.py --engine vllm --replicas 2 --repeats 2 --seed $seed \
  --workload agentic --workload-load 0.08 --workload-per-replica 10 --workload-seed 0 --requests 1000 \
  --tokens-scale 0.0078125 --rate-scale 6 --no-calibrate --overhead-requests 0 --request-rows --policy-params '{"nogate": {"gate": "off"}}' \
  --only $CONT --logdir /tmp/s17-vllm-logs/ag$seed --out $R/agrng$seed.json --md $R/agrng$seed.md > $R/agrng$seed.log 2>&1
echo "agrng$seed rc $?"
