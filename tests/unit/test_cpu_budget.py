"""The container CPU budget: cgroup v2, cgroup v1 and affinity, smallest wins (tmp files, no real /sys)."""

from __future__ import annotations

from pathlib import Path

from fleetgate.multimodal.cpu import (
    THREAD_ENV_VARS,
    apply_thread_limits,
    parse_cgroup1_quota,
    parse_cgroup2_cpu_max,
    pool_sizing,
    read_cpu_budget,
    worker_env,
)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _proc(tmp_path: Path, text: str = "0::/\n") -> Path:
    p = tmp_path / "proc_cgroup"
    p.write_text(text)
    return p


def test_parse_cgroup2() -> None:
    assert parse_cgroup2_cpu_max("max 100000") is None
    assert parse_cgroup2_cpu_max("150000 100000") == 1.5
    assert parse_cgroup2_cpu_max("200000") == 2.0
    assert parse_cgroup2_cpu_max("junk") is None
    assert parse_cgroup2_cpu_max("") is None


def test_parse_cgroup1() -> None:
    assert parse_cgroup1_quota("-1", "100000") is None
    assert parse_cgroup1_quota("50000", "100000") == 0.5
    assert parse_cgroup1_quota("x", "100000") is None


def test_cgroup2_quota_wins_over_host_and_affinity(tmp_path: Path) -> None:
    _write(tmp_path / "cg" / "cpu.max", "250000 100000\n")
    budget = read_cpu_budget(
        cgroup_root=tmp_path / "cg", proc_cgroup=_proc(tmp_path), affinity=lambda: set(range(8)), host_cpus=64
    )
    assert budget.cpus == 2.5 and budget.source == "cgroup2"
    assert budget.whole_cpus == 2
    assert budget.affinity_cpus == 8 and budget.host_cpus == 64


def test_cgroup2_own_subgroup_is_preferred(tmp_path: Path) -> None:
    _write(tmp_path / "cg" / "cpu.max", "max 100000\n")
    _write(tmp_path / "cg" / "kubepods" / "pod1" / "cpu.max", "100000 100000\n")
    proc = _proc(tmp_path, "0::/kubepods/pod1\n")
    budget = read_cpu_budget(
        cgroup_root=tmp_path / "cg", proc_cgroup=proc, affinity=lambda: {0, 1, 2}, host_cpus=16
    )
    assert budget.cpus == 1.0 and budget.source == "cgroup2"


def test_cgroup1_quota(tmp_path: Path) -> None:
    _write(tmp_path / "cg" / "cpu" / "cpu.cfs_quota_us", "300000\n")
    _write(tmp_path / "cg" / "cpu" / "cpu.cfs_period_us", "100000\n")
    proc = _proc(tmp_path, "4:cpu,cpuacct:/\n1:name=systemd:/\n")
    budget = read_cpu_budget(
        cgroup_root=tmp_path / "cg", proc_cgroup=proc, affinity=lambda: set(range(32)), host_cpus=32
    )
    assert budget.cpus == 3.0 and budget.source == "cgroup1"


def test_cgroup1_unlimited_falls_back_to_affinity(tmp_path: Path) -> None:
    _write(tmp_path / "cg" / "cpu" / "cpu.cfs_quota_us", "-1\n")
    _write(tmp_path / "cg" / "cpu" / "cpu.cfs_period_us", "100000\n")
    budget = read_cpu_budget(
        cgroup_root=tmp_path / "cg", proc_cgroup=_proc(tmp_path), affinity=lambda: {3, 5}, host_cpus=96
    )
    assert budget.cpus == 2.0 and budget.source == "affinity"
    assert budget.cgroup1_cpus is None


def test_affinity_smaller_than_quota(tmp_path: Path) -> None:
    _write(tmp_path / "cg" / "cpu.max", "800000 100000\n")
    budget = read_cpu_budget(
        cgroup_root=tmp_path / "cg", proc_cgroup=_proc(tmp_path), affinity=lambda: {0}, host_cpus=96
    )
    assert budget.cpus == 1.0 and budget.source == "affinity"


def test_nothing_mounted_is_host(tmp_path: Path) -> None:
    def no_affinity() -> set[int]:
        raise OSError("unsupported")

    budget = read_cpu_budget(
        cgroup_root=tmp_path / "none", proc_cgroup=tmp_path / "missing", affinity=no_affinity, host_cpus=12
    )
    assert budget.cpus == 12 and budget.source == "host"


def test_fractional_quota_still_one_worker(tmp_path: Path) -> None:
    _write(tmp_path / "cg" / "cpu.max", "50000 100000\n")
    budget = read_cpu_budget(
        cgroup_root=tmp_path / "cg", proc_cgroup=_proc(tmp_path), affinity=lambda: {0, 1}, host_cpus=2
    )
    assert budget.cpus == 0.5
    sizing = pool_sizing(budget)
    assert sizing.workers == 1 and sizing.threads_per_worker == 1


def test_pool_sizing_override_splits_threads(tmp_path: Path) -> None:
    _write(tmp_path / "cg" / "cpu.max", "800000 100000\n")
    budget = read_cpu_budget(
        cgroup_root=tmp_path / "cg",
        proc_cgroup=_proc(tmp_path),
        affinity=lambda: set(range(64)),
        host_cpus=64,
    )
    assert pool_sizing(budget) == pool_sizing(budget, None)
    assert pool_sizing(budget).workers == 8 and pool_sizing(budget).threads_per_worker == 1
    assert pool_sizing(budget, 2).threads_per_worker == 4


def test_real_machine_budget_is_sane() -> None:
    budget = read_cpu_budget()
    assert 0 < budget.cpus <= budget.host_cpus


def test_worker_env_and_apply() -> None:
    env = worker_env(3)
    assert set(env) == set(THREAD_ENV_VARS) and set(env.values()) == {"3"}
    target: dict[str, str] = {}
    applied = apply_thread_limits(2, target)
    assert target["OMP_NUM_THREADS"] == "2" and target["OPENBLAS_NUM_THREADS"] == "2"
    assert target["MKL_NUM_THREADS"] == "2"
    assert applied["env"] == 2
