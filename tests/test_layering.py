"""Dependencies point one way: common <- namesrv, broker, rmq <- cli, pipeline.

DESIGN.md makes this a rule; this test walks every import statement of every package module
(with ast, so nothing is executed) and fails on an arrow that points the wrong way, on
relative imports (we use absolute imports only), and on import circles between the modules of
a package (DESIGN.md: no import circles; a lazy import hides one, it does not remove it).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# package -> the first-party packages it may import
ALLOWED: dict[str, set[str]] = {
    "common": {"common"},
    "namesrv": {"common", "namesrv"},
    "broker": {"common", "broker"},
    "rmq": {"common", "rmq"},
    "cli": {"common", "namesrv", "broker", "rmq", "cli"},
    "pipeline": {"common", "rmq", "broker", "pipeline"},
}
# not shipped: the suite and the benchmarks may import any package, and each other's helpers,
# but nothing shipped may import them
UNSHIPPED = ("tests", "bench")
FIRST_PARTY = set(ALLOWED) | set(UNSHIPPED)


def _imports(path: Path) -> list[tuple[int, str | None, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str | None, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, 0) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, node.module, node.level))
    return found


def _modules() -> list[Path]:
    return sorted(p for pkg in ALLOWED for p in (ROOT / pkg).rglob("*.py"))


def test_there_are_modules_to_check() -> None:
    # Guards against the walk silently finding nothing (wrong root) and passing vacuously.
    assert any(p.name == "__init__.py" for p in _modules())


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_one_way(path: Path) -> None:
    owner = path.relative_to(ROOT).parts[0]
    bad = []
    for lineno, module, level in _imports(path):
        if level:
            bad.append(f"line {lineno}: relative import (use absolute imports)")
            continue
        top = (module or "").split(".")[0]
        if top in FIRST_PARTY and top not in ALLOWED[owner]:
            bad.append(f"line {lineno}: {owner} must not import {module}")
    assert not bad, "\n".join(bad)


# --- no import circles ---------------------------------------------------------------------
#
# Every import statement counts, at module level or inside a function, under TYPE_CHECKING or
# not: a lazy import only hides a circle from the interpreter, not from the reader, and the
# next module-level import closes it. `from a.b import c` imports the module a.b.c when there
# is one, else a.b; importing a package means importing its __init__ (the module `a.b`).


def _module_names() -> dict[str, Path]:
    """Every module of the packages, the suite and the benchmarks, by its dotted name (the test
    suite imports as ``tests.<...>``: the repository root is on pytest's pythonpath)."""
    names: dict[str, Path] = {}
    unshipped = sorted(p for top in UNSHIPPED for p in (ROOT / top).rglob("*.py"))
    # a compiled module (setup.py) is known by its type stub: importing it is an edge to it,
    # not to its package
    compiled = sorted(
        p
        for pkg in ALLOWED
        for p in (ROOT / pkg).rglob("*.pyi")
        if not p.with_suffix(".py").exists()
    )
    for path in [*_modules(), *unshipped, *compiled]:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


@functools.cache  # one walk of the whole tree serves every package's check
def _import_graph() -> dict[str, set[str]]:
    return _graph_of(
        {name: path.read_text(encoding="utf-8") for name, path in _module_names().items()}
    )


def _graph_of(sources: dict[str, str]) -> dict[str, set[str]]:
    """module name -> the first-party modules it imports, from the modules' source texts."""

    def known(name: str) -> str | None:
        # `import a.b.X` where X is not a module: the module it names is the longest prefix
        while name and name not in sources:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, source in sources.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(source, filename=module)):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [
                    f"{node.module}.{alias.name}"
                    if f"{node.module}.{alias.name}" in sources
                    else node.module
                    for alias in node.names
                ]
            else:
                continue
            deps.update(t for t in map(known, targets) if t is not None and t != module)
        graph[module] = deps
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _describe(circle: list[str], graph: dict[str, set[str]]) -> str:
    members = set(circle)
    arrows = "; ".join(f"{m} -> {', '.join(sorted(graph[m] & members))}" for m in circle)
    return f"circle {' <-> '.join(circle)} ({arrows})"


def test_the_circle_finder_finds_circles() -> None:
    # The check below must be able to fail: a made-up graph with two circles and a tail.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}}
    assert _circles(graph) == [["a", "b", "c"], ["e", "f"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_every_import_statement_counts() -> None:
    # Lazy imports, TYPE_CHECKING imports and a package's __init__ are edges like any other.
    sources = {
        "p": "from p.b import g\n",  # the package's __init__ imports a module of it
        "p.a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.b import T\n",
        "p.b": "def f():\n    import p.c.X\n",  # X is not a module: p.c is what is imported
        "p.c": "from p import a\n",  # `from pkg import module` imports the module p.a
        "p.d": "from p import name\n",  # `from pkg import name` imports the package p
        "q": "import os\nimport p.d\n",  # non-first-party imports are not in the graph
    }
    graph = _graph_of(sources)
    assert graph == {
        "p": {"p.b"},
        "p.a": {"p.b"},
        "p.b": {"p.c"},
        "p.c": {"p.a"},
        "p.d": {"p"},
        "q": {"p.d"},
    }
    assert _circles(graph) == [["p.a", "p.b", "p.c"]]


@pytest.mark.parametrize("package", [*ALLOWED, *UNSHIPPED])
def test_no_import_circles(package: str) -> None:
    graph = _import_graph()
    circles = [c for c in _circles(graph) if package in {m.split(".")[0] for m in c}]
    assert not circles, "\n".join(_describe(c, graph) for c in circles)


# --- the layers of broker/dledger (its __init__.py) ----------------------------------------
#
# raft/ is the sans-I/O Raft core: it may import itself, common.remoting.codes, attrs and the
# pure modules of the standard library listed here (no trio, os, socket, time or files), so the
# simulator can run it with no clock and no I/O. driver/ (the Trio node) may import raft/ but not
# broker/ (the broker on DLedger), which sits on top of both.

DLEDGER = ROOT / "broker" / "dledger"
RAFT_FIRST_PARTY = ("broker.dledger.raft", "common.remoting.codes")
RAFT_OTHERS = {
    "__future__",
    "abc",
    "attrs",
    "bisect",
    "collections",
    "dataclasses",
    "enum",
    "functools",
    "heapq",
    "itertools",
    "logging",
    "math",
    "random",
    "typing",
}


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


@pytest.mark.parametrize(
    "path", sorted((DLEDGER / "raft").glob("*.py")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_dledger_raft_core_does_no_io(path: Path) -> None:
    bad = []
    for lineno, module, _level in _imports(path):
        name = module or ""
        top = name.split(".")[0]
        allowed = _within(name, RAFT_FIRST_PARTY) if top in FIRST_PARTY else top in RAFT_OTHERS
        if not allowed:
            bad.append(f"line {lineno}: the sans-I/O Raft core must not import {name}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "path", sorted((DLEDGER / "driver").glob("*.py")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_dledger_driver_does_not_import_the_broker_layer(path: Path) -> None:
    bad = [
        f"line {lineno}: the driver must not import {module}"
        for lineno, module, _level in _imports(path)
        if module == "broker.dledger" or _within(module or "", ("broker.dledger.broker",))
    ]
    assert not bad, "\n".join(bad)
