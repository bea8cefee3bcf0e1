#!/bin/bash
# Session 16: ag2's agentic vLLM replay again with the default's dispatch gate off beside the default and
# cache_aware (one repeat each, seed $1): is the gate what costs the default its p95/p99 there?
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/src FLEETGATE_TRACES_DIR=/work/shared/traces
R=bench/results/router_compare_s16_vllm; seed=${1:-1}
timeout 900 .venv/bin/python bench/router_compare.py --engine vllm --replicas 2 --repeats 1 --seed $seed \
  --workload agentic --workload-load 0.08 --workload-per-replica 10 --workload-seed 0 --requests 1000 \
  --tokens-scale 0.0078125 --rate-scale 6 --no-calibrate --overhead-requests 0 \
  --policy-params '{"nogate": {"gate": "off"}}' \
  --only fleetgate:fleetgate@nogate,fleetgate:fleetgate,fleetgate:cache_aware \
  --logdir /tmp/s16-vllm-logs/agng$seed --out $R/agng$seed.json --md $R/agng$seed.md > $R/agng$seed.log 2>&1
echo "agng$seed rc $?"
