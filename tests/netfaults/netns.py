"""Hosts on one machine for network-fault tests: network namespaces joined by veth pairs (root only).

``net`` builds namespaces (each with its own loopback) and point-to-point links between them or the test's
own (root) namespace, every link a private /30; processes run inside a namespace through ``ip netns exec``.
A partition is a link whose far end is brought down: the near side keeps its address and route (flagged
``linkdown``) and its packets are silently dropped, so connects and established connections hang until
their timeouts, as when a switch or a cable between two hosts fails (not a refused connection, which is
what a killed process gives). Everything built is torn down at the end of the test, failed or not; links and
namespaces that a killed earlier run left behind (named after a pid that no longer exists) are removed too.

Not emulated here: delay, loss and reordering (``tc netem`` needs the ``sch_netem`` kernel module, absent on
these machines); routed multi-hop networks; DNS. The modules skip, with the reason, when not run as root or
when ``ip netns add`` fails (a container without CAP_NET_ADMIN).
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from integration_tools import integration_tools

PY = sys.executable
SRC = str(Path(__file__).resolve().parents[2] / "src")
PREFIX = "fgn"  # namespaces fgn<pid>-<name>, veth devices fgn<pid-hex>x<n>[ab] (at most 15 characters)
READY = re.compile(r"ready on (https?://\S+)")
ServerProcess = integration_tools().ServerProcess


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=10)


def _pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def sweep_stale() -> None:
    """Remove namespaces of earlier runs whose pytest process is gone (a SIGKILLed run tears nothing down)."""
    out = _ip("netns", "list", check=False).stdout
    for name in re.findall(rf"^({PREFIX}(\d+)-\S+)", out, re.M):
        if not _pid_alive(int(name[1])):
            _kill_pids_in(name[0])
            _ip("netns", "del", name[0], check=False)


def _kill_pids_in(ns: str) -> None:
    for pid in _ip("netns", "pids", ns, check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def netns_unavailable() -> str | None:
    """Why network namespaces cannot be built here (None when they can)."""
    if shutil.which("ip") is None:
        return "needs iproute2 (`ip`)"
    if os.geteuid() != 0:
        return "needs root (ip netns, veth pairs: CAP_NET_ADMIN)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass(frozen=True)
class Host:
    """A namespace (``ns``), or the test's own network namespace when ``ns`` is None."""

    name: str
    ns: str | None

    def cmd(self, args: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *args] if self.ns else list(args)


@dataclass
class Link:
    """A veth pair between two hosts on a /30: ``a`` gets the first address, ``b`` the second."""

    a: Host
    b: Host
    a_dev: str
    b_dev: str
    a_ip: str
    b_ip: str
    cut_at: list[float] = field(default_factory=list)

    def _set(self, host: Host, dev: str, state: str) -> None:
        args = ["-n", host.ns] if host.ns else []
        _ip(*args, "link", "set", dev, state)

    def cut(self, far: Host) -> None:
        """Partition: bring ``far``'s end down; the other side's packets to it are dropped in silence."""
        self.cut_at.append(time.monotonic())
        self._set(far, self.a_dev if far == self.a else self.b_dev, "down")

    def heal(self, far: Host) -> None:
        self._set(far, self.a_dev if far == self.a else self.b_dev, "up")


class Net:
    """Namespaces and links of one test; :meth:`close` removes all of them (and whatever runs inside)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.root = Host("root", None)
        self.hosts: list[Host] = []
        self.links: list[Link] = []
        self._subnets = self._free_subnets()

    def _free_subnets(self) -> Iterator[ipaddress.IPv4Network]:
        """/30s from 10.<200-249>.<pid>.0/24 (pid-derived, so parallel runs differ), skipping used ones."""
        used = [
            ipaddress.ip_interface(a).network
            for a in re.findall(r"inet (\S+)", _ip("-o", "addr", check=False).stdout)
        ]
        block = ipaddress.ip_network(f"10.{200 + (self.pid >> 8) % 50}.{self.pid % 256}.0/24")
        for sub in block.subnets(new_prefix=30):
            if not any(sub.overlaps(u) for u in used):
                yield sub

    def host(self, name: str) -> Host:
        ns = f"{PREFIX}{self.pid}-{name}"
        _ip("netns", "add", ns)
        host = Host(name, ns)
        self.hosts.append(host)
        _ip("-n", ns, "link", "set", "lo", "up")
        return host

    def link(self, a: Host, b: Host) -> Link:
        n = len(self.links)
        a_dev, b_dev = f"{PREFIX}{self.pid:x}x{n}a", f"{PREFIX}{self.pid:x}x{n}b"
        sub = next(self._subnets)
        a_ip, b_ip = (str(x) for x in list(sub.hosts())[:2])
        _ip("link", "add", a_dev, "type", "veth", "peer", "name", b_dev)
        link = Link(a, b, a_dev, b_dev, a_ip, b_ip)
        self.links.append(link)
        for host, dev, addr in ((a, a_dev, a_ip), (b, b_dev, b_ip)):
            if host.ns:
                _ip("link", "set", dev, "netns", host.ns)
            args = ["-n", host.ns] if host.ns else []
            _ip(*args, "addr", "add", f"{addr}/30", "dev", dev)
            _ip(*args, "link", "set", dev, "up")
        return link

    def route(self, host: Host, dest_ip: str, via: str) -> None:
        """On ``host``, reach ``dest_ip`` through ``via`` (an address of a directly linked host)."""
        args = ["-n", host.ns] if host.ns else []
        _ip(*args, "route", "add", f"{dest_ip}/32", "via", via)

    def close(self) -> None:
        for host in self.hosts:
            assert host.ns is not None
            _kill_pids_in(host.ns)
        for link in self.links:  # a pair with an end in the root namespace would outlive the namespace
            _ip("link", "del", link.a_dev, check=False)
        for host in self.hosts:
            assert host.ns is not None
            _ip("netns", "del", host.ns, check=False)


class NsProcess(ServerProcess):
    """A process on a host (``ip netns exec``), in its own process group; prints ``ready on URL`` when up
    (``tests/integration/conftest.py``'s ``ServerProcess``, run through the host with this tree's ``src``)."""

    def __init__(self, host: Host, args: Sequence[str], name: str, env: dict[str, str] | None = None) -> None:
        super().__init__(host.cmd(args), name, {"PYTHONPATH": SRC, **(env or {})}, ready=READY)


def redis_server(host: Host, bind: Sequence[str], tmp: Path) -> tuple[NsProcess, int]:
    """A private redis-server on ``host`` listening on ``bind`` (port 6379 inside its own namespace)."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not installed (scripts/test.sh installs it)")
    port = 6379
    args = ["redis-server", "--bind", *bind, "--port", str(port), "--save", "", "--appendonly", "no"]
    proc = NsProcess(host, [*args, "--dir", str(tmp), "--protected-mode", "no"], "redis")
    deadline = time.monotonic() + 10.0
    while not any("Ready to accept connections" in line for line in list(proc.lines)):
        if time.monotonic() > deadline or proc.proc.poll() is not None:
            proc.kill()
            raise RuntimeError(f"redis-server did not start:\n{proc.output[-2000:]}")
        time.sleep(0.05)
    return proc, port
