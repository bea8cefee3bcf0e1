#!/bin/bash
# session-7 interleaved live matrix (s7-live)
cd /tmp/s7live/tree
export PYTHONPATH=$PWD/src FLEETGATE_TRACES_DIR=/work/shared/traces
OUT=/work/wt/s7-live/bench/results/router_compare_llama_s7
C=fleetgate:fleetgate,fleetgate:cache_aware,fleetgate:round_robin,fleetgate:least_requests,fleetgate:p2c,sglang-router:cache_aware,vllm-router:cache_aware
MC=$FLEETGATE_TRACES_DIR/mooncake/conversation_trace.jsonl
AZ=$FLEETGATE_TRACES_DIR/azure-2023/AzureLLMInferenceTrace_conv.csv
run() {  # name trace requests tokens-scale rate
  echo "=== $1 start $(date -u +%H:%M:%S) $(uptime)" >> $OUT/matrix.log
  /work/main/.venv/bin/python bench/router_compare.py --engine llama --replicas 3 --only $C --repeats 3 --seed 7 \
    --trace $2 --requests $3 --tokens-scale $4 --rate-scale $5 --no-calibrate --watch-gateway 2 \
    --logdir /tmp/s7live/logs-$1 --out $OUT/$1.json --md $OUT/$1.md 2> $OUT/$1.log > /dev/null
  rc=$?; echo "=== $1 end $(date -u +%H:%M:%S) rc=$rc $(uptime)" >> $OUT/matrix.log
}
for r in "$@"; do
  case $r in
    mooncake_x1.5) run mooncake_x1.5 $MC 200 0.0078125 1.5 ;;
    mooncake_x1)   run mooncake_x1 $MC 140 0.0078125 1 ;;
    azure_x1)      run azure_x1 $AZ 150 0.0625 1 ;;
    azure_x2)      run azure_x2 $AZ 340 0.0625 2 ;;
  esac
done
