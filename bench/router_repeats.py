"""Interleaved, repeated contenders for ``router_compare.py --repeats N``, robust to drifting machine load.

Run one after another for minutes each, contenders meet different machines (on a shared 2-core VM the load
average moved 4.5-15 within one session-6 matrix, and a repeat moved a p95 ratio by 3.4x). Here every repeat
runs each contender once in an order shuffled per repeat (seeded), so drift hits all of them alike over the
repeats; each block records the machine's load average before and after. Per contender the summary is the
median over repeats of each block's p50 / p95 / p99 and hit rate, and fleetgate's default against every
other contender is a *paired* ratio per repeat (the two ran minutes apart, not a matrix apart) with its
median. ``GatewayWatch`` samples a fleetgate gateway's ``/metrics`` during a block: the per-replica learned
prefill rate and requests finished, to see whether learned-rate spread steers the default's traffic.
"""

from __future__ import annotations

import itertools
import random
import statistics
import threading
import time
import urllib.request
from collections.abc import Sequence
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

OURS = "fleetgate:fleetgate"


def schedule(contenders: Sequence[str], repeats: int, seed: int) -> list[tuple[int, str]]:
    """(repeat, contender) blocks: the given order for one repeat, else shuffled per repeat (seeded)."""
    if repeats <= 1:
        return [(0, c) for c in contenders]
    rng = random.Random(seed)
    out: list[tuple[int, str]] = []
    for rep in range(repeats):
        order = list(contenders)
        rng.shuffle(order)
        out += [(rep, c) for c in order]
    return out


class GatewayWatch:
    """Samples a fleetgate gateway's ``/metrics`` every ``interval_s`` in a thread: per replica the learned
    prefill rate (``fleetgate_engine_prefill_tokens_per_second``), requests finished and in flight."""

    def __init__(self, url: str, interval_s: float) -> None:
        self.url, self.interval_s = url, interval_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._t0 = time.monotonic()

    def start(self) -> GatewayWatch:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._thread.join(10)
        return self.samples

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                with urllib.request.urlopen(self.url, timeout=3) as resp:
                    text = resp.read().decode()
            except OSError:
                continue
            self.samples.append({"t_s": round(time.monotonic() - self._t0, 2), **parse_gateway(text)})


def parse_gateway(text: str) -> dict[str, dict[str, float]]:
    rates: dict[str, float] = {}
    done: dict[str, float] = {}
    inflight: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            rep = s.labels.get("replica")
            if rep is None:
                continue
            if s.name == "fleetgate_engine_prefill_tokens_per_second":
                rates[rep] = s.value
            elif s.name == "fleetgate_requests_total":
                done[rep] = done.get(rep, 0.0) + s.value
            elif s.name == "fleetgate_inflight_requests":
                inflight[rep] = s.value
    return {"prefill_tokens_per_s": rates, "requests": done, "inflight": inflight}


CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_times() -> list[float]:
    """The machine's CPU time so far by kind (``/proc/stat``'s ``cpu`` line; empty where there is none)."""
    try:
        with open("/proc/stat") as fh:
            return [float(x) for x in fh.readline().split()[1 : 1 + len(CPU_FIELDS)]]
    except (OSError, ValueError):
        return []


def cpu_shares(before: Sequence[float], after: Sequence[float]) -> dict[str, float] | None:
    """Shares of the machine's CPU time between two ``cpu_times`` readings. Other sessions run their heavy
    work under ``nice``, so ``nice`` is about what they took from a block (the load average counts this
    run's own replicas and router too)."""
    d = [b - a for a, b in zip(before, after, strict=False)]
    total = sum(d)
    return {k: round(v / total, 3) for k, v in zip(CPU_FIELDS, d, strict=False)} if total > 0 else None


def block_record(rep: dict[str, Any], **info: Any) -> dict[str, Any]:
    """What one block keeps (the full replay report is too big to keep 80 of)."""
    llama = rep.get("llama_cache") or {}
    return {
        **info,
        "ttft_s": rep["ttft_s"],
        "e2e_p95_s": rep["e2e_s"]["p95"],
        "prefix_cache_hit_rate": rep.get("prefix_cache_hit_rate"),
        "requests": rep["requests"],
        "ok": rep.get("ok"),
        "errors": rep["errors"],
        "error_kinds": rep.get("error_kinds"),
        "prompt_tokens": rep.get("prompt_tokens"),
        "load_max_over_mean_window": rep.get("load_max_over_mean_window"),
        "load_windows": rep.get("load_windows"),
        "run_wall_s": rep.get("run_wall_s"),
        "engines_prompt": [
            None if e is None else {k: e.get(k) for k in ENGINE_COUNTERS} for e in llama.get("engines", [])
        ],
        **({"gateway_watch": rep["gateway_watch"]} if "gateway_watch" in rep else {}),
        **({"request_rows": rep["request_rows"]} if "request_rows" in rep else {}),
        **({"router_counters": rep["router_counters"]} if rep.get("router_counters") else {}),
    }


