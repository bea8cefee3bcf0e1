"""The routing defaults a user's config gets on the shipped path (``fleetgate serve --config``): the config
tree's validation and ``gateway.fleet.build_deployment``, as ``runtime.build_gateway`` calls it. The
session-10 defaults (docs/routing.md "The defaults") apply with no params, and each can be set back."""

from __future__ import annotations

from typing import Any

from fleetgate.config import parse_config
from fleetgate.core.routing.fleetgate import FleetgatePolicy
from fleetgate.gateway.fleet import build_deployment


def _policy(params: dict[str, Any] | None) -> FleetgatePolicy:
    routing: dict[str, Any] = {"policy": "fleetgate"}
    if params is not None:
        routing["params"] = params
    cfg = parse_config(
        {
            "deployments": [
                {
                    "model": "m",
                    "engine": "vllm",
                    "replicas": [{"name": "a", "url": "http://127.0.0.1:9"}],
                    "routing": routing,
                }
            ]
        }
    )
    policy = build_deployment(cfg.deployments[0]).policy
    assert isinstance(policy, FleetgatePolicy)
    return policy


def test_a_config_without_params_gets_the_session_10_defaults() -> None:
    policy = _policy(None)
    p = policy.params
    assert (p.key, p.hot_share, p.spill_max_wait_s, p.guard_exempt_ratio) == ("context", 0.25, 1.0, 0.8)
    assert (p.learned_rate_noise, p.learned_rate_scale) == (2.0, "relative")
    assert (p.tail_bound_s, p.tail_bound_keep_share, p.cached_load_bound) == (2.0, 0.5, 1.5)
    assert policy.tail is not None


def test_the_old_defaults_are_one_params_block_away() -> None:
    old = {
        "key": "prefix",
        "hot_share": 0.5,
        "spill_max_wait_s": None,
        "guard_exempt_ratio": 0.3,
        "learned_rate_noise": 1,
        "learned_rate_scale": "seconds",
        "tail_bound_s": None,
        "tail_bound_keep_share": None,
    }
    policy = _policy(old)
    p = policy.params
    assert (p.key, p.hot_share, p.spill_max_wait_s, p.guard_exempt_ratio) == ("prefix", 0.5, None, 0.3)
    assert (p.learned_rate_noise, p.learned_rate_scale, p.tail_bound_s) == (1.0, "seconds", None)
    assert policy.tail is None
