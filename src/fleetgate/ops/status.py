"""The ``GET /admin/status`` document: replicas, deployments, tenants, autoscaler decisions.

Built from whatever the gateway has (fleet, SLO window, tenant reservations, autoscaler loops); every input is
passed in and read duck-typed, so tests can feed plain objects. Numbers that cannot be JSON (inf, nan) become
``null``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetgate.ops.slo import SloStats, SloTracker

if TYPE_CHECKING:
    from fleetgate.autoscaler.loop import AutoscalerLoop

_HISTORY_POINTS = 300


@dataclass(frozen=True, slots=True)
class TenantInfo:
    """What the status page shows about a configured tenant."""

    name: str
    priority: str = "interactive"
    reserved_mu_per_min: Mapping[str, float] | None = None


def _num(value: Any) -> float | None:
    if value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _stats(st: SloStats | None) -> dict[str, Any]:
    data = (st or SloStats()).to_dict()
    return {k: (_num(v) if isinstance(v, float) else v) for k, v in data.items()}


def replica_rows(fleet: Any, per_replica: Mapping[str, SloStats]) -> list[dict[str, Any]]:
    rows = []
    for deployment, replica in fleet.replicas():
        st = per_replica.get(f"{deployment.model}/{replica.name}")
        capacity = float(replica.capacity_mu_per_min)
        used = st.mu_per_min if st is not None else 0.0
        engine = replica.engine
        learned = deployment.rates.rates(replica.name)
        snap = replica.snapshot(learned)
        rows.append(
            {
                "name": replica.name,
                "deployment": deployment.model,
                "url": replica.url,
                "health": str(replica.health),
                "routable": bool(snap.routable),
                "draining": bool(replica.draining),
                "mu_load": _num(used / capacity) if capacity > 0 else None,
                "used_mu_per_min": _num(used),
                "capacity_mu_per_min": capacity,
                "inflight_requests": replica.inflight_requests,
                "inflight_mu": _num(replica.inflight_mu),
                "cache_hit_rate": _num(replica.engine_prefix_hit_rate),
                "kv_usage": None if engine is None else _num(engine.kv_usage),
                "engine_waiting": None if engine is None else _num(engine.waiting),
                "engine_running": None if engine is None else _num(engine.running),
                "completed": replica.completed,
                "failed": replica.failed,
                "ttft_p95_s": None if st is None else _num(st.ttft_p95_s),
                "requests": 0 if st is None else st.requests,
                # engine rates learned online (core.engine_rates): null until enough evidence
                "prefill_tokens_per_s": _num(learned.prefill_tokens_per_s),
                "decode_s_per_token": _num(learned.decode_s_per_token),
                "prefill_rate_source": learned.prefill_source or None,
                "prefill_tokens_per_s_timing": _num(learned.timing_prefill_tokens_per_s),
                "prefill_tokens_per_s_counters": _num(learned.counter_prefill_tokens_per_s),
                "profile_drift": _num(learned.drift),
            }
        )
    return rows


def autoscaler_rows(autoscalers: Mapping[str, AutoscalerLoop], now: float) -> list[dict[str, Any]]:
    """Each loop's recent (time, desired, ready, utilisation) history and the points where it changed."""
    out = []
    for model, loop in sorted(autoscalers.items()):
        history: list[tuple[float, int, int, float]] = list(loop.history)
        decisions = []
        prev: int | None = None
        for t, desired, ready, util in history:
            if prev is None:
                prev = ready  # the first decision changes the count the loop found
            if desired != prev:
                decisions.append(
                    {"t": t - now, "from": prev, "to": desired, "ready": ready, "utilisation": _num(util)}
                )
            prev = desired
        step = max(1, len(history) // _HISTORY_POINTS)
        recent = history[-_HISTORY_POINTS * step :][::step]
        out.append(
            {
                "deployment": model,
                "desired": loop.desired,
                "history": [
                    {"t": t - now, "desired": d, "ready": r, "utilisation": _num(u)} for t, d, r, u in recent
                ],
                "decisions": decisions[-50:],
            }
        )
    return out


def build_status(
    *,
    now: float,
    wall_time: float,
    fleet: Any,
    tracker: SloTracker,
    tenants: Iterable[TenantInfo] = (),
    autoscalers: Mapping[str, Any] | None = None,
    admission: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The whole status document (see docs/user-guide.md, "Reading the dashboard")."""
    window = tracker.window(now)
    per_tenant = window.by_tenant()
    per_deployment = window.by_deployment()
    per_replica = window.by_replica()
    known = {t.name: t for t in tenants}
    tenant_rows = []
    for name in sorted(set(known) | set(per_tenant)):
        info = known.get(name, TenantInfo(name=name))
        reserved = dict(info.reserved_mu_per_min or {})
        st = per_tenant.get(name)
        row: dict[str, Any] = {
            "name": name,
            "priority": info.priority,
            "reserved_mu_per_min": math.fsum(reserved.values()),
            "reserved_by_deployment": reserved,
        }
        row.update(_stats(st))
        if st is None:
            row["ttft_target_s"] = tracker.target_for(name)
        tenant_rows.append(row)
    deployment_rows = []
    for model, deployment in sorted(fleet.deployments.items()):
        replicas = list(deployment.replicas.values())
        cap = math.fsum(r.capacity_mu_per_min for r in replicas if r.snapshot().routable)
        sold = math.fsum((t.reserved_mu_per_min or {}).get(model, 0.0) for t in known.values())
        row = {
            "model": model,
            "replicas": len(replicas),
            "routable_replicas": sum(1 for r in replicas if r.snapshot().routable),
            "capacity_mu_per_min": cap,
            "reserved_mu_per_min": sold,
            "policy": deployment.config.routing.policy,
        }
        row.update(_stats(per_deployment.get(model)))
        deployment_rows.append(row)
    return {
        "generated_at": wall_time,
        "window_s": tracker.window_s,
        "requests_total": tracker.total,
        "replicas": replica_rows(fleet, per_replica),
        "deployments": deployment_rows,
        "tenants": tenant_rows,
        "autoscalers": autoscaler_rows(autoscalers or {}, now),
        "admission": dict(admission) if admission else None,
    }
