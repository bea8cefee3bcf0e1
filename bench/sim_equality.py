"""Same results before and after a refactor: ``fleetgate simulate`` JSON of two source trees, side by side.

Runs every case below with this tree and with ``--old-src`` (e.g. ``/work/wt/base/src``, a checkout of the
commit before the change) via ``PYTHONPATH`` and compares the JSON summaries key by key (``wall_s`` aside).
A case may give different ``--policy-param`` lists for the old and the new tree, for parameters that were
renamed or moved (e.g. the routing profile the policy now inherits from the deployment).

Usage: .venv/bin/python bench/sim_equality.py --old-src /work/wt/base/src [--cases NAME,...] [--jobs 1]
       [--same-params]   (the old tree gets the new tree's policy params: for an old tree after 8468188)
       [--old-param KEY=VALUE ...]   (more policy params for the old tree's fleetgate cases, before the
       case's own: a changed default given to the old tree, so that only the change of defaults differs)
Exit status 1 when any case differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fleetgate.sim.traces import default_traces_dir

ROOT = Path(__file__).resolve().parents[1]
TRACES = default_traces_dir()
MOONCAKE = str(TRACES / "mooncake" / "conversation_trace.jsonl")
AZURE = str(TRACES / "azure-2023" / "AzureLLMInferenceTrace_conv.csv")

#: The CLI's default profile (llama2-70b-h100-tp4) is the deployment's profile; the old fleetgate policy used
#: the built-in default profile unless ``profile`` was passed, the new one inherits the deployment's.
OLD_PROFILE = ["profile=llama2-70b-h100-tp4"]

# name -> (simulate arguments, old-tree policy params, new-tree policy params)
CASES: dict[str, tuple[list[str], list[str], list[str]]] = {}


def _case(name: str, args: list[str], old: list[str] | None = None, new: list[str] | None = None) -> None:
    CASES[name] = (args, old or [], new or [])


for _policy in ("random", "round_robin", "least_requests", "p2c", "cache_aware"):
    _case(f"mooncake-{_policy}", ["--trace", MOONCAKE, "--policy", _policy, "--max-requests", "3000"])
_case("mooncake-fleetgate", ["--trace", MOONCAKE, "--max-requests", "3000"], OLD_PROFILE)
_case(
    "mooncake-fleetgate-default-profile",
    ["--trace", MOONCAKE, "--max-requests", "3000", "--profile", "default", "--replicas", "8"],
)
_case(
    "mooncake-fleetgate-gate",
    ["--trace", MOONCAKE, "--max-requests", "3000", "--rate-scale", "2", "--replicas", "8"],
    [*OLD_PROFILE, "prefill_tokens_per_s=6000", "cache_tokens_per_replica=200000"],
    ["prefill_tokens_per_s=6000", "cache_tokens_per_replica=200000"],
)
_case(
    "mooncake-fleetgate-session-scan",
    ["--trace", MOONCAKE, "--max-requests", "2000", "--replicas", "32", "--rate-scale", "3"],
    [*OLD_PROFILE, "key=tenant", "scan_limit=8", "min_subset=3", "engine_queue=false"],
    ["key=tenant", "scan_limit=8", "min_subset=3", "engine_queue=false"],
)
_case(
    "mooncake-p2c-kv",
    ["--trace", MOONCAKE, "--policy", "p2c", "--max-requests", "2000"],
    ["scorers={kv_usage: 1, queue_length: 1}", "choices=3"],
    ["scorers={kv_usage: 1, queue_length: 1}", "choices=3"],
)
for _policy in ("least_requests", "cache_aware"):
    _case(
        f"azure-{_policy}",
        ["--trace", AZURE, "--policy", _policy, "--max-requests", "4000", "--replicas", "4"],
    )
_case("azure-fleetgate", ["--trace", AZURE, "--max-requests", "4000", "--replicas", "4"], OLD_PROFILE)
_case(
    "azure-fleetgate-gate",
    ["--trace", AZURE, "--max-requests", "4000", "--replicas", "4", "--rate-scale", "3"],
    [*OLD_PROFILE, "prefill_tokens_per_s=3000", "first_token_feedback=off"],
    ["prefill_tokens_per_s=3000", "first_token_feedback=off"],
)


def _run(src: str, args: list[str], params: list[str], out: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": src}
    cmd = [sys.executable, "-m", "fleetgate.cli", "simulate", *args, "--no-progress", "--json", str(out)]
    for p in params:
        cmd += ["--policy-param", p]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    data: dict[str, Any] = json.loads(out.read_text())
    data.pop("wall_s", None)
    return data


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if "wall" in k:
                continue
            out += _diff(a.get(k), b.get(k), f"{path}.{k}")
        return out
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old-src", required=True)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--same-params", action="store_true", help="give the old tree the new tree's params")
    ap.add_argument(
        "--old-param",
        action="append",
        default=[],
        help="KEY=VALUE for the old tree's fleetgate cases, before the case's own (repeatable)",
    )
    args = ap.parse_args()
    new_src = str(ROOT / "src")
    names = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:

        def one(name: str) -> tuple[str, list[str]]:
            sim_args, old_p, new_p = CASES[name]
            fleetgate = "--policy" not in sim_args or sim_args[sim_args.index("--policy") + 1] == "fleetgate"
            extra = args.old_param if fleetgate else []
            old = _run(
                args.old_src,
                sim_args,
                [*extra, *(new_p if args.same_params else old_p)],
                Path(tmp) / f"{name}.old.json",
            )
            new = _run(new_src, sim_args, new_p, Path(tmp) / f"{name}.new.json")
            return name, _diff(old, new)

        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            for name, diffs in pool.map(one, names):
                print(f"{name}: {'identical' if not diffs else f'{len(diffs)} differences'}", flush=True)
                for d in diffs[:10]:
                    print(f"    {d}")
                bad += bool(diffs)
    print(f"{len(names) - bad}/{len(names)} identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
