"""Mooncake's published routing order on its conversation trace (16 replicas), in the simulator.

FAST'25 reports mean TTFT random 19.65 s > load balancing 5.27 s > cache-aware 3.58 s (> global cache-aware
3.07 s). The same order must hold here, with fleetgate's default policy best. Runs the full trace (~15 s).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetgate.sim.runner import SimOptions, run_des
from fleetgate.sim.traces import load_trace


@pytest.mark.slow
def test_mooncake_ordering_random_lb_cache_aware_fleetgate(mooncake_path: Path) -> None:
    trace = load_trace(mooncake_path)
    mean = {}
    for policy in ("random", "least_requests", "cache_aware", "fleetgate"):
        opts = SimOptions(trace=str(mooncake_path), policy=policy, replicas=16, profile="llama2-70b-h100-tp4")
        s = run_des(opts, trace=trace).summary
        assert s["completed"] == 12031
        mean[policy] = s["ttft_mean_s"]
    assert mean["random"] > mean["least_requests"] > mean["cache_aware"] > mean["fleetgate"], mean
