"""``tests/integration/conftest.py`` (``ServerProcess`` & co.) for helpers outside that folder.

A conftest file cannot be imported by name (every one is module ``conftest``), so it is loaded read-only
under one fixed name; every caller shares that one module object.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

NAME = "fleetgate_integration_tools"
CONFTEST = Path(__file__).resolve().parent / "integration" / "conftest.py"


def integration_tools() -> ModuleType:
    """The loaded module (loaded on first call)."""
    if NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(NAME, CONFTEST)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[NAME] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[NAME]  # a half-loaded module would hide the real error from later callers
            raise
    return sys.modules[NAME]
