"""The core is sans-IO: no module under src/fleetgate/core imports asyncio, aiohttp, socket, time, random."""

from __future__ import annotations

import ast
from pathlib import Path

import fleetgate.core

FORBIDDEN = {"asyncio", "aiohttp", "socket", "time", "random"}
CORE = Path(fleetgate.core.__file__).parent


def _is_dynamic_import(func: ast.expr) -> bool:
    """``__import__("x")`` or ``importlib.import_module("x")``."""
    return getattr(func, "id", None) == "__import__" or getattr(func, "attr", None) == "import_module"


def _imports(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and node.args and _is_dynamic_import(node.func):
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.add(arg.value.split(".")[0])
    return found


def test_core_modules_found() -> None:
    assert len(list(CORE.rglob("*.py"))) >= 3


def test_core_is_sans_io() -> None:
    offenders = {}
    for path in sorted(CORE.rglob("*.py")):
        bad = _imports(ast.parse(path.read_text(), filename=str(path))) & FORBIDDEN
        if bad:
            offenders[str(path.relative_to(CORE))] = sorted(bad)
    assert offenders == {}, f"core modules doing I/O or using clocks/randomness: {offenders}"


def test_checker_catches_forbidden_imports() -> None:
    src = "import asyncio\nfrom time import monotonic\nimport os.path\n__import__('socket')\n"
    assert _imports(ast.parse(src)) & FORBIDDEN == {"asyncio", "time", "socket"}
