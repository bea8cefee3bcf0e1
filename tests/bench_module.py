"""Load a script of ``bench/`` as a module, for the tests that drive a benchmark at CI size."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench(script: str, name: str) -> ModuleType:
    """``bench/<script>`` executed afresh as module ``name`` (registered in ``sys.modules``: dataclasses
    resolve their annotations through it)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
