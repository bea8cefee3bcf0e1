"""The layout rules of docs/architecture.md, checked on the source (no imports of fleetgate itself).

- No import cycle: within every package, its children (subpackages and modules) import each other without
  a circle. Every import counts, function-local ones included; only ``if TYPE_CHECKING:`` blocks do not
  (they never run).
- ``fleetgate.core`` imports only core, the standard library, numpy and pydantic (plug-in ``Params`` are
  plain validated data; see ``core/plugins.py``).
- ``fleetgate.core`` keeps no module-level mutable state: no ``global`` statement, no module-level list,
  dict or set (constants are tuples, frozensets or ``MappingProxyType``).
- At most 10 ``getattr``/``hasattr`` calls in ``src``, each commented with why (on its line or the one above):
  optional interfaces are declared on protocols with no-op defaults, not probed.
- No file under ``src/fleetgate`` is longer than 700 lines (``simengine/perfmodel.py``, one cohesive model,
  aside).

The allow-lists below name what is known to break a rule today, each with its owner's reason. They may only
shrink: an entry that no longer breaks its rule fails the test, so whoever fixes it removes it.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PKG = SRC / "fleetgate"
MAX_LINES = 700
#: Files allowed above MAX_LINES for good: one cohesive model.
LONG_FOR_GOOD = {"simengine/perfmodel.py"}
#: Files still above MAX_LINES while their owners split them (architecture step, issue 16). Shrinks only.
KNOWN_LONG: set[str] = set()
#: Import circles still open (package -> [children in the circle]). Shrinks only.
KNOWN_CYCLES: dict[str, set[str]] = {}
#: Third-party imports in core, by module, that are still to go. Shrinks only.
KNOWN_CORE_IMPORTS: dict[str, set[str]] = {}
#: Module-level mutable values in core still to go (file: names; the tokenizer caches are a
#: PromptTokenizer instance owned by the fleet now). Shrinks only.
KNOWN_MUTABLE: dict[str, set[str]] = {}
CORE_ALLOWED = {"numpy", "pydantic", "pydantic_core"}
MUTABLE_CALLS = {"list", "dict", "set", "defaultdict", "deque", "Counter", "OrderedDict", "bytearray"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()
PACKAGES = {name for name, path in MODULES.items() if path.name == "__init__.py"}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node, but not inside ``if TYPE_CHECKING:`` blocks."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            for other in node.orelse:
                yield other
                yield from _walk(other)
            continue
        yield node
        yield from _walk(node)


def _imports(module: str) -> set[str]:
    """Absolute names ``module`` imports (a ``from x import y`` of a submodule counts as ``x.y``)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), filename=str(path))
    base = module if module in PACKAGES else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                target = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            found.add(target)
            for alias in node.names:
                if f"{target}.{alias.name}" in MODULES:
                    found.add(f"{target}.{alias.name}")
    return found


IMPORTS = {name: _imports(name) for name in MODULES}


def _child(package: str, module: str) -> str | None:
    """The child of ``package`` that ``module`` lives in (``None``: outside, or the package itself)."""
    if not module.startswith(package + "."):
        return None
    return module[len(package) + 1 :].split(".")[0]


def _cycles(package: str) -> list[list[str]]:
    """Circles among the children of ``package`` (each a list of child names)."""
    edges: dict[str, set[str]] = {}
    for module, targets in IMPORTS.items():
        src = _child(package, module)
        if src is None:
            continue
        for target in targets:
            dst = _child(package, target)
            if dst is not None and dst != src:
                edges.setdefault(src, set()).add(dst)
    # Tarjan's strongly connected components; a component with more than one child is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles() -> None:
    found = {pkg: comp for pkg in sorted(PACKAGES) for comp in _cycles(pkg)}
    problems = [
        f"{pkg}: {' <-> '.join(comp)}" for pkg, comp in found.items() if set(comp) != KNOWN_CYCLES.get(pkg)
    ]
    assert not problems, "import circles (function-local imports count):\n" + "\n".join(problems)
    stale = [pkg for pkg in KNOWN_CYCLES if pkg not in found]
    assert not stale, f"fixed, remove from KNOWN_CYCLES: {stale}"


def test_the_cycle_finder_sees_function_local_imports(tmp_path: Path) -> None:
    """The rule's own check: a circle closed by an import inside a function is found."""
    global IMPORTS
    saved = IMPORTS
    IMPORTS = {"p.a": {"p.b"}, "p.b": set(), "p.c": {"p.a"}}
    try:
        assert _cycles("p") == []
        IMPORTS["p.b"] = {"p.c"}  # e.g. `def f(): from p.c import x`
        assert _cycles("p") == [["a", "b", "c"]]
    finally:
        IMPORTS = saved
    tree = ast.parse("def f():\n    from fleetgate.x import y\nif TYPE_CHECKING:\n    import z\n")
    names = {n.module for n in _walk(tree) if isinstance(n, ast.ImportFrom)}
    assert names == {"fleetgate.x"} and not any(isinstance(n, ast.Import) for n in _walk(tree))


