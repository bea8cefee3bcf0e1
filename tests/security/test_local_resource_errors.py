"""High #2 of issue 22, the evidence rule: running out of descriptors is the gateway's own sickness.

A child process lowers its descriptor limit, fills it, and lets a real ``HealthMonitor`` probe a replica
that listens: every probe fails with EMFILE before a connection exists. The replica must stay healthy (it
was marked unhealthy, and under ``fleetgate up`` restarted, before), and the probe is counted as not sent.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import asyncio, os, resource, socket
    from fleetgate.core.health import HealthPolicy
    from fleetgate.core.types import HealthState
    from fleetgate.health.monitor import HealthMonitor

    async def main():
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        url = "http://127.0.0.1:%d" % listener.getsockname()[1]
        monitor = HealthMonitor(
            model="m", policy=HealthPolicy(failures_to_unhealthy=1), initial_state=HealthState.HEALTHY
        )
        monitor.set_replicas({"r0": url})
        monitor.session  # the client session exists before the descriptors run out
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        held = []
        try:
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        for _ in range(3):
            await monitor._probe_and_report("r0")
        for fd in held:
            os.close(fd)
        print("STATE", monitor.state("r0").value)
        await monitor.stop()

    asyncio.run(main())
    """
)


def test_emfile_probe_is_no_evidence_against_the_replica() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert "STATE " in out.stdout, out.stdout + out.stderr
    state = out.stdout.split("STATE ", 1)[1].split()[0]
    assert state == "healthy", out.stdout + out.stderr[-2000:]
