#!/bin/bash
# Re-predict every kept llama live run (session 11's table) with the s11 calibration.
# usage: predict_all.sh TAG [extra router_compare_sim.py args...]
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/src FLEETGATE_TRACES_DIR=/work/shared/traces
tag=$1; shift
out=bench/results/router_compare_s13_contention
for run in router_compare_s11_llama/mc10 router_compare_s10_aglive/l1 router_compare_s10_aglive/l2 \
           router_compare_llama_s7/mooncake_x1 router_compare_llama_s7/mooncake_x1.5 \
           router_compare_llama_s7/azure_x1 router_compare_llama_s7/azure_x2; do
  name=$(echo "$run" | tr / _)
  echo "== $run $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  nice -n 19 .venv/bin/python bench/router_compare_sim.py --from-live bench/results/$run.json \
    --engine-model llama-server --llama-calibration bench/results/router_compare_s11_llama/probe.json \
    --send-jitter 16 "$@" > $out/pred_${tag}_$name.txt 2> $out/pred_${tag}_$name.err
  echo "rc $? $(date -u +%T)"
done
