#!/bin/bash
# Under flock /tmp/fleetgate-live.lock, unniced: live_ag_as_seeds.sh's replay with an A/A control in the same
# run: the default, an identical copy of it (fleetgate@copy, no parameter changed), and the default plus
# active_sessions at 16 s; 3 repeats per workload seed given, contender-order seed 18 + workload seed
# -> agaab$seed.json / .md / .log.
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/src FLEETGATE_TRACES_DIR=/work/shared/traces
R=bench/results/router_compare_s18_llama
for w in "$@"; do
  timeout 900 .venv/bin/python bench/router_compare.py --engine llama --replicas 3 --workload agentic \
    --workload-load 0.08 --workload-per-replica 10 --workload-seed $w --requests 1000 \
    --tokens-scale 0.0078125 --rate-scale 8 --no-calibrate --repeats 3 --seed $((18 + w)) \
    --only fleetgate:fleetgate,fleetgate:fleetgate@copy,fleetgate:fleetgate@as16 \
    --policy-params '{"copy": {}, "as16": {"scorers": [{"type": "active_sessions", "weight": 16}]}}' \
    --logdir /tmp/s18-llama-logs/agaab$w --out $R/agaab$w.json --md $R/agaab$w.md > $R/agaab$w.log 2>&1
  echo "agaab$w rc $?"
done
