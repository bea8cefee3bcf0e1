#!/bin/bash
# Session 16: the agentic workload (bench/workloads, as session_affinity.py builds it for 2 replicas: 20
# sessions, 217 requests) live on 2 vLLM CPU replicas of the tiny model, rate x6, five contenders twice each
# (order shuffled by seed $1). Run under flock /tmp/fleetgate-live.lock, unniced.
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/src FLEETGATE_TRACES_DIR=/work/shared/traces
R=bench/results/router_compare_s16_vllm; seed=${1:-1}
CONT=fleetgate:fleetgate,fleetgate:cache_aware,fleetgate:least_requests,sglang-router:cache_aware,vllm-router:cache_aware
timeout 1500 .venv/bin/python bench/router_compare.py --engine vllm --replicas 2 --repeats 2 --seed $seed \
  --workload agentic --workload-load 0.08 --workload-per-replica 10 --workload-seed 0 --requests 1000 \
  --tokens-scale 0.0078125 --rate-scale 6 --no-calibrate --overhead-requests 0 \
  --only $CONT --logdir /tmp/s16-vllm-logs/ag$seed --out $R/ag$seed.json --md $R/ag$seed.md > $R/ag$seed.log 2>&1
echo "ag$seed rc $?"
