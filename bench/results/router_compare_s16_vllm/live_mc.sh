#!/bin/bash
# Session 16: the Mooncake replay live on 2 vLLM CPU replicas of the tiny model (router_compare.py --engine vllm:
# one CPU per replica, block 32, 1,024 KV blocks each), at rate x1.5 (round robin at x2 was 7x its unloaded p95 in a first try),
# then five contenders twice each (order shuffled by seed $1). Run under flock /tmp/fleetgate-live.lock, unniced.
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/src FLEETGATE_TRACES_DIR=/work/shared/traces
R=bench/results/router_compare_s16_vllm; seed=${1:-1}
CONT=${CONT:-fleetgate:fleetgate,fleetgate:cache_aware,fleetgate:least_requests,sglang-router:cache_aware,vllm-router:cache_aware}
timeout 1500 .venv/bin/python bench/router_compare.py --engine vllm --replicas 2 --repeats 2 --seed $seed \
  --trace /work/shared/traces/mooncake/conversation_trace.jsonl --requests 200 --tokens-scale 0.0078125 \
  --rate-scale 1.5 --no-calibrate --overhead-requests 0 \
  --only $CONT --logdir /tmp/s16-vllm-logs/mc$seed --out $R/mc$seed.json --md $R/mc$seed.md > $R/mc$seed.log 2>&1
echo "mc$seed rc $?"
