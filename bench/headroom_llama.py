"""Latency-headroom admission on real llama.cpp replicas: ``examples/tenants.yaml``'s tenants and admission,
its deployment pointed at two ``llama-server`` replicas (tiny model, 4 slots, 1 thread each) instead of
simulated engines; gold paced and streamed, free as closed-loop streaming clients from another process
(``bench/noisy_neighbour.py``'s phases A, B, C). Run in the default configuration and with
``admission.latency_headroom.enabled: false``, side by side. llama.cpp takes no request priority, so only the
gate acts.

Run: ``.venv/bin/python bench/headroom_llama.py --phase-s 30`` (needs the llama.cpp build of
docs/real-engines.md; about 4 minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import noisy_neighbour as nn  # bench/ is the script's directory, so on sys.path
import yaml

from fleetgate.engines.llama import (
    EngineProcess,
    default_hf_model,
    start_llama_replicas,
)

ROOT = Path(__file__).resolve().parents[1]


def _config(urls: list[str], model: str, workdir: Path) -> Path:
    cfg: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "tenants.yaml").read_text())
    dep = cfg["deployments"][0]
    dep.pop("provider", None)
    dep.update(
        model=model,
        engine="llamacpp",
        tokenizer=str(default_hf_model()),
        replicas=[{"name": f"r{i}", "url": u} for i, u in enumerate(urls)],
    )
    assert model == dep["model"] == "fleetgate-sim"  # the tenants' reservations name it
    path = workdir / "tenants-llama.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


async def _main(args: argparse.Namespace) -> int:
    procs: list[EngineProcess] = []
    with tempfile.TemporaryDirectory(prefix="fleetgate-headroom-llama-") as tmp:
        workdir = Path(tmp)
        try:
            procs = start_llama_replicas(
                2, alias=nn.MODEL, parallel=4, ctx_size=8192, threads=1, ignore_eos=True, timeout=60
            )
            params = nn.BenchParams(
                config=str(_config([p.url for p in procs], nn.MODEL, workdir)),
                gold_key="sk-gold-demo",
                free_key="sk-free-demo",
                admin_key="sk-admin-demo",
                gold_rate_per_s=args.gold_rate,
                gold_prompt_tokens=300,
                gold_max_tokens=32,
                flood_concurrency=args.flood_concurrency,
                free_max_tokens=args.free_max_tokens,
                free_stream=True,
                phase_s=args.phase_s,
                warmup_s=3.0,
                gold_idle_phase_s=args.phase_s / 2,
                drain_timeout_s=90.0,
                engine_priority=None,
            )
            for name, p in (("default", params), ("old", replace(params, latency_headroom=False))):
                (workdir / name).mkdir()
                res = await nn.run_benchmark(p, workdir / name)
                lines = [ln for ln in nn.report(res).splitlines() if not ln.startswith(("slowest", "system"))]
                print(f"[{name}]\n" + "\n".join(lines), flush=True)
                latency = (res.get("latency_end_of_B") or {}).get(nn.MODEL) or {}
                print(f"gate at the end of B: limit {latency.get('best_effort_limit')},"
                      f" decisions {latency.get('decisions')}\n", flush=True)  # fmt: skip
        finally:
            for proc in procs:
                proc.stop()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--phase-s", type=float, default=30.0)
    ap.add_argument("--gold-rate", type=float, default=1.0)
    ap.add_argument("--flood-concurrency", type=int, default=24)
    ap.add_argument("--free-max-tokens", type=int, default=256)
    return asyncio.run(_main(ap.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