#: A llama-server replica's own counters kept per block (prompt and decode work: a record to check an engine
#: model's calibration against).
ENGINE_COUNTERS = (
    "cached", "evaluated", "prompt_seconds_total", "tokens_predicted_total", "tokens_predicted_seconds_total",
    "n_decode_total", "n_busy_slots_per_decode",
)  # fmt: skip


def _median(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def summarize(blocks: Sequence[dict[str, Any]], ours: str = OURS) -> dict[str, Any]:
    """Per contender the medians over repeats; fleetgate's paired ratios per repeat; the acceptance row."""
    ok = [b for b in blocks if "failed" not in b]
    names = list(dict.fromkeys(b["contender"] for b in blocks))
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        mine = [b for b in ok if b["contender"] == name]
        if not mine:
            none = {"p50": None, "p95": None, "p99": None}
            results[name] = {"failed": "every block failed", "ttft_s": none}
            continue
        results[name] = {
            "ttft_s": {q: _median([b["ttft_s"][q] for b in mine]) for q in ("p50", "p95", "p99")},
            "prefix_cache_hit_rate": _median([b["prefix_cache_hit_rate"] for b in mine]),
            "load_max_over_mean_window": _median([b["load_max_over_mean_window"] for b in mine]),
            "per_repeat_p95_s": [b["ttft_s"]["p95"] for b in mine],
            "repeats": len(mine),
            "requests": mine[0]["requests"],
            "ok": min(b["ok"] or 0 for b in mine),
            "errors": max(b["errors"] for b in mine),
            "prompt_tokens": mine[0]["prompt_tokens"],
        }
    by_rep: dict[int, dict[str, dict[str, Any]]] = {}
    for b in ok:
        by_rep.setdefault(b["repeat"], {})[b["contender"]] = b
    paired: dict[str, dict[str, Any]] = {}
    for name in names:
        if name == ours:
            continue
        row: dict[str, Any] = {}
        for q in ("p50", "p95", "p99"):
            row[f"{q}_ratios"] = [
                r[ours]["ttft_s"][q] / r[name]["ttft_s"][q]
                for _, r in sorted(by_rep.items())
                if ours in r and name in r and r[name]["ttft_s"][q]
            ]
            row[f"{q}_ratio_median"] = _median(row[f"{q}_ratios"])
        hits = [
            r[ours]["prefix_cache_hit_rate"] / r[name]["prefix_cache_hit_rate"]
            for _, r in sorted(by_rep.items())
            if ours in r and name in r and r[name].get("prefix_cache_hit_rate")
        ]
        row["hit_ratios"], row["hit_ratio_median"] = hits, _median(hits)
        paired[name] = row
    return {"results": results, "paired": paired, "targets": targets(results, paired, ours)}


def targets(
    results: dict[str, dict[str, Any]], paired: dict[str, dict[str, Any]], ours: str = OURS
) -> dict[str, Any]:
    """The acceptance row on the paired medians: default/other p95 <= 0.8 and hit >= 0.9 for every other
    contender (the binding other is the one with the largest p95 ratio, the smallest hit ratio)."""
    p95 = {k: v["p95_ratio_median"] for k, v in paired.items() if v["p95_ratio_median"] is not None}
    hit = {k: v["hit_ratio_median"] for k, v in paired.items() if v["hit_ratio_median"] is not None}
    if ours not in results or not p95:
        return {}
    worst_p95 = max(p95, key=lambda k: p95[k])
    worst_hit = min(hit, key=lambda k: hit[k]) if hit else None
    med = {k: v["ttft_s"]["p95"] for k, v in results.items() if k != ours and v["ttft_s"]["p95"] is not None}
    best_med = min(med, key=lambda k: med[k])
    my_med = results[ours]["ttft_s"]["p95"]
    return {
        "paired_p95_ratio_vs_worst": [worst_p95, p95[worst_p95]],
        "paired_hit_ratio_vs_worst": [worst_hit, hit[worst_hit]] if worst_hit else None,
        "median_p95_ratio_vs_best": [best_med, my_med / med[best_med] if med[best_med] else None],
        "p95_target_met": p95[worst_p95] <= 0.8,
        "hit_target_met": worst_hit is None or hit[worst_hit] >= 0.9,
    }


def markdown(blocks: Sequence[dict[str, Any]], summary: dict[str, Any], ours: str = OURS) -> str:
    def ms(v: Any) -> str:
        return "-" if v is None else f"{v * 1000:.0f}"

    def r2(v: Any) -> str:
        return "-" if v is None else f"{v:.2f}"

    res, paired = summary["results"], summary["paired"]
    lines = [
        "| router | median TTFT p50 / p95 / p99 ms | p95 per repeat ms | median hit | "
        f"{ours.split(':')[1]}/this p95 per repeat | median paired p95 / p99 | median paired hit | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in res.items():
        t, p = r["ttft_s"], paired.get(name, {})
        per = " ".join(ms(x) for x in r.get("per_repeat_p95_s", []))
        hit = r.get("prefix_cache_hit_rate")
        lines.append(
            f"| {name} | {ms(t['p50'])} / {ms(t['p95'])} / {ms(t['p99'])} | {per} "
            f"| {'-' if hit is None else f'{hit:.3f}'} | {' '.join(r2(x) for x in p.get('p95_ratios', []))} "
            f"| {r2(p.get('p95_ratio_median'))} / {r2(p.get('p99_ratio_median'))} "
            f"| {r2(p.get('hit_ratio_median'))} | {r.get('errors', '-')} |"
        )
    lines += [
        "",
        "| repeat | # | router | start UTC | load avg before->after | CPU user / nice / idle | "
        "p50 / p95 / p99 ms | hit | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for b in blocks:
        la = b.get("load_avg_1min") or [None, None]
        t = b.get("ttft_s") or {"p50": None, "p95": None, "p99": None}
        hit = b.get("prefix_cache_hit_rate")
        cpu = b.get("cpu_shares") or {}
        shares = " / ".join(r2(cpu.get(k)) for k in ("user", "nice", "idle"))
        lines.append(
            f"| {b['repeat']} | {b['position']} | {b['contender']} | {b.get('start_utc', '-')} "
            f"| {r2(la[0])}->{r2(la[1])} | {shares} | {ms(t['p50'])} / {ms(t['p95'])} / {ms(t['p99'])} "
            f"| {'-' if hit is None else f'{hit:.3f}'} | {b.get('run_wall_s', b.get('failed', '-'))} |"
        )
    return "\n".join(lines)


def rate_skew(block: dict[str, Any]) -> dict[str, Any] | None:
    """Does the learned-rate spread steer the traffic? From one block's ``gateway_watch`` samples: per
    sampling interval the requests each replica finished and the learned rates at its start; the share of
    requests that went to the replica with the highest learned rate (1/n for rate-blind routing), the
    learned rates' max/min spread, the totals per replica, when each replica first had a rate and what each
    had finished by the time all had one."""
    samples = [s for s in block.get("gateway_watch") or [] if s["requests"]]
    if len(samples) < 2:
        return None
    to_fastest = total = 0.0
    spreads: list[float] = []
    for a, b in itertools.pairwise(samples):
        rates = a["prefill_tokens_per_s"]
        done = {r: b["requests"].get(r, 0.0) - a["requests"].get(r, 0.0) for r in b["requests"]}
        if len(rates) < len(b["requests"]) or not sum(done.values()):
            continue  # not every replica has a learned rate yet
        spreads.append(max(rates.values()) / min(rates.values()))
        to_fastest += done.get(max(rates, key=lambda r: rates[r]), 0.0)
        total += sum(done.values())
    last = samples[-1]
    first: dict[str, float] = {}  # when each replica first had a learned rate
    for smp in samples:
        for r in smp["prefill_tokens_per_s"]:
            first.setdefault(r, smp["t_s"])
    complete = next((s for s in samples if len(s["prefill_tokens_per_s"]) >= len(last["requests"])), last)
    return {
        "contender": block["contender"],
        "repeat": block["repeat"],
        "share_to_fastest_learned": to_fastest / total if total else None,
        "rate_spread_median": _median(spreads),
        "requests_per_replica": dict(sorted(last["requests"].items())),
        "final_rates": {k: round(v) for k, v in sorted(last["prefill_tokens_per_s"].items())},
        "first_rate_t_s": dict(sorted(first.items())),
        "requests_before_all_rates": dict(sorted(complete["requests"].items())),
        "p95_s": block["ttft_s"]["p95"],
    }


if __name__ == "__main__":  # python bench/router_repeats.py RESULT.json...: the learned-rate skew per block
    import json
    import sys

    for path in sys.argv[1:]:
        doc = json.loads(open(path).read())  # noqa: SIM115
        for blk in doc.get("blocks", []):
            row = rate_skew(blk)
            if row:
                print(path, json.dumps(row))
