"""The ``net`` fixture: namespaces and veth links for one test, always torn down (netns.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from netns import Net, netns_unavailable, sweep_stale


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