def _third_party(targets: set[str]) -> set[str]:
    out = set()
    for target in targets:
        top = target.split(".")[0]
        if top and top != "fleetgate" and top not in sys.stdlib_module_names and top != "__future__":
            out.add(top)
    return out


def test_core_imports_only_core_stdlib_numpy_pydantic() -> None:
    problems = []
    seen_known: set[str] = set()
    for module, targets in IMPORTS.items():
        if module != "fleetgate.core" and not module.startswith("fleetgate.core."):
            continue
        outside = sorted(
            t for t in targets if t.startswith("fleetgate") and not t.startswith("fleetgate.core")
        )
        outside = [t for t in outside if t != "fleetgate.core"]
        extra = _third_party(targets) - CORE_ALLOWED
        known = KNOWN_CORE_IMPORTS.get(module, set())
        if extra & known:
            seen_known.add(module)
        extra -= known
        if outside or extra:
            problems.append(f"{module}: {', '.join([*outside, *sorted(extra)])}")
    assert not problems, (
        "core must import only core, the standard library, numpy and pydantic:\n" + "\n".join(problems)
    )
    stale = sorted(set(KNOWN_CORE_IMPORTS) - seen_known)
    assert not stale, f"fixed, remove from KNOWN_CORE_IMPORTS: {stale}"


def _mutable(value: ast.expr | None) -> bool:
    if isinstance(value, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        return name in MUTABLE_CALLS
    return False


def _mutable_state(path: Path) -> dict[str, int]:
    """Module-level mutable values (name -> line) and ``global`` statements (``global x`` -> line)."""
    tree = ast.parse(path.read_text())
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            for name in node.names:
                found[f"global {name}"] = node.lineno
    for node in tree.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        if _mutable(value):
            for target in targets:
                if isinstance(target, ast.Name) and target.id != "__all__":
                    found[target.id] = node.lineno
    return found


def test_core_has_no_module_level_mutable_state() -> None:
    problems = []
    seen_known: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        if module != "fleetgate.core" and not module.startswith("fleetgate.core."):
            continue
        rel = str(path.relative_to(SRC))
        known = KNOWN_MUTABLE.get(rel, set())
        for name, line in sorted(_mutable_state(path).items(), key=lambda x: x[1]):
            if name in known:
                seen_known.setdefault(rel, set()).add(name)
            else:
                problems.append(f"{rel}:{line}: {name} (module-level mutable state)")
    assert not problems, "core keeps no module-level mutable state:\n" + "\n".join(problems)
    stale = {rel: names - seen_known.get(rel, set()) for rel, names in KNOWN_MUTABLE.items()}
    stale = {rel: names for rel, names in stale.items() if names}
    assert not stale, f"fixed, remove from KNOWN_MUTABLE: {stale}"


def _line_counts() -> dict[str, int]:
    return {
        str(path.relative_to(PKG)): len(path.read_text().splitlines()) for path in sorted(PKG.rglob("*.py"))
    }


def test_no_file_above_700_lines() -> None:
    counts = _line_counts()
    long = {name: n for name, n in counts.items() if n > MAX_LINES and name not in LONG_FOR_GOOD}
    offenders = [f"{name}: {n} lines" for name, n in sorted(long.items()) if name not in KNOWN_LONG]
    assert not offenders, f"files above {MAX_LINES} lines (split them):\n" + "\n".join(offenders)
    stale = sorted(KNOWN_LONG - set(long))
    assert not stale, f"now within {MAX_LINES} lines, remove from KNOWN_LONG: {stale}"


@pytest.mark.parametrize("name", sorted(KNOWN_LONG))
def test_known_long_files_are_listed_with_their_size(name: str) -> None:
    """The allow-list, reported: each entry with its current length (shown with -v)."""
    counts = _line_counts()
    assert name in counts, f"{name} does not exist: remove it from KNOWN_LONG"
    print(f"{name}: {counts[name]} lines (known, above {MAX_LINES})")


MAX_ATTR_PROBES = 10


def test_getattr_and_hasattr_are_few_and_explained() -> None:
    hits = []
    for path in sorted(PKG.rglob("*.py")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if "getattr" in line or "hasattr" in line:
                explained = "#" in line or (i > 0 and lines[i - 1].strip().startswith("#"))
                hits.append((f"{path.relative_to(SRC)}:{i + 1}", explained))
    assert len(hits) <= MAX_ATTR_PROBES, (
        f"{len(hits)} getattr/hasattr in src (at most {MAX_ATTR_PROBES}):\n" + ("\n".join(h for h, _ in hits))
    )
    unexplained = [h for h, ok in hits if not ok]
    assert not unexplained, "comment why each getattr/hasattr is needed:\n" + "\n".join(unexplained)
