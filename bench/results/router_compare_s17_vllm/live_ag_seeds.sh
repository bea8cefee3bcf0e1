#!/bin/bash
# Session 17: the agentic replay on 2 vLLM CPU replicas drawn from other workload seeds (the sessions, their
# tenants and their timing change; session 16 and agr1/agrng1 used workload seed 0 only), the default and
# cache_aware once each per seed (REPEATS=2 TAG=r2: twice, files agws<seed>r2), rows and gateway logs kept. Run under flock /tmp/fleetgate-live.lock.
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/src FLEETGATE_TRACES_DIR=/work/shared/traces
R=bench/results/router_compare_s17_vllm
for ws in ${@:-1 2 3}; do
  timeout 900 .venv/bin/python bench/router_compare.py --engine vllm --replicas 2 --repeats ${REPEATS:-1} --seed $ws \
    --workload agentic --workload-load 0.08 --workload-per-replica 10 --workload-seed $ws --requests 1000 \
    --tokens-scale 0.0078125 --rate-scale 6 --no-calibrate --overhead-requests 0 --request-rows \
    --only fleetgate:fleetgate,fleetgate:cache_aware --logdir /tmp/s17-vllm-logs/ws$ws${TAG:-} \
    --out $R/agws$ws${TAG:-}.json --md $R/agws$ws${TAG:-}.md > $R/agws$ws${TAG:-}.log 2>&1
  echo "agws$ws${TAG:-} rc $?"
done
