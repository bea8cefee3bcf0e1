#!/bin/bash
# Predict a live llama run (router_compare_sim.py --from-live) with session 11's model and calibration,
# 16 jitter draws, vllm-router as its least-in-flight fallback, and the two outside routers simulated beside
# the live contenders (--variants: their ratio to the default is in the draws table even when the live run
# does not have them).
# usage: predict.sh TAG LIVE.json [extra router_compare_sim.py args...]  ->  pred_TAG.txt / .err
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/src FLEETGATE_TRACES_DIR=/work/shared/traces
tag=$1; run=$2; shift 2
out=bench/results/router_compare_s14_llama
echo "== $tag $run $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
nice -n 19 .venv/bin/python bench/router_compare_sim.py --from-live "$run" \
  --engine-model llama-server --llama-calibration bench/results/router_compare_s11_llama/probe.json \
  --send-jitter 16 --vllm-model least_load --variants sglang_cache_aware,sglang_cache_aware@vllm_least_load \
  "$@" > $out/pred_$tag.txt 2> $out/pred_$tag.err
echo "rc $? $tag $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
