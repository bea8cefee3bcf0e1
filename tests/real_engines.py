"""Which real engines a test run must have: skip by hand, fail under ``make test``.

``scripts/test.sh`` builds llama-server and the tiny model before the tests and exports
``FLEETGATE_REQUIRE_REAL_ENGINES=llama`` (``llama,vllm`` with ``FLEETGATE_TEST_VLLM=1``). A test that needs
an engine calls :func:`need_llama` / :func:`need_vllm`: with the engine listed there a missing build is a
FAILURE (CI cannot skip its real-engine tests silently); a plain ``pytest`` run by hand skips with the
``make`` target that builds it.
"""

from __future__ import annotations

import os

import pytest

from fleetgate.engines.llama import missing_llama_parts
from fleetgate.engines.vllm_cpu import missing_vllm_parts

REQUIRE_ENV = "FLEETGATE_REQUIRE_REAL_ENGINES"


def required(engine: str) -> bool:
    """True when this run was told it must have ``engine`` (``llama`` or ``vllm``)."""
    wanted = {part.strip() for part in os.environ.get(REQUIRE_ENV, "").split(",")}
    return engine in wanted


def _need(engine: str, missing: list[str]) -> None:
    if not missing:
        return
    what = f"real {engine} engine not built: " + "; ".join(missing)
    if required(engine):
        pytest.fail(f"{what} ({REQUIRE_ENV} lists {engine!r}: scripts/test.sh should have built it)")
    pytest.skip(what)


def need_llama() -> None:
    """Skip (by hand) or fail (under ``make test``) unless llama-server and the tiny GGUF are built."""
    _need("llama", missing_llama_parts())


def need_vllm() -> None:
    """Skip (by hand) or fail (when required) unless the vLLM CPU venv and the tiny HF model are built."""
    _need("vllm", missing_vllm_parts())
