"""The container's real CPU budget, and worker thread settings derived from it.

A process that sizes its pools from ``os.cpu_count()`` sees the host's CPUs, not what the container may use:
on a 64-core node with a 2-CPU quota it starts 64 OpenMP threads per worker and is throttled by the CFS
quota. The budget is the smallest of the cgroup v2 ``cpu.max`` quota, the cgroup v1
``cpu.cfs_quota_us / cpu.cfs_period_us`` quota and the scheduler affinity mask. Paths are injectable so
tests read temporary files instead of the real ``/sys/fs/cgroup``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

#: Environment variables that size the thread pools of the native libraries an image worker may load.
THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VIPS_CONCURRENCY",
)


@dataclass(frozen=True, slots=True)
class CpuBudget:
    """CPUs this process may really use. ``cpus`` is fractional (a 1.5-CPU quota is 1.5); ``source`` says
    which limit won (``cgroup2``, ``cgroup1``, ``affinity`` or ``host``)."""

    cpus: float
    source: str
    host_cpus: int
    cgroup2_cpus: float | None = None
    cgroup1_cpus: float | None = None
    affinity_cpus: int | None = None

    @property
    def whole_cpus(self) -> int:
        """The budget rounded down, at least 1 (a 0.5-CPU quota still runs one worker)."""
        return max(1, math.floor(self.cpus + 1e-9))


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def parse_cgroup2_cpu_max(text: str) -> float | None:
    """``"max 100000"`` -> None (no limit); ``"150000 100000"`` -> 1.5 CPUs; garbage -> None."""
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    try:
        quota = int(parts[0])
        period = int(parts[1]) if len(parts) > 1 else 100_000
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def parse_cgroup1_quota(quota_text: str, period_text: str) -> float | None:
    """``cfs_quota_us`` of -1 means no limit; otherwise quota/period CPUs."""
    try:
        quota = int(quota_text)
        period = int(period_text)
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def _own_cgroup_paths(proc_cgroup: Path) -> tuple[str | None, str | None]:
    """This process's cgroup v2 path and cgroup v1 ``cpu`` controller path from ``/proc/self/cgroup``."""
    text = _read_text(proc_cgroup)
    if text is None:
        return None, None
    v2: str | None = None
    v1: str | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _candidates(root: Path, sub: str | None) -> list[Path]:
    """The cgroup directory of this process (when mounted in the container) and the mount root."""
    dirs = []
    if sub and sub != "/":
        dirs.append(root / sub.lstrip("/"))
    dirs.append(root)
    return dirs


def read_cpu_budget(
    *,
    cgroup_root: str | Path = "/sys/fs/cgroup",
    proc_cgroup: str | Path = "/proc/self/cgroup",
    affinity: Callable[[], set[int]] | None = None,
    host_cpus: int | None = None,
) -> CpuBudget:
    """Read every limit that applies and take the smallest.

    cgroup v2: ``<root>/<own path>/cpu.max`` or ``<root>/cpu.max``. cgroup v1: ``<root>/cpu/<own path>/``
    or ``<root>/cpu/`` (also ``cpu,cpuacct``) ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us``.
    """
    root = Path(cgroup_root)
    host = host_cpus if host_cpus is not None else (os.cpu_count() or 1)
    v2_path, v1_path = _own_cgroup_paths(Path(proc_cgroup))

    cg2: float | None = None
    for d in _candidates(root, v2_path):
        text = _read_text(d / "cpu.max")
        if text is not None:
            cg2 = parse_cgroup2_cpu_max(text)
            break

    cg1: float | None = None
    for controller in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        base = root / controller
        found = False
        for d in _candidates(base, v1_path):
            quota = _read_text(d / "cpu.cfs_quota_us")
            period = _read_text(d / "cpu.cfs_period_us")
            if quota is not None and period is not None:
                cg1 = parse_cgroup1_quota(quota, period)
                found = True
                break
        if found:
            break

    aff: int | None = None
    get_affinity = affinity
    # ``os.sched_getaffinity`` exists on Linux only (a platform feature, not an interface of ours)
    if get_affinity is None and hasattr(os, "sched_getaffinity"):

        def get_affinity() -> set[int]:
            return os.sched_getaffinity(0)

    if get_affinity is not None:
        try:
            aff = len(get_affinity()) or None
        except OSError:
            aff = None

    options: list[tuple[float, str]] = [(float(host), "host")]
    if cg2 is not None:
        options.append((cg2, "cgroup2"))
    if cg1 is not None:
        options.append((cg1, "cgroup1"))
    if aff is not None:
        options.append((float(aff), "affinity"))
    cpus, source = min(options, key=lambda item: item[0])
    return CpuBudget(
        cpus=cpus,
        source=source,
        host_cpus=host,
        cgroup2_cpus=cg2,
        cgroup1_cpus=cg1,
        affinity_cpus=aff,
    )


@dataclass(frozen=True, slots=True)
class PoolSizing:
    """How many worker processes and how many native threads each may use."""

    workers: int
    threads_per_worker: int


def pool_sizing(budget: CpuBudget, workers_override: int | None = None) -> PoolSizing:
    """One single-threaded worker per whole CPU of the budget (images are independent: processes scale,
    threads inside one small image do not); an override fixes the worker count and splits the budget."""
    workers = workers_override if workers_override is not None else budget.whole_cpus
    workers = max(1, workers)
    threads = max(1, budget.whole_cpus // workers)
    return PoolSizing(workers=workers, threads_per_worker=threads)


def worker_env(threads: int) -> dict[str, str]:
    """Environment for a worker process: every native thread pool capped at ``threads``."""
    value = str(max(1, int(threads)))
    return dict.fromkeys(THREAD_ENV_VARS, value)


def apply_thread_limits(threads: int, environ: MutableMapping[str, str] | None = None) -> dict[str, int]:
    """Inside a worker: set the env caps and the runtime thread counts of libraries already importable.

    Returns what was applied (library -> threads), for logs and tests. Only libraries already imported
    are sized (cv2, torch): importing one just to size it would cost more than it saves. Call it again after
    the worker imports its image backend.
    """
    import sys

    env = os.environ if environ is None else environ
    env.update(worker_env(threads))
    applied: dict[str, int] = {"env": threads}
    for name, setter in (("cv2", "setNumThreads"), ("torch", "set_num_threads")):
        module = sys.modules.get(name)
        if module is None:
            continue
        try:
            getattr(module, setter)(threads)  # a third-party library's setter, called by name
            applied[name] = threads
        except Exception:  # an odd build without the setter: the env caps still apply
            pass
    return applied


def describe(budget: CpuBudget, sizing: PoolSizing) -> Mapping[str, object]:
    """A log/metrics-friendly summary."""
    return {
        "cpus": round(budget.cpus, 3),
        "source": budget.source,
        "host_cpus": budget.host_cpus,
        "workers": sizing.workers,
        "threads_per_worker": sizing.threads_per_worker,
    }
