"""Cost profiles from files: the bundled ones (``fleetgate/profiles/*.json``) or a JSON path.

Outside core on purpose: core never reads files; the gateway (``gateway/fleet.py``), the simulator
(``sim/runner.py``) and the CLI load a profile here and pass the ``CostProfile`` in.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from fleetgate.core.units import DEFAULT_PROFILE, CostProfile

if TYPE_CHECKING:
    from fleetgate.config import DeploymentConfig

_PROFILE_DIR = "profiles"


def bundled_profile_names() -> tuple[str, ...]:
    """Names of the profiles shipped in ``fleetgate/profiles``."""
    root = resources.files("fleetgate").joinpath(_PROFILE_DIR)
    return tuple(sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".json")))


def load_profile(name_or_path: str | None) -> CostProfile:
    """``None`` -> ``DEFAULT_PROFILE``; a bundled profile name (``llama2-70b-h100``); else a JSON path."""
    if name_or_path is None or name_or_path == "default":
        return DEFAULT_PROFILE
    bundled = resources.files("fleetgate").joinpath(_PROFILE_DIR).joinpath(f"{name_or_path}.json")
    if "/" not in name_or_path and bundled.is_file():
        return CostProfile.from_dict(json.loads(bundled.read_text(encoding="utf-8")))
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(
            f"unknown cost profile {name_or_path!r}: not a bundled profile "
            f"({', '.join(bundled_profile_names()) or 'none'}) and not a JSON file"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"cost profile {name_or_path!r} is not valid JSON: {exc}") from exc
    return CostProfile.from_dict(data)


def deployment_profile(dep: DeploymentConfig) -> CostProfile:
    """The deployment's cost profile, renormalised to its ``capacity_mu_per_min`` when that is set (unset:
    the profile's own per-replica MU/min is the deployment's)."""
    profile = load_profile(dep.cost_profile)
    wanted = dep.capacity_mu_per_min
    if wanted is not None and wanted != profile.capacity_mu_per_min:
        profile = profile.with_capacity(wanted)
    return profile


def replica_capacity_mu_per_min(dep: DeploymentConfig) -> float:
    """MU/min one replica of ``dep`` serves: ``capacity_mu_per_min`` if set, else its cost profile's."""
    if dep.capacity_mu_per_min is not None:
        return dep.capacity_mu_per_min
    return load_profile(dep.cost_profile).capacity_mu_per_min
