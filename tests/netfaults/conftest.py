"""The ``net`` fixture: namespaces and veth links for one test, always torn down (netns.py).

tests/kubernetes is put on the import path for its test API server (``k8s_apiserver``), as pytest does for
the tests in that folder (the same file, so the same module either way).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from netns import Net, netns_unavailable, sweep_stale

KUBERNETES_TESTS = str(Path(__file__).resolve().parents[1] / "kubernetes")
if KUBERNETES_TESTS not in sys.path:
    sys.path.insert(0, KUBERNETES_TESTS)


@pytest.fixture
def net() -> Iterator[Net]:
    why = netns_unavailable()
    if why is not None:
        pytest.skip(why)
    sweep_stale()
    n = Net()
    try:
        yield n
    finally:
        n.close()
