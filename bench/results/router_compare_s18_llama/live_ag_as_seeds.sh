#!/bin/bash
# Under flock /tmp/fleetgate-live.lock, unniced: live_ag_as.sh's replay for each workload seed given
# (agentic generator seed), the default, the default plus active_sessions at 16 s, and cache_aware, 3 repeats,
# contender-order seed 18 + workload seed -> ${TAG:-agasw}$seed.json / .md / .log. agasw1-2 ran at 1a923b0, whose
# scorer found no next turn in these prompts (an A/A run); TAG=agasf ... 0 1 at f9037c2.
set -u
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/src FLEETGATE_TRACES_DIR=/work/shared/traces
R=bench/results/router_compare_s18_llama; T=${TAG:-agasw}
for w in "$@"; do
  timeout 900 .venv/bin/python bench/router_compare.py --engine llama --replicas 3 --workload agentic \
    --workload-load 0.08 --workload-per-replica 10 --workload-seed $w --requests 1000 \
    --tokens-scale 0.0078125 --rate-scale 8 --no-calibrate --repeats 3 --seed $((18 + w)) \
    --only fleetgate:fleetgate,fleetgate:fleetgate@as16,fleetgate:cache_aware \
    --policy-params '{"as16": {"scorers": [{"type": "active_sessions", "weight": 16}]}}' \
    --logdir /tmp/s18-llama-logs/$T$w --out $R/$T$w.json --md $R/$T$w.md > $R/$T$w.log 2>&1
  echo "$T$w rc $?"
done
